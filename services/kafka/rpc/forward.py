"""The coordinators' APIs, forwarded over gRPC.

Kafka's clients send InitProducerId, AddPartitionsToTxn, EndTxn, JoinGroup,
OffsetCommit and the rest to whichever broker FindCoordinator named; here
that broker is a partition store, and the work is the transaction or group
coordinator's. The listener has already decided, with the client's
principal, that the client may make the call (context.authorize); the
forwarded call carries the store's own identity (its client certificate,
which the coordinators trust for ClusterAction), as the store's other calls
to the coordinators do.

Which coordinator owns a key is the answer the stores' transaction
verification and the SDK's FindCoordinator use too: the coordinator of the
key's `__transaction_state` (or `__consumer_offsets`) partition, by the
layout, or, where a coordinator runs in every store, the one in the store
that leads that partition now (ClusterLayout.coordinator_now, with this
store's view). A coordinator that cannot be reached is
COORDINATOR_NOT_AVAILABLE (retriable: the client looks the coordinator up
again and retries), as Kafka's clients expect of a coordinator that moved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from oncelog.wire.errors import ErrorCode
from oncelog.wire.status import error_from_rpc

from ...common.kernel.errors import ServiceError
from ...common.metadata.cluster import ClusterLayout, LeaderOf
from ...common.rpc.channels import ChannelPool
from ...common.rpc.local_calls import InProcess, local_call

Response = TypeVar("Response", bound=Message)

TRANSACTION_COORDINATOR = "oncelog.v1.TransactionCoordinator"
GROUP_COORDINATOR = "oncelog.v1.GroupCoordinator"
# Transport failures: the coordinator may be restarting or moving.
_UNREACHABLE = {ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT,
                ErrorCode.UNKNOWN_SERVER_ERROR}
_UNREACHABLE_STATUS = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.CANCELLED}
# One forwarded call may take this long, unless the API waits longer by
# design (JoinGroup: the rebalance timeout).
DEFAULT_TIMEOUT_S = 30.0


class CoordinatorClient:
    """`local`: the coordinator this process runs, if any
    (services/common/rpc/local_calls.py), answers its calls without gRPC."""

    def __init__(self, layout: ClusterLayout, leader_of: LeaderOf, *,
                 live_stores: Callable[[], Collection[int] | None],
                 local: InProcess | None = None) -> None:
        """`leader_of` and `live_stores`: this store's view of who leads
        each partition and which stores are alive (None: not known, as
        StoreHooks.live answers), for coordinators that follow leadership
        (ClusterLayout.coordinator_now, coordinators_to_ask)."""
        self._layout = layout
        self._leader_of = leader_of
        self._live_stores = live_stores
        self._local = local
        self._channels = ChannelPool()

    # ------------------------------------------------------------------ routing

    async def transaction_coordinator(self, transactional_id: str) -> tuple[int, str]:
        layout = self._layout
        if not layout.coordinators:
            raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                               "the cluster has no transaction coordinator (--coordinators)")
        node = await layout.coordinator_now(
            layout.transaction_state_partition(transactional_id), self._leader_of)
        return node, layout.coordinators[node]

    async def group_coordinator(self, group_id: str) -> tuple[int, str]:
        layout = self._layout
        if not layout.group_coordinators:
            raise ServiceError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                               "the cluster has no group coordinator (--group-coordinators)")
        node = await layout.group_coordinator_now(
            layout.consumer_offsets_partition(group_id), self._leader_of)
        return node, layout.group_coordinators[node]

    @property
    def transaction_coordinators(self) -> Sequence[str]:
        """The addresses a listing asks (ClusterLayout.coordinators_to_ask)."""
        return [self._layout.coordinators[c]
                for c in self._layout.coordinators_to_ask(self._live_stores())]

    @property
    def group_coordinators(self) -> Sequence[str]:
        return [self._layout.group_coordinators[c]
                for c in self._layout.group_coordinators_to_ask(self._live_stores())]

    # ------------------------------------------------------------------- calls

    async def call(self, address: str, service: str, method: str, request: Message,
                   response_type: type[Response], *,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> Response:
        """One unary call; ServiceError with the coordinator's code when it
        refuses the call as a whole, COORDINATOR_NOT_AVAILABLE when it cannot
        be reached."""
        here = local_call(self._local, address, f"/{service}/{method}")
        if here is not None:
            try:
                local_response: Response = await here(request, timeout_s)
            except ServiceError as exc:
                raise ServiceError(exc.code, f"{method} at {address}: {exc.message}") from exc
            return local_response
        channel = self._channels.get(address)
        stub: Any = channel.unary_unary(
            f"/{service}/{method}", request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString)
        try:
            response: Response = await stub(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            error = error_from_rpc(exc)
            code = ErrorCode.from_wire(error.code)
            if code in _UNREACHABLE and exc.code() in _UNREACHABLE_STATUS:
                code = ErrorCode.COORDINATOR_NOT_AVAILABLE
            raise ServiceError(code, f"{method} at {address}: {error.message}") from exc
        return response

    async def transaction(self, transactional_id: str, method: str, request: Message,
                          response_type: type[Response], *,
                          timeout_s: float = DEFAULT_TIMEOUT_S) -> Response:
        _node, address = await self.transaction_coordinator(transactional_id)
        return await self.call(address, TRANSACTION_COORDINATOR, method, request,
                               response_type, timeout_s=timeout_s)

    async def group(self, group_id: str, method: str, request: Message,
                    response_type: type[Response], *,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> Response:
        _node, address = await self.group_coordinator(group_id)
        return await self.call(address, GROUP_COORDINATOR, method, request, response_type,
                               timeout_s=timeout_s)

    async def each(self, addresses: Sequence[str], service: str, method: str,
                   request: Message, response_type: type[Response]) -> list[Response]:
        """The same call to every coordinator of a kind (listings); a
        coordinator that fails fails the whole."""
        return list(await asyncio.gather(*(
            self.call(address, service, method, request, response_type)
            for address in addresses)))

    async def close(self) -> None:
        await self._channels.close()
