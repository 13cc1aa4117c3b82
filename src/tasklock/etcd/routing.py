"""Which etcd member a request goes to, and where it goes when that member fails: one policy
for the blocking and the asyncio client (only their I/O differs).

* A request goes first to the member that answered last.
* A member that cannot be connected to (refused, or no TCP handshake in time) saw nothing of the
  request: the request moves on to the next member at once.
* A member that accepted the connection and then gave no answer in time (a paused or partitioned
  member accepts TCP and never replies) may have applied the request. Reads, keep-alives and
  revokes are safe to repeat, so they move on to the next member too; a transaction or a lease
  grant is not (only its caller knows whether repeating it is safe), so it fails with
  :class:`~tasklock.BackendUnavailable`. Either way the next request starts at the next member:
  a stalled member must not pin the client while the rest of the cluster answers.
"""

from __future__ import annotations

from collections.abc import Iterator

from tasklock.errors import BackendUnavailable
from tasklock.etcd import protocol

__all__ = ["SAFE_TO_REPEAT", "Endpoints", "Route", "unreachable"]

#: Gateway paths whose requests may be sent again to another member after one went unanswered.
SAFE_TO_REPEAT = frozenset(
    {protocol.RANGE, protocol.KEEPALIVE, protocol.TIMETOLIVE, protocol.REVOKE}
)


def unreachable(what: str, failures: list[str]) -> BackendUnavailable:
    """The error when no member could be reached."""
    return BackendUnavailable(
        f"etcd unreachable while {what}: {'; '.join(failures)}. Check that etcd runs and "
        "listens on these client URLs"
    )


class Endpoints:
    """The members' base URLs and the one to try first (shared by every request of a client)."""

    def __init__(self, endpoints: list[str]) -> None:
        self.urls = endpoints
        self.current = 0

    def route(self, path: str, what: str) -> Route:
        return Route(self, path, what)

    def answered(self, endpoint: str) -> None:
        self.current = self.urls.index(endpoint)

    def skip(self, endpoint: str) -> None:
        """Start the next request after ``endpoint`` (it stalled), unless another request has
        moved on already."""
        index = self.urls.index(endpoint)
        if self.current == index:
            self.current = (index + 1) % len(self.urls)


class Route:
    """One request's way through the members: iterate it for the endpoints to try, and report
    what each did."""

    def __init__(self, endpoints: Endpoints, path: str, what: str) -> None:
        self._endpoints = endpoints
        self._path = path
        self._what = what
        self._failures: list[str] = []

    def __iter__(self) -> Iterator[str]:
        urls, start = self._endpoints.urls, self._endpoints.current
        return iter(urls[start:] + urls[:start])

    def refused(self, endpoint: str, exc: BaseException) -> None:
        """Nothing was sent: try the next member."""
        self._failures.append(f"{endpoint} ({exc or type(exc).__name__})")

    def no_answer(self, endpoint: str, exc: BaseException, *, watch: bool = False) -> None:
        """Sent, but no answer: move on if the request is safe to repeat, else raise."""
        self._endpoints.skip(endpoint)
        detail = exc or type(exc).__name__
        if watch:
            raise BackendUnavailable(f"etcd at {endpoint} dropped a watch: {detail}") from exc
        if self._path not in SAFE_TO_REPEAT:
            raise BackendUnavailable(
                f"etcd at {endpoint} gave no answer while {self._what}: {detail}"
            ) from exc
        self._failures.append(f"{endpoint} (no answer: {detail})")

    def answered(self, endpoint: str) -> None:
        self._endpoints.answered(endpoint)

    def exhausted(self) -> BackendUnavailable:
        return unreachable(self._what, self._failures)
