"""Helpers for transaction crash tests."""

from __future__ import annotations

import threading
import time

from oncelog import Admin, Producer


def wait_txn_state(admin: Admin, transactional_id: str, state: str,
                   deadline_s: float = 60) -> None:
    """Waits until the coordinator reports `state` for a transactional id
    (bounded, so a bug fails the test instead of hanging it)."""
    give_up_at = time.monotonic() + deadline_s
    last: str | None = None
    while time.monotonic() < give_up_at:
        try:
            last = admin.describe_transaction(transactional_id).state
        except Exception as exc:  # noqa: BLE001 - the coordinator or store may be restarting
            last = repr(exc)
        if last == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"{transactional_id} is {last}, not {state}, after {deadline_s} s")


class EndInBackground:
    """Commits or aborts a producer's transaction on another thread, so the
    test can crash and restart a service while the call is retrying."""

    def __init__(self, producer: Producer, *, commit: bool) -> None:
        self.outcome: list[BaseException | None] = []

        def end() -> None:
            try:
                if commit:
                    producer.commit_transaction()
                else:
                    producer.abort_transaction()
                self.outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - checked by join()
                self.outcome.append(exc)

        self._thread = threading.Thread(target=end)
        self._thread.start()

    def join(self, timeout_s: float = 120) -> None:
        """Waits for the call and fails the test if it raised."""
        self._thread.join(timeout_s)
        assert self.outcome == [None], f"ending the transaction failed: {self.outcome}"
