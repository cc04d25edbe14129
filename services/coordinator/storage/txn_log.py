"""Where the transaction log lives: the port, the partition-store adapter, and
an in-memory adapter with the same conditional-append semantics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from oncelog.wire.errors import ErrorCode

from ...common.kernel.errors import ServiceError
from ...common.metadata.cluster import TRANSACTION_STATE_TOPIC
from ...common.rpc.store_client import StoreClient

Entry = tuple[bytes | None, bytes | None]


class TxnLog(Protocol):
    async def read_all(self, partition: int) -> tuple[list[Entry], int]:
        """Every record of a partition in order, and the log end offset after them."""
        ...

    async def append(self, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int) -> int:
        """Appends if the log still ends at expected_log_end_offset (else
        ServiceError LOG_END_OFFSET_MISMATCH); returns the new log end offset."""
        ...

    async def log_end_offset(self, partition: int) -> int:
        """Where the partition's durable records end now (what read_all would
        return as its log end offset, without reading the records)."""
        ...


class StoreTxnLog:
    def __init__(self, client: StoreClient) -> None:
        self._client = client

    async def read_all(self, partition: int) -> tuple[list[Entry], int]:
        result = await self._client.read_to_end(TRANSACTION_STATE_TOPIC, partition)
        return [(e.key, e.value) for e in result.entries], result.high_watermark

    async def append(self, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int) -> int:
        base = await self._client.append(
            TRANSACTION_STATE_TOPIC, partition, entries,
            expected_log_end_offset=expected_log_end_offset,
        )
        return base + len(entries)

    async def log_end_offset(self, partition: int) -> int:
        # The store's high watermark: an append is answered once durable, so
        # every acknowledged record is below it.
        return await self._client.log_end_offset(TRANSACTION_STATE_TOPIC, partition)


class MemoryTxnLog:
    def __init__(self) -> None:
        self.partitions: dict[int, list[Entry]] = {}
        # Test hooks: fail the next appends with this error, after (True) or
        # before (False) the records land — a lost reply vs a failed write.
        self.fail_next: list[tuple[ServiceError, bool]] = []

    async def read_all(self, partition: int) -> tuple[list[Entry], int]:
        entries = list(self.partitions.get(partition, []))
        return entries, len(entries)

    async def append(self, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int) -> int:
        log = self.partitions.setdefault(partition, [])
        if expected_log_end_offset != len(log):
            raise ServiceError(
                ErrorCode.LOG_END_OFFSET_MISMATCH,
                f"log ends at {len(log)}, expected {expected_log_end_offset}",
            )
        if self.fail_next:
            error, landed = self.fail_next.pop(0)
            if landed:
                log.extend(entries)
            raise error
        log.extend(entries)
        return len(log)

    async def log_end_offset(self, partition: int) -> int:
        return len(self.partitions.get(partition, []))
