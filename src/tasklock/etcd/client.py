"""The blocking transport to etcd's v3 JSON gateway: an :class:`httpx.Client` and a list of
endpoints.

A request goes to the endpoint that answered last; one that cannot be connected to (nothing was
sent, so any request is safe to repeat) passes the request on to the next, and when none can be
reached the error is :class:`tasklock.BackendUnavailable` naming them all. A failure after the
request was sent (a read timeout, a dropped connection) is not retried elsewhere: a transaction
may have been applied, and only the caller knows whether repeating it is safe.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from tasklock.errors import ConfigurationError
from tasklock.etcd import protocol
from tasklock.etcd.routing import Endpoints, unreachable

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("tasklock.etcd needs httpx: pip install 'tasklock[etcd]'") from exc

__all__ = ["Client", "as_client", "unreachable"]

#: Seconds to connect, and to wait for a unary answer (a Raft write normally takes milliseconds).
DEFAULT_TIMEOUT = 5.0


class Client:
    """A synchronous etcd v3 gateway client for tasklock (thread-safe, fork-aware)."""

    def __init__(self, endpoints: str | Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoints = protocol.parse_endpoints(endpoints)
        self.timeout = float(timeout)
        self._ring = Endpoints(self.endpoints)
        self._lock = threading.Lock()
        self._http: httpx.Client | None = None
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"<tasklock.etcd.Client {','.join(self.endpoints)}>"

    def _client(self) -> httpx.Client:
        pid = os.getpid()
        http = self._http
        if http is None or self._pid != pid:  # a forked child must not share the parent's sockets
            with self._lock:
                if self._http is None or self._pid != pid:
                    self._http = httpx.Client(timeout=self.timeout)
                    self._pid = pid
                http = self._http
        assert http is not None
        return http

    def raw(self, path: str, body: dict[str, Any], what: str) -> tuple[int, bytes, str]:
        """POST ``body`` to ``path``: (status, body, endpoint) from the first endpoint that can
        be connected to."""
        http = self._client()
        route = self._ring.route(path, what)
        for endpoint in route:
            try:
                response = http.post(endpoint + path, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                route.refused(endpoint, exc)
                continue
            except httpx.TransportError as exc:
                route.no_answer(endpoint, exc)  # raises unless the request is safe to repeat
                continue
            route.answered(endpoint)
            return response.status_code, response.content, endpoint
        raise route.exhausted()

    def call(self, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        """POST and parse; etcd's errors as tasklock errors."""
        status, content, endpoint = self.raw(path, body, what)
        return protocol.reply_of(status, content, endpoint, what)

    def revoke(self, lease: int, what: str) -> None:
        """Revoke ``lease``; one already gone is fine."""
        status, content, endpoint = self.raw(protocol.REVOKE, {"ID": str(lease)}, what)
        protocol.check_revoke(status, content, endpoint, what)

    def wait_for_delete(
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
                with http.stream("POST", endpoint + protocol.WATCH, json=body, timeout=limits) as r:
                    if r.status_code >= 300:
                        error = protocol.error_from_reply(
                            r.status_code, r.read(), endpoint, "watching a lock"
                        )
                        assert error is not None
                        raise error
                    for line in r.iter_lines():
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

    def close(self) -> None:
        with self._lock:
            http, self._http = self._http, None
        if http is not None:
            http.close()


def as_client(endpoints_or_client: Any) -> Client:
    """A :class:`Client` as given, or one made from endpoint URLs."""
    if isinstance(endpoints_or_client, Client):
        return endpoints_or_client
    if isinstance(endpoints_or_client, str | list | tuple):
        return Client(endpoints_or_client)
    raise ConfigurationError(
        "endpoints_or_client must be etcd URLs ('etcd://10.0.0.1:2379,10.0.0.2:2379', or a "
        "list of http(s):// URLs) or a tasklock.etcd.Client, got "
        f"{type(endpoints_or_client).__name__}"
    )
