"""The coordinators a partition store can run in its process: their flags
and the checks of those flags against the layout.

`--transaction-coordinator NODE_ID|auto` and `--group-coordinator
NODE_ID|auto` (docs/coordinator.md, "The coordinator in a store"). Each
names a coordinator whose address in the layout (`--coordinators`,
`--group-coordinators`) is this store's own: the process serves it there,
and the calls between it and the store go without gRPC.

Light on purpose: a store parses these flags at every start, and imports
the coordinators themselves (tens of milliseconds) only when it runs one
(server.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from ..common.metadata.cluster import ClusterLayout
from ..common.rpc.server_base import env_default
from ..coordinator.config import add_coordinator_arguments
from ..group_coordinator.config import add_group_coordinator_arguments

AUTO = "auto"


@dataclass(frozen=True, slots=True)
class _Kind:
    flag: str
    layout_flag: str
    noun: str
    # What goes without gRPC when the store runs one (the flag's help).
    in_process: str


TRANSACTION = _Kind(
    "--transaction-coordinator", "--coordinators", "coordinator",
    "Its appends and markers to this store, and this store's questions to it")
GROUP = _Kind(
    "--group-coordinator", "--group-coordinators", "group coordinator",
    "Its reads and appends of __consumer_offsets at this store, and the group calls this "
    "store's Kafka listener forwards")


def _node(value: str) -> int | str:
    """A hosting flag's value: a node id, or "auto"."""
    if value.strip().lower() == AUTO:
        return AUTO
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither a coordinator node id nor {AUTO!r}") from None


def add_hosting_arguments(parser: argparse.ArgumentParser) -> None:
    """Both flags, and each coordinator's own flags (shared with its own
    server, config.py): those a store has already, with a meaning close
    enough to set both, are left to the store's."""
    for kind in (TRANSACTION, GROUP):
        parser.add_argument(
            kind.flag, type=_node, metavar="NODE_ID|auto", default=env_default(kind.flag[2:]),
            help=f"also run {kind.flag[2:].replace('-', ' ')} NODE_ID in this process "
                 "(docs/coordinator.md, 'The coordinator in a store'); "
                 f"{kind.layout_flag} must name this store's address at that place ('auto': "
                 f"the {kind.noun} {kind.layout_flag} places at this store's address). "
                 f"{kind.in_process} then go without gRPC. Unset: the {kind.noun}s run on "
                 "their own")
    add_coordinator_arguments(parser, max_transaction_timeout=False)
    add_group_coordinator_arguments(parser, retention_check_interval=False)


def _hosted(kind: _Kind, node: int | str | None, addresses: Sequence[str],
            address: str) -> int | None:
    """The node id a hosting flag names, checked against the layout's
    addresses of that kind; None when the flag is unset."""
    if node is None:
        return None
    if node == AUTO:
        if address not in addresses:
            raise ValueError(
                f"{kind.flag} {AUTO}: {kind.layout_flag} ({','.join(addresses) or 'empty'}) "
                f"names no {kind.noun} at this store's address {address}")
        return list(addresses).index(address)
    node = int(node)
    if not 0 <= node < len(addresses):
        raise ValueError(f"{kind.flag} {node}: {kind.layout_flag} names {len(addresses)} "
                         f"{kind.noun}s (node ids 0..{len(addresses) - 1})")
    if addresses[node] != address:
        raise ValueError(
            f"{kind.flag} {node}: {kind.layout_flag} gives that {kind.noun} the address "
            f"{addresses[node]}, and this store's is {address}; a store that runs a "
            f"{kind.noun} serves it at its own address")
    return node


def coordinator_node(args: argparse.Namespace, layout: ClusterLayout,
                     address: str) -> int | None:
    """The transaction coordinator this store runs (--transaction-coordinator),
    checked against the layout; None when it runs none."""
    return _hosted(TRANSACTION, args.transaction_coordinator, layout.coordinators, address)


def group_coordinator_node(args: argparse.Namespace, layout: ClusterLayout,
                           address: str) -> int | None:
    """The group coordinator this store runs (--group-coordinator), checked
    against the layout; None when it runs none."""
    return _hosted(GROUP, args.group_coordinator, layout.group_coordinators, address)
