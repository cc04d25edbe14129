"""One pool of client channels per process, for services calling services.

Channels use the SDK's client options (message size limits, and a reconnect
backoff capped at a second, so a restarted peer is found again quickly rather
than after gRPC's default two-minute backoff).
"""

from __future__ import annotations

import grpc

from oncelog.wire.limits import CHANNEL_OPTIONS


class ChannelPool:
    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=list(CHANNEL_OPTIONS))
            self._channels[address] = channel
        return channel

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)
