"""One handler per Kafka API: a new API is a new entry here and a module
(or a function in the module of its family), never a branch elsewhere.

Each handler takes the request context and kio's request body and returns
kio's response body of the same version (context.builder()), or None when
the request takes no answer. A handler answers every expected failure with
the response's error codes; only a broken invariant escapes it (the
connection is then closed and the failure logged).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..apis import ApiKey
from ..context import Handler
from . import api_versions, fetch, find_coordinator, metadata, offsets, produce, transactions

HANDLERS: Mapping[ApiKey, Handler] = {
    ApiKey.API_VERSIONS: api_versions.handle,
    ApiKey.METADATA: metadata.handle,
    ApiKey.PRODUCE: produce.handle,
    ApiKey.FETCH: fetch.handle,
    ApiKey.LIST_OFFSETS: offsets.list_offsets,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: offsets.offset_for_leader_epoch,
    ApiKey.FIND_COORDINATOR: find_coordinator.handle,
    ApiKey.INIT_PRODUCER_ID: transactions.init_producer_id,
    ApiKey.ADD_PARTITIONS_TO_TXN: transactions.add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: transactions.add_offsets_to_txn,
    ApiKey.END_TXN: transactions.end_txn,
    ApiKey.DESCRIBE_PRODUCERS: transactions.describe_producers,
    ApiKey.DESCRIBE_TRANSACTIONS: transactions.describe_transactions,
    ApiKey.LIST_TRANSACTIONS: transactions.list_transactions,
}
