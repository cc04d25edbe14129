"""ApiVersions (18): the APIs and versions served (apis.VERSIONS).

A request of a version we do not serve is answered too, at version 0 with
UNSUPPORTED_VERSION and our list (Kafka's rule: the answer's header is
always version 0, and a client that asked too high retries at the highest
version we list)."""

from __future__ import annotations

from typing import Any

from oncelog.wire.errors import ErrorCode

from ..apis import VERSIONS, ApiKey
from ..context import RequestContext
from ..messages import Builder


def _served(builder: Builder) -> tuple[Any, ...]:
    from . import HANDLERS

    return tuple(
        builder.make("ApiVersion", api_key=int(api), min_version=r.min_version,
                     max_version=r.max_version)
        for api, r in sorted(VERSIONS.items()) if api in HANDLERS
    )


def unsupported_version_response() -> Any:
    builder = Builder(ApiKey.API_VERSIONS, 0)
    return builder.response(error_code=ErrorCode.UNSUPPORTED_VERSION,
                            api_keys=_served(builder), throttle_time=0)


async def handle(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    return builder.response(error_code=0, api_keys=_served(builder), throttle_time=0)
