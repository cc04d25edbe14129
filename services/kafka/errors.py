"""Our error codes as a Kafka client of a given request version expects them.

Our codes are Kafka's numbers where Kafka has them (oncelog.wire.errors), so
most pass unchanged. What changes:

* codes of our own (LOG_END_OFFSET_MISMATCH, SHUTTING_DOWN) have no Kafka
  number: a store shutting down answers what Kafka's broker answers while it
  moves its partitions away (NOT_LEADER_OR_FOLLOWER for the data APIs, so the
  client refreshes its metadata and goes to the new leader;
  COORDINATOR_NOT_AVAILABLE for the coordinator APIs, so it looks the
  coordinator up again);
* PRODUCER_FENCED (90) arrived with KIP-588: older request versions get
  INVALID_PRODUCER_EPOCH, as Kafka's KafkaApis maps it (InitProducerId < 4,
  AddPartitionsToTxn / AddOffsetsToTxn / EndTxn < 2, TxnOffsetCommit < 3,
  and Produce always);
* TRANSACTION_ABORTABLE (120) exists only for clients of transaction
  version 2, which none of the versions we serve is: they get
  INVALID_TXN_STATE, which they treat as the end of the transaction.
"""

from __future__ import annotations

from oncelog.wire.errors import ErrorCode

from .apis import ApiKey

# The first version of each API that knows PRODUCER_FENCED.
_PRODUCER_FENCED_SINCE: dict[ApiKey, int] = {
    ApiKey.INIT_PRODUCER_ID: 4,
    ApiKey.ADD_PARTITIONS_TO_TXN: 2,
    ApiKey.ADD_OFFSETS_TO_TXN: 2,
    ApiKey.END_TXN: 2,
    ApiKey.TXN_OFFSET_COMMIT: 3,
}

_DATA_APIS = frozenset({ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS,
                        ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.DESCRIBE_PRODUCERS})


def kafka_code(code: ErrorCode | None, api: ApiKey, version: int) -> int:
    """The Kafka error number a client of `api` at `version` gets for `code`."""
    if code is None or code is ErrorCode.NONE:
        return 0
    if code is ErrorCode.SHUTTING_DOWN:
        return int(ErrorCode.NOT_LEADER_OR_FOLLOWER if api in _DATA_APIS
                   else ErrorCode.COORDINATOR_NOT_AVAILABLE)
    if code is ErrorCode.LOG_END_OFFSET_MISMATCH:
        return int(ErrorCode.UNKNOWN_SERVER_ERROR)
    if code is ErrorCode.PRODUCER_FENCED:
        since = _PRODUCER_FENCED_SINCE.get(api)
        if since is None or version < since:
            return int(ErrorCode.INVALID_PRODUCER_EPOCH)
    if code is ErrorCode.TRANSACTION_ABORTABLE:
        return int(ErrorCode.INVALID_TXN_STATE)
    return int(code)
