"""The Kafka APIs the listener serves, and at which versions: one table.

ApiVersions answers from it, the connection refuses what it does not list,
and docs/kafka-protocol.md prints it (a test keeps the two equal). The
ranges are what the clients we serve negotiate (librdkafka, kafka-python,
aiokafka, KafkaJS: each uses min(its newest, ours)), capped where a newer
version needs something we do not have:

* Produce ≤ 9 and Fetch ≤ 12: Produce 10+ and Fetch 13+ speak KIP-951's
  leader hints and topic ids, which no client needs from us;
* InitProducerId ≤ 4, AddPartitionsToTxn ≤ 3, AddOffsetsToTxn and EndTxn
  ≤ 3: the next versions are transaction version 2 on the wire (KIP-890),
  which none of these clients speaks (their transactions run version 1:
  docs/kafka-protocol.md);
* OffsetCommit ≤ 8, OffsetFetch ≤ 8: the next versions are KIP-848's and
  topic ids';
* Metadata from 1 and every API from its first version kio's schemas
  (Kafka 4's) still hold; SaslHandshake 1 only (version 0 sends SASL
  frames outside Kafka's framing, which no client we serve uses).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66

    @property
    def title(self) -> str:
        """Kafka's name of the API (ListOffsets, InitProducerId, ...)."""
        return _TITLES.get(self, self.name.title().replace("_", ""))


_TITLES = {ApiKey.OFFSET_FOR_LEADER_EPOCH: "OffsetForLeaderEpoch",
           ApiKey.SASL_HANDSHAKE: "SaslHandshake", ApiKey.SASL_AUTHENTICATE: "SaslAuthenticate",
           ApiKey.INIT_PRODUCER_ID: "InitProducerId",
           ApiKey.ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn",
           ApiKey.ADD_OFFSETS_TO_TXN: "AddOffsetsToTxn", ApiKey.END_TXN: "EndTxn",
           ApiKey.TXN_OFFSET_COMMIT: "TxnOffsetCommit"}


# Who answers a request (docs/kafka-protocol.md prints this).
STORE = "the store (its own log or catalog)"
LEADER = "the store that leads the partition"
TXN = "forwarded to the transaction coordinator"
GROUP = "forwarded to the group coordinator"
LISTENER = "the listener"


@dataclass(frozen=True, slots=True)
class VersionRange:
    min_version: int
    max_version: int
    answered_by: str = STORE

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.min_version <= version <= self.max_version


# The versions served, by API, and who answers.
VERSIONS: Mapping[ApiKey, VersionRange] = {
    ApiKey.PRODUCE: VersionRange(3, 9, LEADER),
    ApiKey.FETCH: VersionRange(4, 12, LEADER),
    ApiKey.LIST_OFFSETS: VersionRange(1, 7, LEADER),
    ApiKey.METADATA: VersionRange(1, 12, STORE),
    ApiKey.OFFSET_COMMIT: VersionRange(2, 8, GROUP),
    ApiKey.OFFSET_FETCH: VersionRange(1, 8, GROUP),
    ApiKey.FIND_COORDINATOR: VersionRange(0, 4, STORE),
    ApiKey.JOIN_GROUP: VersionRange(0, 7, GROUP),
    ApiKey.HEARTBEAT: VersionRange(0, 4, GROUP),
    ApiKey.LEAVE_GROUP: VersionRange(0, 5, GROUP),
    ApiKey.SYNC_GROUP: VersionRange(0, 5, GROUP),
    ApiKey.DESCRIBE_GROUPS: VersionRange(0, 5, GROUP),
    ApiKey.LIST_GROUPS: VersionRange(0, 4, GROUP),
    ApiKey.SASL_HANDSHAKE: VersionRange(1, 1, LISTENER),
    ApiKey.API_VERSIONS: VersionRange(0, 3, LISTENER),
    ApiKey.CREATE_TOPICS: VersionRange(2, 7, STORE),
    ApiKey.DELETE_TOPICS: VersionRange(1, 6, STORE),
    ApiKey.INIT_PRODUCER_ID: VersionRange(0, 4, TXN),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: VersionRange(2, 4, LEADER),
    ApiKey.ADD_PARTITIONS_TO_TXN: VersionRange(0, 3, TXN),
    ApiKey.ADD_OFFSETS_TO_TXN: VersionRange(0, 3, TXN),
    ApiKey.END_TXN: VersionRange(0, 3, TXN),
    ApiKey.TXN_OFFSET_COMMIT: VersionRange(0, 3, GROUP),
    ApiKey.DESCRIBE_CONFIGS: VersionRange(1, 4, STORE),
    ApiKey.SASL_AUTHENTICATE: VersionRange(0, 2, LISTENER),
    ApiKey.CREATE_PARTITIONS: VersionRange(0, 3, STORE),
    ApiKey.DESCRIBE_CLUSTER: VersionRange(0, 1, STORE),
    ApiKey.DESCRIBE_PRODUCERS: VersionRange(0, 0, LEADER),
    ApiKey.DESCRIBE_TRANSACTIONS: VersionRange(0, 0, TXN),
    ApiKey.LIST_TRANSACTIONS: VersionRange(0, 1, TXN),
}


def render_table() -> list[tuple[str, str, str]]:
    """(API and key, versions, who answers) of every API, by key, as
    docs/kafka-protocol.md prints them."""
    return [(f"{api.title} ({int(api)})",
             f"{r.min_version}–{r.max_version}" if r.min_version != r.max_version
             else str(r.min_version), r.answered_by)
            for api, r in sorted(VERSIONS.items())]
