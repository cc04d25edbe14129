"""What every RPC needs: the per-RPC operation table.

`TABLE` maps each RPC's full method name (`/oncelog.v1.PartitionStore/Produce`)
to an `RpcRule`, written declaratively so that the same data drives the
checks, the documentation (docs/security.md renders `render_table()`, and a
test keeps the two equal) and the tests that walk every method of every
service:

* `Need` — one operation the caller must be allowed before the call runs, on
  the cluster or on each resource named by a field of the request (a field
  path such as `batches[].topic`), under conditions on the request's flags
  (`coordinator_write`, `verify_only`, ...). `RpcRule.checks(request)` turns
  the needs into concrete `Check`s. A need may name alternatives: the check
  passes when the named operation or one alternative is allowed. An
  alternative on the cluster means that operation on the cluster; on another
  type it means the operation on *some* resource of that type (Kafka's
  authorizeByResourceType). A denied check refuses the whole call with
  PERMISSION_DENIED and the code of its resource type
  (`DENIAL_CODES`), and the call changes nothing. (Kafka answers some
  multi-resource requests per resource instead; refusing the whole call keeps
  "a refused call changed nothing" true everywhere.)
* `AnswerFilter` — a listing call is not refused: the entries of its answer
  the caller may not see are left out (Kafka's Metadata, ListGroups,
  ListTransactions). An entry the request named explicitly is answered with
  the authorization error instead of vanishing, and a filter with `clear`
  keeps the entry but empties one field (a topic's config needs
  DescribeConfigs). `apply_filter` does this to a response message.

Which operation each RPC needs follows Kafka's KafkaApis handler for the
same request. The services' own calls to each other (a store's verification
of a producer's transaction, replication, markers, the coordinators' writes
and reads of internal topics, a store forwarding topic changes to the
controller) need ClusterAction on the cluster; a call a service makes on a
client's behalf (AddPartitionsToTxn by a store, CreateTopics forwarded to the
controller) accepts ClusterAction in place of the client's operation, since
the service authorized the client when the client called it. ClusterAction
already lets its holder read every log (ReplicaFetch), so accepting it for
reads and listings grants nothing more. So no client can forge markers or
touch internal topics, whatever flags it sets: `coordinator_write`,
`verify_only`, WriteTxnMarkers, ReplicaFetch and ResolveTransaction (a store asking
about a transaction it holds open, which may make the coordinator abort it)
need ClusterAction.

A method planned for the protos but not in them yet may be given its entry
ahead, keyed by the name it will have, and listed in `PLANNED_METHODS`
(none today).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from oncelog.wire.errors import ErrorCode

from .authorizer import CLUSTER_NAME, Authorizer, Decision, Operation, ResourceType

PARTITION_STORE = "oncelog.v1.PartitionStore"
TRANSACTION_COORDINATOR = "oncelog.v1.TransactionCoordinator"
GROUP_COORDINATOR = "oncelog.v1.GroupCoordinator"

# The error code a denied check answers with, by its resource type (Kafka's).
DENIAL_CODES: Mapping[ResourceType, ErrorCode] = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
}

# How resource types read in messages and the documentation.
_TYPE_WORDS: Mapping[ResourceType, str] = {
    ResourceType.TOPIC: "topic",
    ResourceType.GROUP: "group",
    ResourceType.TRANSACTIONAL_ID: "transactional id",
    ResourceType.CLUSTER: "cluster",
}
# Resource names in messages are cut here: client-chosen names can be long,
# and the message travels in a gRPC status trailer.
_NAME_SHOWN_CHARS = 64


def _shown(name: str) -> str:
    return repr(name if len(name) <= _NAME_SHOWN_CHARS else name[:_NAME_SHOWN_CHARS] + "...")


@dataclass(frozen=True, slots=True)
class Alternative:
    """Another operation that satisfies a need: on the cluster, or (other
    types) on some resource of the type."""

    operation: Operation
    resource_type: ResourceType

    def describe(self) -> str:
        if self.resource_type is ResourceType.CLUSTER:
            return f"{self.operation.kafka_name} on the cluster"
        return f"{self.operation.kafka_name} on any {_TYPE_WORDS[self.resource_type]}"


CLUSTER_ACTION = Alternative(Operation.CLUSTER_ACTION, ResourceType.CLUSTER)


@dataclass(frozen=True, slots=True)
class Check:
    """One authorization question about a concrete resource."""

    operation: Operation
    resource_type: ResourceType
    resource_name: str
    alternatives: tuple[Alternative, ...] = ()

    @property
    def code(self) -> ErrorCode:
        return DENIAL_CODES[self.resource_type]

    def describe(self) -> str:
        if self.resource_type is ResourceType.CLUSTER:
            what = "the cluster"
        else:
            what = f"{_TYPE_WORDS[self.resource_type]} {_shown(self.resource_name)}"
        return f"{self.operation.kafka_name} on {what}"


def _condition_holds(request: Message, condition: str) -> bool:
    """`field` (set / non-empty), `!field` (unset / empty) or `field=NAME`
    (an enum field's value, by name)."""
    if condition.startswith("!"):
        return not _condition_holds(request, condition[1:])
    name, equals, wanted = condition.partition("=")
    value = getattr(request, name)
    if not equals:
        # A scalar is set when not its default; a repeated field when not empty.
        return bool(len(value) if isinstance(value, Sized) else value)
    enum_type = request.DESCRIPTOR.fields_by_name[name].enum_type
    if enum_type is None:
        raise ValueError(f"condition {condition!r}: {name} is not an enum field")
    return bool(value == enum_type.values_by_name[wanted].number)


def field_values(message: Message, path: str) -> list[Any]:
    """The values a field path names: `a` (one value), `a[]` (each item of a
    repeated field), `a[].b` (field b of each item), and so on."""
    values: list[Any] = [message]
    for part in path.split("."):
        repeated = part.endswith("[]")
        name = part[:-2] if repeated else part
        next_values: list[Any] = []
        for value in values:
            got = getattr(value, name)
            if repeated:
                next_values.extend(got)
            else:
                next_values.append(got)
        values = next_values
    return values


@dataclass(frozen=True, slots=True)
class Need:
    """An operation the caller must be allowed: on the cluster (`names` is
    "") or on each resource a request field names, when every condition in
    `when` holds for the request."""

    operation: Operation
    resource_type: ResourceType
    names: str = ""
    when: tuple[str, ...] = ()
    alternatives: tuple[Alternative, ...] = ()

    def __post_init__(self) -> None:
        if (self.resource_type is ResourceType.CLUSTER) != (self.names == ""):
            raise ValueError(f"a need on the cluster names no field, any other names one: "
                             f"{self.operation.kafka_name} on {self.resource_type.value} "
                             f"{self.names!r}")

    def applies(self, request: Message) -> bool:
        return all(_condition_holds(request, c) for c in self.when)

    def checks(self, request: Message) -> list[Check]:
        if not self.applies(request):
            return []
        names = [CLUSTER_NAME] if not self.names else [str(v) for v in
                                                       field_values(request, self.names)]
        return [Check(self.operation, self.resource_type, n, self.alternatives) for n in names]

    def describe(self) -> str:
        if self.resource_type is ResourceType.CLUSTER:
            text = f"{self.operation.kafka_name} on the cluster"
        elif self.names.endswith("[]") or "[]." in self.names:
            text = (f"{self.operation.kafka_name} on each {_TYPE_WORDS[self.resource_type]} "
                    f"`{self.names}`")
        else:
            text = (f"{self.operation.kafka_name} on the {_TYPE_WORDS[self.resource_type]} "
                    f"`{self.names}`")
        if self.alternatives:
            text += " (or " + " or ".join(a.describe() for a in self.alternatives) + ")"
        if self.when:
            text += ", if " + " and ".join(_describe_condition(c) for c in self.when)
        return text


def _describe_condition(condition: str) -> str:
    """As docs/security.md prints a condition: `if x` holds when field x is
    set (true, non-zero, non-empty), `if not x` when it is not."""
    if condition.startswith("!"):
        return f"not `{condition[1:]}`"
    name, equals, wanted = condition.partition("=")
    if equals:
        return f"`{name}` = {wanted}"
    return f"`{name}`"


@dataclass(frozen=True, slots=True)
class AnswerFilter:
    """Entries of the answer the caller may not `operation` are left out.

    `entries` is the path of the answer's repeated field (`topics`,
    `transactions[].partitions`); `name_field` the field of an entry that
    names its resource. `named_by`: the request field path naming entries
    explicitly; such an entry, when denied, stays with only its name and the
    authorization error in its `error` field. `clear`: a denied entry stays
    and only this field is emptied."""

    operation: Operation
    resource_type: ResourceType
    entries: str
    name_field: str
    named_by: str = ""
    clear: str = ""
    alternatives: tuple[Alternative, ...] = ()

    def check(self, name: str) -> Check:
        return Check(self.operation, self.resource_type, name, self.alternatives)

    def describe(self) -> str:
        word = _TYPE_WORDS[self.resource_type]
        alternatives = ""
        if self.alternatives:
            alternatives = " (or " + " or ".join(a.describe() for a in self.alternatives) + ")"
        if self.clear:
            return (f"answer: `{self.clear}` of `{self.entries}` emptied without "
                    f"{self.operation.kafka_name} on the {word}{alternatives}")
        text = (f"answer: `{self.entries}` filtered to {self.operation.kafka_name} on each "
                f"{word}{alternatives}")
        if self.named_by:
            text += f", one named in `{self.named_by}` answered with the error instead"
        return text


@dataclass(frozen=True, slots=True)
class RpcRule:
    """What one RPC needs."""

    needs: tuple[Need, ...] = ()
    filters: tuple[AnswerFilter, ...] = ()
    # A request stream (the *Stream methods): every message is a request of its
    # own, checked by itself with `needs` (guard.py); the stream needs
    # nothing more than an authenticated caller.
    per_message: bool = False

    def checks(self, request: Message) -> list[Check]:
        """The request's checks in the order they are asked (the first denied
        one is reported), each once."""
        seen: set[Check] = set()
        out: list[Check] = []
        for need in self.needs:
            for check in need.checks(request):
                if check not in seen:
                    seen.add(check)
                    out.append(check)
        return out

    def describe(self) -> str:
        parts = [n.describe() for n in self.needs] + [f.describe() for f in self.filters]
        needs = "; ".join(parts) if parts else "nothing"
        return f"each request of the stream by itself: {needs}" if self.per_message else needs


_T = ResourceType
_O = Operation
_CA = (CLUSTER_ACTION,)


def _ps(method: str) -> str:
    return f"/{PARTITION_STORE}/{method}"


def _tc(method: str) -> str:
    return f"/{TRANSACTION_COORDINATOR}/{method}"


def _gc(method: str) -> str:
    return f"/{GROUP_COORDINATOR}/{method}"


# Seeing topics: Describe on each (Kafka's Metadata), their config
# DescribeConfigs (Kafka's DescribeConfigs; Metadata shows none).
_TOPIC_LISTING = (
    AnswerFilter(_O.DESCRIBE, _T.TOPIC, "topics", "name", alternatives=_CA),
    AnswerFilter(_O.DESCRIBE_CONFIGS, _T.TOPIC, "topics", "name", clear="config",
                 alternatives=_CA),
)

# Kafka: Write on the transactional id (the request carries it, as Kafka's
# Produce does; the store checks with the coordinator that the batches'
# producer id belongs to it), then Write on each topic; an idempotent
# producer's batches need only the topic (KIP-679). The coordinators' writes
# to internal topics need ClusterAction.
_PRODUCE = RpcRule(needs=(
    Need(_O.CLUSTER_ACTION, _T.CLUSTER, when=("coordinator_write",)),
    Need(_O.WRITE, _T.TRANSACTIONAL_ID, "transactional_id",
         when=("!coordinator_write", "transactional_id")),
    Need(_O.WRITE, _T.TOPIC, "batches[].topic", when=("!coordinator_write",)),
))

# verify_only comes from a store (Kafka's AddPartitionsToTxn v4+,
# ClusterAction); adding comes from a client (Write on the id and each
# topic) or from a store on its behalf (ClusterAction).
_ADD_PARTITIONS_TO_TXN = RpcRule(needs=(
    Need(_O.CLUSTER_ACTION, _T.CLUSTER, when=("verify_only",)),
    Need(_O.WRITE, _T.TRANSACTIONAL_ID, "transactional_id", when=("!verify_only",),
         alternatives=_CA),
    Need(_O.WRITE, _T.TOPIC, "partitions[].topic", when=("!verify_only",),
         alternatives=_CA),
))

_REPLICA_FETCH = RpcRule(needs=(Need(_O.CLUSTER_ACTION, _T.CLUSTER),))
_MARKERS = RpcRule(needs=(Need(_O.CLUSTER_ACTION, _T.CLUSTER),))

_END_TXN = RpcRule(needs=(Need(_O.WRITE, _T.TRANSACTIONAL_ID, "transactional_id"),))

TABLE: Mapping[str, RpcRule] = {
    # ------------------------------------------------------ partition store
    _ps("Metadata"): RpcRule(filters=(
        AnswerFilter(_O.DESCRIBE, _T.TOPIC, "topics", "name", named_by="topics[]",
                     alternatives=_CA),
        _TOPIC_LISTING[1],
    )),
    # Kafka: Create on the cluster, else on each topic. ClusterAction: a
    # store forwarding its client's request to the controller.
    _ps("CreateTopics"): RpcRule(needs=(
        Need(_O.CREATE, _T.TOPIC, "topics[].name",
             alternatives=(Alternative(_O.CREATE, _T.CLUSTER), CLUSTER_ACTION)),
    )),
    # Without names it is the controller telling a store that the catalog
    # changed (controller_link.CATALOG_CHANGED_METADATA).
    _ps("DeleteTopics"): RpcRule(needs=(
        Need(_O.DELETE, _T.TOPIC, "names[]", alternatives=_CA),
        Need(_O.CLUSTER_ACTION, _T.CLUSTER, when=("!names",)),
    )),
    _ps("ListTopics"): RpcRule(filters=_TOPIC_LISTING),
    # Kafka: Alter on each topic. ClusterAction: a store forwarding its
    # client's request to the controller.
    _ps("CreatePartitions"): RpcRule(needs=(
        Need(_O.ALTER, _T.TOPIC, "topics[].name", alternatives=_CA),
    )),
    _ps("Produce"): _PRODUCE,
    # The same, for each request of the stream by itself.
    _ps("ProduceStream"): dataclasses.replace(_PRODUCE, per_message=True),
    _ps("Fetch"): RpcRule(needs=(
        Need(_O.READ, _T.TOPIC, "partitions[].topic", alternatives=_CA),
    )),
    _ps("ListOffsets"): RpcRule(needs=(
        Need(_O.DESCRIBE, _T.TOPIC, "partitions[].topic", alternatives=_CA),
    )),
    # Kafka also takes Alter on the cluster here (KIP-664's abort tool writes
    # markers itself); oncelog's abort goes through the coordinator
    # (AbortTransaction), so markers stay the services' alone.
    _ps("WriteTxnMarkers"): _MARKERS,
    # The same, for each request of the stream by itself (the coordinators').
    _ps("WriteTxnMarkersStream"): dataclasses.replace(_MARKERS, per_message=True),
    _ps("DescribeProducers"): RpcRule(needs=(
        Need(_O.READ, _T.TOPIC, "partitions[].topic"),
    )),
    _ps("ReplicaFetch"): _REPLICA_FETCH,
    # The same, for each request of the stream by itself (the followers').
    _ps("ReplicaFetchStream"): dataclasses.replace(_REPLICA_FETCH, per_message=True),
    # Kafka: ClusterAction (a follower), else Describe on each topic (KIP-320).
    _ps("OffsetsForLeaderEpoch"): RpcRule(needs=(
        Need(_O.DESCRIBE, _T.TOPIC, "partitions[].topic", alternatives=_CA),
    )),
    _ps("AlterPartitionReassignments"): RpcRule(needs=(Need(_O.ALTER, _T.CLUSTER),)),
    # Kafka: Alter on the cluster to change ACLs, Describe to read them.
    _ps("CreateAcls"): RpcRule(needs=(Need(_O.ALTER, _T.CLUSTER),)),
    _ps("DescribeAcls"): RpcRule(needs=(Need(_O.DESCRIBE, _T.CLUSTER),)),
    _ps("DeleteAcls"): RpcRule(needs=(Need(_O.ALTER, _T.CLUSTER),)),
    # ------------------------------------------------ transaction coordinator
    _tc("FindCoordinator"): RpcRule(needs=(
        Need(_O.DESCRIBE, _T.TRANSACTIONAL_ID, "key", when=("type=TRANSACTION",)),
        Need(_O.DESCRIBE, _T.GROUP, "key", when=("type=GROUP",)),
    )),
    # Kafka: Write on the transactional id (and TwoPhaseCommit with 2PC,
    # KIP-939); without one, IdempotentWrite on the cluster or Write on some
    # topic (KIP-679).
    _tc("InitProducerId"): RpcRule(needs=(
        Need(_O.WRITE, _T.TRANSACTIONAL_ID, "transactional_id", when=("transactional_id",)),
        Need(_O.TWO_PHASE_COMMIT, _T.TRANSACTIONAL_ID, "transactional_id",
             when=("transactional_id", "enable_two_phase_commit")),
        Need(_O.IDEMPOTENT_WRITE, _T.CLUSTER, when=("!transactional_id",),
             alternatives=(Alternative(_O.WRITE, _T.TOPIC),)),
    )),
    _tc("AddPartitionsToTxn"): _ADD_PARTITIONS_TO_TXN,
    # The same, for each request of the stream by itself (the stores').
    _tc("AddPartitionsToTxnStream"): dataclasses.replace(
        _ADD_PARTITIONS_TO_TXN, per_message=True),
    _tc("AddOffsetsToTxn"): RpcRule(needs=(
        Need(_O.WRITE, _T.TRANSACTIONAL_ID, "transactional_id"),
        Need(_O.READ, _T.GROUP, "group_id"),
    )),
    _tc("EndTxn"): _END_TXN,
    # The same, for each request of the stream by itself (the SDK's commits).
    _tc("EndTxnStream"): dataclasses.replace(_END_TXN, per_message=True),
    _tc("ListTransactions"): RpcRule(filters=(
        AnswerFilter(_O.DESCRIBE, _T.TRANSACTIONAL_ID, "transactions", "transactional_id"),
    )),
    _tc("DescribeTransactions"): RpcRule(
        needs=(Need(_O.DESCRIBE, _T.TRANSACTIONAL_ID, "transactional_ids[]"),),
        filters=(AnswerFilter(_O.DESCRIBE, _T.TOPIC, "transactions[].partitions", "topic"),),
    ),
    # The hanging-transaction tool: Kafka's abort (KIP-664) needs Alter on
    # the cluster.
    _tc("AbortTransaction"): RpcRule(needs=(Need(_O.ALTER, _T.CLUSTER),)),
    # A store's question about a transaction it holds open past its
    # timeout: the answer may abort the transaction, so only services ask.
    _tc("ResolveTransaction"): RpcRule(needs=(Need(_O.CLUSTER_ACTION, _T.CLUSTER),)),
    _tc("PrepareTransaction"): RpcRule(needs=(
        Need(_O.WRITE, _T.TRANSACTIONAL_ID, "transactional_id"),
        Need(_O.TWO_PHASE_COMMIT, _T.TRANSACTIONAL_ID, "transactional_id"),
    )),
    _tc("CompleteTransaction"): RpcRule(needs=(
        Need(_O.WRITE, _T.TRANSACTIONAL_ID, "transactional_id"),
        Need(_O.TWO_PHASE_COMMIT, _T.TRANSACTIONAL_ID, "transactional_id"),
    )),
    # ------------------------------------------------------ group coordinator
    # Kafka (KIP-848): Read on the group, Describe on each subscribed topic.
    _gc("ConsumerGroupHeartbeat"): RpcRule(needs=(
        Need(_O.READ, _T.GROUP, "group_id"),
        Need(_O.DESCRIBE, _T.TOPIC, "subscribed_topics[]"),
    )),
    _gc("OffsetCommit"): RpcRule(needs=(
        Need(_O.READ, _T.GROUP, "group_id"),
        Need(_O.READ, _T.TOPIC, "partitions[].topic"),
    )),
    _gc("OffsetFetch"): RpcRule(
        needs=(Need(_O.DESCRIBE, _T.GROUP, "group_id"),),
        filters=(AnswerFilter(_O.DESCRIBE, _T.TOPIC, "partitions", "topic",
                              named_by="partitions[].topic"),),
    ),
    # send_offsets_to_transaction: Write on the transactional id, Read on the
    # group and on each topic.
    _gc("TxnOffsetCommit"): RpcRule(needs=(
        Need(_O.WRITE, _T.TRANSACTIONAL_ID, "transactional_id"),
        Need(_O.READ, _T.GROUP, "group_id"),
        Need(_O.READ, _T.TOPIC, "partitions[].topic"),
    )),
    _gc("ListGroups"): RpcRule(filters=(
        AnswerFilter(_O.DESCRIBE, _T.GROUP, "groups", "group_id",
                     alternatives=(Alternative(_O.DESCRIBE, _T.CLUSTER),)),
    )),
    _gc("DescribeGroups"): RpcRule(needs=(Need(_O.DESCRIBE, _T.GROUP, "group_ids[]"),)),
    _gc("DeleteGroups"): RpcRule(needs=(Need(_O.DELETE, _T.GROUP, "group_ids[]"),)),
    # Kafka's classic group protocol: Read on the group (KafkaApis'
    # JoinGroup, SyncGroup, Heartbeat and LeaveGroup).
    _gc("JoinGroup"): RpcRule(needs=(Need(_O.READ, _T.GROUP, "group_id"),)),
    _gc("SyncGroup"): RpcRule(needs=(Need(_O.READ, _T.GROUP, "group_id"),)),
    _gc("ClassicHeartbeat"): RpcRule(needs=(Need(_O.READ, _T.GROUP, "group_id"),)),
    _gc("LeaveGroup"): RpcRule(needs=(Need(_O.READ, _T.GROUP, "group_id"),)),
}

# In TABLE, not yet in the protos (docs/security.md marks them "planned").
PLANNED_METHODS: frozenset[str] = frozenset()

# Served by every process and authorized for anyone who connected (probes,
# tools): gRPC health checking and server reflection.
OPEN_METHODS = frozenset({
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/List",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
})


def rule_for(method: str) -> RpcRule:
    """The rule of a method; KeyError for one the table does not know, which
    the caller refuses (an unknown method is never let through unchecked)."""
    return TABLE[method]


@dataclass(frozen=True, slots=True)
class Denial:
    """A refused check: what to answer and what to log."""

    check: Check
    decision: Decision
    principal: str

    @property
    def code(self) -> ErrorCode:
        return self.check.code

    @property
    def message(self) -> str:
        text = f"{self.principal} is not allowed {self.check.describe()}"
        if self.check.alternatives:
            text += " (nor " + " nor ".join(a.describe() for a in self.check.alternatives) + ")"
        return text


def _allowed(authorizer: Authorizer, principal: str, host: str, check: Check) -> Decision:
    decision = authorizer.authorize(principal, host, check.operation, check.resource_type,
                                    check.resource_name)
    if decision.allowed:
        return decision
    for alternative in check.alternatives:
        if alternative.resource_type is ResourceType.CLUSTER:
            other = authorizer.authorize(principal, host, alternative.operation,
                                         ResourceType.CLUSTER, CLUSTER_NAME)
        else:
            other = authorizer.authorize_by_resource_type(principal, host, alternative.operation,
                                                          alternative.resource_type)
        if other.allowed:
            return other
    return decision


def first_denial(authorizer: Authorizer, principal: str, host: str,
                 checks: Sequence[Check]) -> Denial | None:
    """The first check the principal fails, in order, or None when every one passes."""
    for check in checks:
        decision = _allowed(authorizer, principal, host, check)
        if not decision.allowed:
            return Denial(check, decision, principal)
    return None


def apply_filter(answer_filter: AnswerFilter, request: Message, response: Message,
                 allowed: Callable[[Check], bool], *, principal: str = "the caller") -> int:
    """Leaves out (or answers with the authorization error, or empties a
    field of) the response's entries whose check `allowed` refuses; returns
    how many entries it changed."""
    named: set[str] = set()
    if answer_filter.named_by:
        named = {str(v) for v in field_values(request, answer_filter.named_by)}
    parent_path, _, field_name = answer_filter.entries.rpartition(".")
    parents = field_values(response, parent_path) if parent_path else [response]
    changed = 0
    for parent in parents:
        entries = getattr(parent, field_name)
        for i in range(len(entries) - 1, -1, -1):
            entry = entries[i]
            name = str(getattr(entry, answer_filter.name_field))
            check = answer_filter.check(name)
            if allowed(check):
                continue
            changed += 1
            if answer_filter.clear:
                entry.ClearField(answer_filter.clear)
            elif name in named and "error" in entry.DESCRIPTOR.fields_by_name:
                entry.Clear()
                setattr(entry, answer_filter.name_field, name)
                entry.error.code = int(check.code)
                entry.error.retriable = check.code.retriable
                entry.error.message = f"{principal} is not allowed {check.describe()}"
            else:
                del entries[i]
    return changed


def render_table() -> list[tuple[str, str]]:
    """(method, what it needs) for every method of TABLE, in table order, as
    docs/security.md prints it."""
    rows: list[tuple[str, str]] = []
    for method, rule in TABLE.items():
        service, _, name = method.lstrip("/").partition("/")
        short = f"{service.rpartition('.')[2]}/{name}"
        if method in PLANNED_METHODS:
            short += " (planned)"
        rows.append((short, rule.describe()))
    return rows
