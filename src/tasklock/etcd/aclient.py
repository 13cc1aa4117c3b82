"""The asyncio transport to etcd's v3 JSON gateway: an :class:`httpx.AsyncClient` per event
loop, and a list of endpoints.

The twin of :mod:`tasklock.etcd.client`, with the same rules: a request goes to the endpoint
that answered last; one that cannot be connected to (nothing was sent) passes it on to the next;
none reachable is :class:`tasklock.BackendUnavailable` naming them all; a failure after the
request was sent is not retried elsewhere. Every request body, reply parse and error comes from
:mod:`tasklock.etcd.protocol`; only the awaiting is here.

An ``httpx.AsyncClient`` is bound to the event loop it first ran on, so one is kept per loop
(weakly: a closed loop takes its client with it); one :class:`AsyncClient` can be shared by locks
on several loops.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import Any

from tasklock.errors import ConfigurationError
from tasklock.etcd import protocol
from tasklock.etcd.client import DEFAULT_TIMEOUT
from tasklock.etcd.routing import Endpoints

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("tasklock.asyncio.etcd needs httpx: pip install 'tasklock[etcd]'") from exc

__all__ = ["AsyncClient", "as_async_client"]


class AsyncClient:
    """An asyncio etcd v3 gateway client for tasklock."""

    def __init__(self, endpoints: str | Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoints = protocol.parse_endpoints(endpoints)
        self.timeout = float(timeout)
        self._ring = Endpoints(self.endpoints)
        self._http: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"<tasklock.etcd.AsyncClient {','.join(self.endpoints)}>"

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        http = self._http.get(loop)
        if http is None or http.is_closed:
            http = self._http[loop] = httpx.AsyncClient(timeout=self.timeout)
        return http

    async def raw(self, path: str, body: dict[str, Any], what: str) -> tuple[int, bytes, str]:
        """POST ``body`` to ``path``: (status, body, endpoint) from the first endpoint that can
        be connected to."""
        http = self._client()
        route = self._ring.route(path, what)
        for endpoint in route:
            try:
                response = await http.post(endpoint + path, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                route.refused(endpoint, exc)
                continue
            except httpx.TransportError as exc:
                route.no_answer(endpoint, exc)  # raises unless the request is safe to repeat
                continue
            route.answered(endpoint)
            return response.status_code, response.content, endpoint
        raise route.exhausted()

    async def call(self, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        """POST and parse; etcd's errors as tasklock errors."""
        status, content, endpoint = await self.raw(path, body, what)
        return protocol.reply_of(status, content, endpoint, what)

    async def revoke(self, lease: int, what: str) -> None:
        """Revoke ``lease``; one already gone is fine."""
        status, content, endpoint = await self.raw(protocol.REVOKE, {"ID": str(lease)}, what)
        protocol.check_revoke(status, content, endpoint, what)

    async def wait_for_delete(
        self, key: bytes, start_revision: int, timeout: float, *, range_end: bytes | None = None
    ) -> bool:
        """Watch ``key`` from ``start_revision`` for up to ``timeout`` s: True once it was
        deleted (or the watch must be looked at again), False when the time ran out. With
        ``range_end``: a delete of any key in [key, range_end) (a semaphore's permits).

        A watch that cannot be opened raises BackendUnavailable; the caller decides.
        """
        http = self._client()
        body = protocol.watch_request(key, start_revision, range_end)
        limits = httpx.Timeout(self.timeout, read=max(0.001, timeout))
        route = self._ring.route(protocol.WATCH, "watching a lock")
        for endpoint in route:
            try:
                async with http.stream(
                    "POST", endpoint + protocol.WATCH, json=body, timeout=limits
                ) as r:
                    if r.status_code >= 300:
                        error = protocol.error_from_reply(
                            r.status_code, await r.aread(), endpoint, "watching a lock"
                        )
                        assert error is not None
                        raise error
                    async for line in r.aiter_lines():
                        if protocol.watch_woken(line.encode()):
                            return True
                    return True  # the server ended the stream: look again
            except httpx.ReadTimeout:
                return False
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                route.refused(endpoint, exc)
                continue
            except httpx.TransportError as exc:
                route.no_answer(endpoint, exc, watch=True)
        raise route.exhausted()

    async def aclose(self) -> None:
        """Close this loop's connections (other loops' go with their loops)."""
        loop = asyncio.get_running_loop()
        http = self._http.pop(loop, None)
        if http is not None:
            await http.aclose()


def as_async_client(endpoints_or_client: Any) -> AsyncClient:
    """An :class:`AsyncClient` as given, or one made from endpoint URLs."""
    if isinstance(endpoints_or_client, AsyncClient):
        return endpoints_or_client
    if isinstance(endpoints_or_client, str | list | tuple):
        return AsyncClient(endpoints_or_client)
    raise ConfigurationError(
        "endpoints_or_client must be etcd URLs ('etcd://10.0.0.1:2379,10.0.0.2:2379', or a "
        "list of http(s):// URLs) or a tasklock.etcd.aclient.AsyncClient, got "
        f"{type(endpoints_or_client).__name__}"
    )
