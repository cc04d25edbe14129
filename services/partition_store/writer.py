"""Group commit: one writer task turns everything queued into one RocksDB write.

Produce handlers validate and assign offsets synchronously on the event loop,
then `submit()` their write group. The writer task takes the whole queue,
writes it as one WriteBatch with sync off, and in fsync mode has the flusher
thread call flush_wal(True) once for the group (rocksdict holds the GIL during
write(sync=True), so that is never used). Only then do the `on_durable`
callbacks run, in submission order (they advance high watermarks), and the
futures resolve (the replies go out). While one group syncs, the next one
accumulates: concurrent producers share one write and one sync.

A failed write leaves memory ahead of disk; the writer then fails every
pending and later write with STORAGE_ERROR (retriable) until memory is
rebuilt from what is on disk. When the device was full (DiskFullError) the
runtime does that by itself once space is freed (it reopens the database,
reopens every partition from disk and calls `resume`); after any other
failure the process must be restarted, as Kafka takes a log directory
offline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from oncelog.wire.errors import ErrorCode

from ..common.kernel.errors import ServiceError
from ..common.kernel.invariants import invariant
from . import metrics
from .storage.port import DiskFullError, KeyValueStore, StorageError, WriteGroup

log = logging.getLogger("oncelog.partition_store.writer")


@dataclass(slots=True)
class _Queued:
    group: WriteGroup
    on_durable: Callable[[], None] | None
    future: asyncio.Future[None]


class GroupCommitWriter:
    def __init__(self, store: KeyValueStore, *, fsync: bool) -> None:
        self._store = store
        self._fsync = fsync
        self._queue: list[_Queued] = []
        self._wakeup = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._flusher = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="oncelog-flusher")
            if fsync else None
        )
        self.failure: BaseException | None = None
        self.group_commits = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-commit")

    def submit(
        self, group: WriteGroup, on_durable: Callable[[], None] | None = None
    ) -> asyncio.Future[None]:
        """Queues a write group; the future resolves once it is durable (after
        on_durable has run)."""
        self.check_healthy()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Queued(group, on_durable, future))
        self._wakeup.set()
        return future

    @property
    def disk_full(self) -> bool:
        """Writes stopped because the device was full (they resume after
        `resume`)."""
        return isinstance(self.failure, DiskFullError)

    def check_healthy(self) -> None:
        if self.failure is not None:
            raise self._refusal(self.failure)

    @staticmethod
    def _refusal(failure: BaseException) -> ServiceError:
        if isinstance(failure, DiskFullError):
            return disk_full_refusal(failure)
        return ServiceError(
            ErrorCode.STORAGE_ERROR,
            f"storage write failed ({failure!r}); this store node must be restarted",
        )

    def resume(self) -> None:
        """Takes writes again after a disk-full failure, once the runtime
        has reopened storage and rebuilt memory from it."""
        invariant(self.disk_full, f"resume after {self.failure!r}: only a full disk resumes")
        self.failure = None
        metrics.DISK_FULL.set(0)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-commit")

    async def drain(self) -> None:
        """Waits until everything submitted so far is durable."""
        if self.failure is None and self._task is not None:
            await self.submit(WriteGroup())

    async def close(self) -> None:
        await self.drain()
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._flusher is not None:
            self._flusher.shutdown(wait=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._queue:
                if self._closing:
                    return
                continue
            items, self._queue = self._queue, []
            combined = WriteGroup()
            for item in items:
                combined.extend(item.group)
            try:
                if combined.ops:
                    started = time.perf_counter()
                    self._store.write(combined)
                    metrics.ROCKSDB_WRITE_SECONDS.observe(time.perf_counter() - started)
                    if self._flusher is not None:
                        started = time.perf_counter()
                        await loop.run_in_executor(self._flusher, self._store.sync)
                        metrics.FSYNC_SECONDS.observe(time.perf_counter() - started)
                for item in items:
                    if item.on_durable is not None:
                        item.on_durable()
            except Exception as exc:  # storage or invariant failure: stop writing
                self._fail(exc, items)
                return
            self.group_commits += 1
            metrics.GROUP_COMMIT_WRITES.observe(len(items))
            metrics.GROUP_COMMIT_BYTES.observe(sum(len(op[2]) for op in combined.ops))
            for item in items:
                if not item.future.done():
                    item.future.set_result(None)

    def _fail(self, exc: BaseException, items: list[_Queued]) -> None:
        self.failure = exc
        if isinstance(exc, DiskFullError):
            log.error("group commit failed, the disk is full: refusing writes until space "
                      "is freed (%s)", exc)
            metrics.DISK_FULL.set(1)
        else:
            log.critical("group commit failed; refusing further writes", exc_info=exc)
            metrics.STORAGE_FAILED.set(1)
        error = self._refusal(exc)
        for item in [*items, *self._queue]:
            if not item.future.done():
                item.future.set_exception(error)
                # Mark retrieved: nobody may be waiting (e.g. a snapshot write).
                item.future.exception()
        self._queue.clear()


def disk_full_refusal(failure: DiskFullError) -> ServiceError:
    return ServiceError(
        ErrorCode.STORAGE_ERROR,
        f"the store's disk is full ({failure}); writes are refused until space is "
        f"freed, then resume by themselves: retry",
    )


def storage_refusal(failure: Exception) -> ServiceError | None:
    """What a request that met a storage failure is answered (the RPC
    interceptor's translate_error): STORAGE_ERROR, retriable, as Kafka's
    KAFKA_STORAGE_ERROR — e.g. a read while the database is closed to be
    reopened after a full disk. None for anything that is not storage's."""
    if isinstance(failure, DiskFullError):
        return disk_full_refusal(failure)
    if isinstance(failure, StorageError):
        return ServiceError(
            ErrorCode.STORAGE_ERROR,
            f"this store's storage failed under the request ({failure}); retry: the store "
            "reopens its storage by itself after a full disk, or another replica leads",
        )
    return None

