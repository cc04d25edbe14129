"""Where producer-id block claims are kept: the port, its partition-store
adapter, and an in-memory adapter for unit tests and simulation."""

from __future__ import annotations

from typing import Protocol

from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ...common.metadata.cluster import PRODUCER_IDS_TOPIC
from ...common.rpc.store_client import StoreClient
from ..core.producer_ids import ProducerIdBlock, decode_block, encode_block


class ProducerIdLog(Protocol):
    async def read_last(self) -> tuple[ProducerIdBlock | None, int]:
        """The newest durable claim (None when there is none) and the log end offset."""
        ...

    async def append(self, block: ProducerIdBlock, *, expected_log_end_offset: int) -> None:
        """Appends a claim if the log still ends at expected_log_end_offset, else
        raises ServiceError(LOG_END_OFFSET_MISMATCH)."""
        ...


# Every claim has the same key: the topic is compacted (newest record per
# key survives), and only the newest claim matters.
BLOCK_KEY = b"producer-id-block"


class StoreProducerIdLog:
    """Claims in partition 0 of `__producer_ids`, one record per batch, so the
    newest claim is always the record just below the log end offset (the
    store never compacts the newest batch). Claims written before the topic
    had keys are removed by compaction like any record without a key."""

    def __init__(self, client: StoreClient) -> None:
        self._client = client

    async def read_last(self) -> tuple[ProducerIdBlock | None, int]:
        log_end = await self._client.log_end_offset(PRODUCER_IDS_TOPIC, 0)
        if log_end == 0:
            return None, 0
        result = await self._client.read(PRODUCER_IDS_TOPIC, 0, log_end - 1)
        if not result.entries or result.entries[-1].value is None:
            raise ServiceError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{PRODUCER_IDS_TOPIC} ends at offset {log_end} but its last record "
                "could not be read",
            )
        return decode_block(result.entries[-1].value), log_end

    async def append(self, block: ProducerIdBlock, *, expected_log_end_offset: int) -> None:
        await self._client.append(
            PRODUCER_IDS_TOPIC, 0, [(BLOCK_KEY, encode_block(block))],
            expected_log_end_offset=expected_log_end_offset,
        )


class MemoryProducerIdLog:
    """In-memory stand-in with the same conditional-append semantics."""

    def __init__(self) -> None:
        self.values: list[bytes] = []

    async def read_last(self) -> tuple[ProducerIdBlock | None, int]:
        if not self.values:
            return None, 0
        return decode_block(self.values[-1]), len(self.values)

    async def append(self, block: ProducerIdBlock, *, expected_log_end_offset: int) -> None:
        if expected_log_end_offset != len(self.values):
            raise ServiceError(
                ErrorCode.LOG_END_OFFSET_MISMATCH,
                f"log ends at {len(self.values)}, expected {expected_log_end_offset}",
            )
        self.values.append(encode_block(block))
