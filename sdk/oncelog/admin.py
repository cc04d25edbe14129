"""Admin: topics, transactions and consumer groups.

Every call is synchronous, retries retriable errors (an unreachable store, the
catalog owner restarting, a coordinator moving or loading) with backoff, and
raises the typed error of `oncelog.errors` otherwise. Each public call, with
every request it makes, returns or raises within `default_api_timeout_ms`
(Kafka's default.api.timeout.ms), connecting included; KafkaTimeoutError
names the addresses that did not answer.

Catalog changes go to the store that keeps the topic catalog (Metadata's
controller); transaction questions go to the transactional id's coordinator
(FindCoordinator), or to every coordinator Metadata lists; group questions go
to the group's coordinator, or to every group coordinator.

Hanging transactions: an open transaction on a partition that no coordinator
will ever end (a coordinator bug, a lost `__transaction_state`, a write that
bypassed verification) holds the partition's last stable offset, so
read_committed consumers stop there. `find_hanging_transactions` finds them
from the stores' producer state (DescribeProducers) checked against the
coordinators' open transactions; `abort_hanging_transaction` writes the ABORT
marker straight to the partition, as Kafka's admin abort does.
"""

from __future__ import annotations

from oncelog._admin_acls import AclsAdmin
from oncelog._admin_base import (
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    OPEN_TRANSACTION_STATES,
    RESET_TARGETS,
)
from oncelog._admin_groups import GroupsAdmin
from oncelog._admin_topics import TopicsAdmin
from oncelog._admin_transactions import TransactionsAdmin
from oncelog._keywords import kafka_names

__all__ = ["DEFAULT_MAX_TRANSACTION_TIMEOUT_MS", "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP",
           "OPEN_TRANSACTION_STATES", "RESET_TARGETS", "Admin"]


@kafka_names
class Admin(TopicsAdmin, TransactionsAdmin, GroupsAdmin, AclsAdmin):
    """Creates, grows, deletes, lists and describes topics; lists, describes and
    aborts transactions; finds and aborts hanging transactions; lists,
    describes and deletes consumer groups, and shows and resets their
    offsets; creates, describes and deletes ACLs."""

    # One class per job (topics, transactions, groups, ACLs) over AdminBase,
    # the connection and the plumbing every call shares (_admin_*.py).
