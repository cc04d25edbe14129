"""Producer ids are unique across coordinators and restarts.

Method: several ProducerIdManagers (coordinators) share one in-memory
conditional-append log and hand out ids concurrently with interleaved block
claims; managers are thrown away and recreated (a restart loses the
in-memory block). Every id handed out must be distinct.
"""

from __future__ import annotations

import asyncio

import pytest

from services.common.kernel.durable import CorruptValueError
from services.coordinator.core.producer_ids import (
    ProducerIdBlock,
    decode_block,
    encode_block,
    next_block,
)
from services.coordinator.producer_id_manager import ProducerIdManager
from services.coordinator.storage.producer_id_log import MemoryProducerIdLog


def test_next_block_follows_the_last_claim() -> None:
    first = next_block(None, owner_node_id=0, block_size=10)
    assert (first.first_id, first.end_id) == (0, 10)
    second = next_block(first, owner_node_id=1, block_size=5)
    assert (second.first_id, second.end_id, second.owner_node_id) == (10, 15, 1)


def test_block_record_round_trip_and_corruption() -> None:
    block = ProducerIdBlock(first_id=1000, size=1000, owner_node_id=2)
    data = encode_block(block)
    assert decode_block(data) == block
    damaged = data[:-1] + bytes([data[-1] ^ 0xFF])
    with pytest.raises(CorruptValueError):
        decode_block(damaged)


def test_concurrent_coordinators_and_restarts_never_repeat_an_id() -> None:
    async def scenario() -> list[int]:
        id_log = MemoryProducerIdLog()
        handed_out: list[int] = []
        for _restart in range(3):
            managers = [ProducerIdManager(id_log, node_id=n, block_size=7) for n in range(3)]

            async def take(manager: ProducerIdManager, count: int) -> None:
                for _ in range(count):
                    handed_out.append(await manager.next_producer_id())
                    # Yield so claims of different managers interleave.
                    await asyncio.sleep(0)

            await asyncio.gather(*(take(m, 20) for m in managers))
        return handed_out

    ids = asyncio.run(scenario())
    assert len(ids) == 3 * 3 * 20
    assert len(set(ids)) == len(ids)


def test_a_lost_race_reads_the_winner_and_claims_after_it() -> None:
    async def scenario() -> tuple[int, int]:
        id_log = MemoryProducerIdLog()
        a = ProducerIdManager(id_log, node_id=0, block_size=100)
        b = ProducerIdManager(id_log, node_id=1, block_size=100)
        first_a = await a.next_producer_id()
        first_b = await b.next_producer_id()
        return first_a, first_b

    first_a, first_b = asyncio.run(scenario())
    assert (first_a, first_b) == (0, 100)
