"""The vocabulary's enums beside their proto enums, and how a pair is read.

An enum-valued field of `oncelog.v1` travels twice: as the string it always
was (the vocabulary's value, `"transactional_id"`, `"PrepareCommit"`) and,
beside it, as a proto enum in the field named the same with `_enum`
(`resource_type_enum`, `states_enum`). Writers set both. A reader takes the
enum when it is not `*_UNSPECIFIED`, else the string, so a client that sets
only the string (as every client did before) and one that sets only the enum
(a generated client in another language) are understood the same; a request
whose two are both set and name different values is refused, naming both.

The mapping is derived, never kept by hand: member `X` of a vocabulary enum
is the proto value named `<PREFIX>_X`, where the prefix is the proto enum's
name in upper snake case (`AclResourceType.TRANSACTIONAL_ID` is
`ACL_RESOURCE_TYPE_TRANSACTIONAL_ID`), looked up in the generated
EnumDescriptor. tests/unit/test_proto_enums.py checks that every member has
a proto value and every proto value but UNSPECIFIED and the filters' ANY and
MATCH has a member, so the two cannot drift apart.

The services and the SDK both read and write the pairs through this module
(it imports only `oncelog.v1` and the vocabulary, so services may).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from oncelog.v1 import coordinator_pb2, group_coordinator_pb2, partition_store_pb2
from oncelog.wire.vocabulary import (
    AclOperation,
    AclPatternFilterType,
    AclPatternType,
    AclPermission,
    AclResourceType,
    GroupState,
    TransactionState,
    Vocabulary,
)

if TYPE_CHECKING:
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

W = TypeVar("W", bound=Vocabulary)
V = TypeVar("V", bound=int)

UNSPECIFIED = 0


class EnumPairError(ValueError):
    """A request's (string, enum) pair that cannot be read: the two name
    different values, the enum's number is one this side does not know, or
    a repeated pair's lengths differ. The message names the fields and both
    values; the services answer it with INVALID_REQUEST."""


def _upper_snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).upper()


@dataclass(frozen=True, slots=True)
class ProtoEnum(Generic[W, V]):
    """One vocabulary enum beside its proto enum: member <-> number.

    `extra_words` are the proto values without a member (a filter's ANY and
    MATCH where the vocabulary enum has none), by their lower-case word
    ("any"), which is also how the string field spells them."""

    vocabulary: type[W]
    proto_name: str
    prefix: str
    numbers: Mapping[W, V]
    members: Mapping[int, W]
    extra_words: Mapping[int, str]
    names: Mapping[int, str]
    # Every number of the proto enum, as its generated (NewType) value.
    values: Mapping[int, V]

    @classmethod
    def derive(cls, vocabulary: type[W], proto: _EnumTypeWrapper[V]) -> ProtoEnum[W, V]:
        """The pairing by name (prefix + member name) through the generated
        descriptor. A member without a proto value gets no number (its
        string alone travels); the drift test catches it."""
        descriptor = proto.DESCRIPTOR
        prefix = _upper_snake(descriptor.name) + "_"
        numbers = {member: proto.Value(prefix + member.name) for member in vocabulary
                   if prefix + member.name in descriptor.values_by_name}
        members = {int(number): member for member, number in numbers.items()}
        extra_words = {
            value.number: value.name.removeprefix(prefix).lower()
            for value in descriptor.values
            if value.number != UNSPECIFIED and value.number not in members
        }
        names = {value.number: value.name for value in descriptor.values}
        return cls(vocabulary=vocabulary, proto_name=descriptor.name, prefix=prefix,
                   numbers=numbers, members=members, extra_words=extra_words, names=names,
                   values={number: proto.Value(name) for number, name in names.items()})

    # ------------------------------------------------------------- writing

    def number(self, value: str | None) -> V:
        """The enum number for a value written in the string field: its
        member's, or an extra word's ("any"); UNSPECIFIED for None, "" or a
        value the proto enum has no number for (the string alone carries it)."""
        if not value:
            return self._unspecified
        member = self._parsed(value)
        if member is not None and member in self.numbers:
            return self.numbers[member]
        word = value.strip().lower()
        for number, extra in self.extra_words.items():
            if extra == word:
                return self.values[number]
        return self._unspecified

    def numbers_of(self, values: Iterable[str]) -> list[V]:
        """`number` of each value, in order: the repeated enum field beside a
        repeated string field, element for element."""
        return [self.number(v) for v in values]

    def texts_of(self, values: Iterable[str]) -> list[str]:
        """Each value as the string field spells it: a member's value when
        the vocabulary reads it ("ongoing" is "Ongoing", which a server that
        reads only the string matches exactly), else the value as given."""
        return [member.value if (member := self._parsed(v)) is not None else v for v in values]

    # ------------------------------------------------------------- reading

    def member(self, number: int) -> W | None:
        """The member a number names; None for UNSPECIFIED, an extra word or
        a number this side does not know."""
        return self.members.get(number)

    def name(self, number: int) -> str:
        """The proto name of a number, as messages print it; the bare number
        when this side does not know it."""
        return self.names.get(number, str(number))

    def word(self, number: int) -> str | None:
        """What a number means as the string field would spell it (the
        member's value or the extra word); None for UNSPECIFIED or a number
        this side does not know."""
        member = self.members.get(number)
        if member is not None:
            return member.value
        return self.extra_words.get(number)

    def response_text(self, number: int, text: str) -> str:
        """A response's pair, as a string: the enum's meaning when this side
        knows the number, else the string (a newer server's number that this
        client does not know falls back to its string; a described state
        then reads as UNKNOWN through `DescribedState.reported` when the
        string is unknown too)."""
        word = self.word(number)
        return text if word is None else word

    def request_text(self, field: str, number: int, text: str) -> str:
        """A request's pair, as the one string the server goes on to parse
        (with its own defaults for ""): the enum's meaning when the enum is
        set, else the string. EnumPairError when the number is unknown here,
        or when both are set and name different values."""
        if number == UNSPECIFIED:
            return text
        word = self.word(number)
        if word is None:
            raise EnumPairError(
                f"{field}_enum: {number} is not a value of {self.proto_name} that this side "
                f"knows; "
                f"expected one of {', '.join(self.names[n] for n in sorted(self.names) if n)}")
        if text and self._key(text) != self._key(word):
            raise EnumPairError(self._conflict(field, text, number))
        return word

    def request_filter(self, field: str, numbers: Sequence[int],
                       texts: Sequence[str]) -> frozenset[W] | None:
        """A request's repeated pair used as a filter (`states`,
        `states_enum`): None when both are empty (no filter), else the
        members named. When both are set they are read element by element
        (`request_text`'s rule, so they must have the same length). A value
        this side does not know names nothing, so it matches nothing (as
        Kafka's coordinators treat an unknown state name); an unknown number
        and a string this side knows always disagree."""
        if not numbers:
            return None if not texts else frozenset(
                m for t in texts if (m := self._parsed(t)) is not None)
        if texts and len(texts) != len(numbers):
            raise EnumPairError(
                f"{field} has {len(texts)} values and {field}_enum {len(numbers)}; set both "
                f"element by element, or only one of them")
        chosen: set[W] = set()
        for i, number in enumerate(numbers):
            text = texts[i] if texts else ""
            by_number = self.member(number)
            by_text = self._parsed(text) if text else None
            if number != UNSPECIFIED and text and (by_number is not None or by_text is not None) \
                    and by_number != by_text:
                raise EnumPairError(self._conflict(f"{field}[{i}]", text, number,
                                                   enum_field=f"{field}_enum[{i}]"))
            member = by_number if number != UNSPECIFIED else by_text
            if member is not None:
                chosen.add(member)
        return frozenset(chosen)

    # ------------------------------------------------------------- helpers

    @property
    def _unspecified(self) -> V:
        return self.values[UNSPECIFIED]

    def _parsed(self, text: str) -> W | None:
        try:
            return self.vocabulary.parse(text)
        except ValueError:
            return None

    def _key(self, text: str) -> str:
        # Both sides compared as the vocabulary reads them (any of Kafka's
        # spellings); an extra word ("any") or an unknown name as itself.
        member = self._parsed(text)
        return member.value if member is not None else text.strip().lower()

    def _conflict(self, field: str, text: str, number: int, *,
                  enum_field: str | None = None) -> str:
        return (f"{field} {text!r} and {enum_field or field + '_enum'} {self.name(number)} "
                f"name different {self.vocabulary.what()}s; set both to the same value, "
                f"or only one of them")


ACL_RESOURCE_TYPES = ProtoEnum.derive(AclResourceType, partition_store_pb2.AclResourceType)
ACL_OPERATIONS = ProtoEnum.derive(AclOperation, partition_store_pb2.AclOperation)
ACL_PATTERN_TYPES = ProtoEnum.derive(AclPatternType, partition_store_pb2.AclPatternType)
# A filter's pattern type: the same proto enum, whose ANY and MATCH are members here.
ACL_PATTERN_FILTER_TYPES = ProtoEnum.derive(AclPatternFilterType,
                                            partition_store_pb2.AclPatternType)
ACL_PERMISSIONS = ProtoEnum.derive(AclPermission, partition_store_pb2.AclPermission)
TRANSACTION_STATES = ProtoEnum.derive(TransactionState, coordinator_pb2.TransactionState)
GROUP_STATES = ProtoEnum.derive(GroupState, group_coordinator_pb2.GroupState)
