"""One pool of client channels per process, for services calling services.

Channels use the SDK's client options (message size limits, and a reconnect
backoff capped at a second, so a restarted peer is found again quickly rather
than after gRPC's default two-minute backoff).

A service that serves TLS calls the others over TLS too, with its own
certificate as its client certificate (`configure_client_tls`, once at
start-up, before the first channel is made): the process has one identity,
so the setting is the process's, not each pool's. After the certificate
files change (security/tls.py's TlsFiles), a pool makes a new channel on the
next `get` and closes the old one once the calls on it had time to end.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from oncelog.wire.limits import CHANNEL_OPTIONS

from ..security.tls import ClientTls

# How long a channel replaced after a certificate change stays open for the
# calls already on it (a long-poll Fetch waits up to 30 s).
RETIRED_CHANNEL_GRACE_S = 60.0

_client_tls: ClientTls | None = None


def configure_client_tls(tls: ClientTls | None) -> None:
    """Makes every channel made from now on use TLS with these credentials
    (None: plain text)."""
    global _client_tls
    _client_tls = tls


def client_tls() -> ClientTls | None:
    return _client_tls


class ChannelPool:
    def __init__(self) -> None:
        # address -> (the TLS files' generation it was made with, 0 for plain text; channel)
        self._channels: dict[str, tuple[int, grpc.aio.Channel]] = {}
        # Channels replaced after a certificate change, closing after a grace.
        self._retiring: dict[asyncio.Task[None], grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        tls = _client_tls
        if tls is None:
            entry = self._channels.get(address)
            if entry is None:
                entry = self._channels[address] = (
                    0, grpc.aio.insecure_channel(address, options=list(CHANNEL_OPTIONS)))
            return entry[1]
        generation, credentials = tls.credentials()
        entry = self._channels.get(address)
        if entry is not None and entry[0] == generation:
            return entry[1]
        channel = grpc.aio.secure_channel(address, credentials, options=list(CHANNEL_OPTIONS))
        self._channels[address] = (generation, channel)
        if entry is not None:
            self._retire(entry[1])
        return channel

    def _retire(self, channel: grpc.aio.Channel) -> None:
        async def close_later() -> None:
            await asyncio.sleep(RETIRED_CHANNEL_GRACE_S)
            await channel.close(None)

        task = asyncio.ensure_future(close_later())
        self._retiring[task] = channel
        task.add_done_callback(lambda done: self._retiring.pop(done, None))

    async def close(self) -> None:
        channels = [c for _, c in self._channels.values()]
        self._channels = {}
        retiring, self._retiring = dict(self._retiring), {}
        for task, channel in retiring.items():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            channels.append(channel)
        for channel in channels:
            await channel.close(None)
