"""The group coordinator's settings and the flags that set them.

Apart from the runtime (runtime.py) so that a partition store, which takes
these flags for the group coordinator it may run in its process
(`--group-coordinator`), does not import the coordinator to parse them: a
store that runs none never imports it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..common.rpc.server_base import add_int_flags

if TYPE_CHECKING:
    from .core import classic as cl

# How often the lag metric's end offsets are refreshed, by default.
DEFAULT_LAG_REFRESH_INTERVAL_MS = 5000


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    min_session_timeout_ms: int = 1000
    max_session_timeout_ms: int = 300_000
    # The heartbeat interval handed to members: a third of their session
    # timeout, at most this.
    max_heartbeat_interval_ms: int = 3000
    # An empty group with no commit for this long is removed (Kafka: 7 days).
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    retention_check_interval_ms: int = 60_000
    session_check_interval_ms: int = 200
    # Partition counts of subscribed topics are re-read at most this often.
    metadata_max_age_ms: int = 2000
    max_offset_metadata_bytes: int = 4096
    tail_wait_ms: int = 1000
    # Classic groups: a new group's first join phase waits this long for more
    # members (Kafka's group.initial.rebalance.delay.ms and its default).
    initial_rebalance_delay_ms: int = 3000
    # A new member's parked JoinGroup is dropped after this (Kafka's).
    new_member_join_timeout_ms: int = 300_000

    @property
    def classic(self) -> cl.ClassicConfig:
        # Imported here, not at the top: the classic protocol's module is
        # most of this one's import time, which every store start pays.
        from .core.classic import ClassicConfig
        return ClassicConfig(
            initial_rebalance_delay_ms=self.initial_rebalance_delay_ms,
            new_member_join_timeout_ms=self.new_member_join_timeout_ms,
            min_session_timeout_ms=self.min_session_timeout_ms,
            max_session_timeout_ms=self.max_session_timeout_ms,
        )


def add_group_coordinator_arguments(parser: argparse.ArgumentParser, *,
                                    retention_check_interval: bool = True) -> None:
    """The group coordinator's own flags: also a partition store's, which
    can run a group coordinator in its process (--group-coordinator). A
    store has its own --retention-check-interval-ms (how often its
    retention runs): one flag then sets both, so
    `retention_check_interval=False` leaves it out."""
    defaults = GroupConfig()
    add_int_flags(parser, [
        ("min-session-timeout-ms", defaults.min_session_timeout_ms,
         "the shortest session timeout a member may ask for"),
        ("max-session-timeout-ms", defaults.max_session_timeout_ms,
         "the longest session timeout a member may ask for"),
        ("max-heartbeat-interval-ms", defaults.max_heartbeat_interval_ms,
         "members heartbeat every third of their session timeout, at most this often"),
        ("offsets-retention-ms", defaults.offsets_retention_ms,
         "an empty group with no commit for this long is removed with its offsets"),
        ("retention-check-interval-ms", defaults.retention_check_interval_ms,
         "how often expired groups and offsets of deleted topics are removed"),
        ("initial-rebalance-delay-ms", defaults.initial_rebalance_delay_ms,
         "a new classic group's first rebalance waits this long for more members (Kafka's "
         "group.initial.rebalance.delay.ms)"),
        ("lag-refresh-interval-ms", DEFAULT_LAG_REFRESH_INTERVAL_MS,
         "how often the lag metric's end offsets are read from the partition stores"),
    ], leave_out=() if retention_check_interval else ("retention-check-interval-ms",))


def group_config_from_args(args: argparse.Namespace) -> GroupConfig:
    return GroupConfig(
        min_session_timeout_ms=args.min_session_timeout_ms,
        max_session_timeout_ms=args.max_session_timeout_ms,
        max_heartbeat_interval_ms=args.max_heartbeat_interval_ms,
        offsets_retention_ms=args.offsets_retention_ms,
        retention_check_interval_ms=args.retention_check_interval_ms,
        initial_rebalance_delay_ms=args.initial_rebalance_delay_ms,
    )
