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
from . import (
    admin,
    api_versions,
    fetch,
    find_coordinator,
    group_offsets,
    groups,
    metadata,
    offsets,
    produce,
    sasl,
    transactions,
)

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
    ApiKey.OFFSET_COMMIT: group_offsets.offset_commit,
    ApiKey.OFFSET_FETCH: group_offsets.offset_fetch,
    ApiKey.TXN_OFFSET_COMMIT: group_offsets.txn_offset_commit,
    ApiKey.CREATE_TOPICS: admin.create_topics,
    ApiKey.DELETE_TOPICS: admin.delete_topics,
    ApiKey.CREATE_PARTITIONS: admin.create_partitions,
    ApiKey.DESCRIBE_CONFIGS: admin.describe_configs,
    ApiKey.DESCRIBE_CLUSTER: admin.describe_cluster,
    ApiKey.DESCRIBE_GROUPS: admin.describe_groups,
    ApiKey.LIST_GROUPS: admin.list_groups,
    ApiKey.JOIN_GROUP: groups.join_group,
    ApiKey.SYNC_GROUP: groups.sync_group,
    ApiKey.HEARTBEAT: groups.heartbeat,
    ApiKey.LEAVE_GROUP: groups.leave_group,
    ApiKey.SASL_HANDSHAKE: sasl.handshake,
    ApiKey.SASL_AUTHENTICATE: sasl.authenticate,
}
