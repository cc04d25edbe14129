"""The producer-id manager (Kafka's ProducerIdManager): hands out producer
ids from blocks it claims in `__producer_ids` (core/producer_ids.py decides
the next block, storage/producer_id_log.py appends the claim), claiming the
next block when one is used up. The transactions themselves are
txn_runtime.py's.
"""

from __future__ import annotations

import asyncio
import logging

from oncelog.wire.errors import ErrorCode

from ..common.kernel.errors import ServiceError
from .core.producer_ids import ProducerIdBlock, next_block
from .storage.producer_id_log import ProducerIdLog

log = logging.getLogger(__name__)

# Claims race only with other coordinators claiming at the same moment; a few
# attempts settle it, and more would only hide a stuck log.
MAX_BLOCK_CLAIM_ATTEMPTS = 20


class ProducerIdManager:
    """Hands out producer ids from blocks claimed durably in `__producer_ids`."""

    def __init__(self, id_log: ProducerIdLog, *, node_id: int, block_size: int) -> None:
        self._log = id_log
        self._node_id = node_id
        self._block_size = block_size
        self._block: ProducerIdBlock | None = None
        self._next_id = 0
        self._lock = asyncio.Lock()
        self.blocks_claimed = 0

    async def next_producer_id(self) -> int:
        async with self._lock:
            if self._block is None or self._next_id >= self._block.end_id:
                await self._claim_block()
            producer_id = self._next_id
            self._next_id += 1
            return producer_id

    async def _claim_block(self) -> None:
        for _attempt in range(MAX_BLOCK_CLAIM_ATTEMPTS):
            last, log_end = await self._log.read_last()
            block = next_block(last, owner_node_id=self._node_id, block_size=self._block_size)
            try:
                await self._log.append(block, expected_log_end_offset=log_end)
            except ServiceError as exc:
                if exc.code is ErrorCode.LOG_END_OFFSET_MISMATCH:
                    # Another coordinator claimed first: read its claim and go after it.
                    continue
                raise
            self._block = block
            self._next_id = block.first_id
            self.blocks_claimed += 1
            log.info("claimed producer ids [%d, %d)", block.first_id, block.end_id)
            return
        raise ServiceError(
            ErrorCode.COORDINATOR_NOT_AVAILABLE,
            f"could not claim a producer id block after {MAX_BLOCK_CLAIM_ATTEMPTS} attempts",
        )
