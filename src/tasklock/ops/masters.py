"""``tasklock ls`` across Redlock's masters: every master read, their locks merged, and which
masters hold each one.

Why merge by key *and holder*: a Redlock hold is one value (``<token> <meta>#<fence>``) on a
majority of the masters, so one row per key and owner token, with the masters that hold it, is
the lock as Redlock sees it. The token, not the whole value, says which masters hold the same
acquire: between its two rounds a master holds the value without its fence (``acquire`` returns
once a majority finished round two, so a fresh hold is often read that way on the last master).
A holder on fewer than a majority is no hold: an acquire in progress, one that failed and is
being undone, or what a master kept after the lock was released while it was unreachable (it
expires with its TTL). Listing each master separately would show one lock N times and hide
exactly that difference.

Masters are read in parallel (a stopped or paused one costs one timeout, not one each). One that
does not answer is reported and the others listed: a view of most masters is what an operator
needs while one is down, and the NODES column says how many of all the masters hold each row.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis.exceptions as redis_errors

from tasklock.errors import BackendUnavailable
from tasklock.ops.doctor import redact_url
from tasklock.ops.inspect import LockInfo, newest_first
from tasklock.ops.render import lock_table
from tasklock.ops.stores import RedisStore

__all__ = ["HeldAcross", "MastersView", "list_across", "masters_text"]


@dataclass(frozen=True)
class HeldAcross:
    """One holder of a key and the masters that hold it. ``lock`` is its value with a fence
    when a master has that one, and carries the shortest time left among them: the first master
    to let it go is where it stops being held everywhere."""

    lock: LockInfo
    nodes: tuple[str, ...]  # redacted URLs, in the order the masters were given

    def to_json(self) -> dict[str, Any]:
        """The lock's ``ls --json`` object with ``nodes``: the masters that hold this value."""
        data = self.lock.to_json()
        data["nodes"] = list(self.nodes)
        return data


@dataclass(frozen=True)
class MastersView:
    """Every master's locks, merged, and the masters that did not answer."""

    urls: list[str]  # redacted, every master given
    held: list[HeldAcross]
    errors: dict[str, str]  # redacted URL -> why it did not answer

    @property
    def quorum(self) -> int:
        return len(self.urls) // 2 + 1

    def without_quorum(self) -> list[HeldAcross]:
        """The rows that are certainly no Redlock hold: short of a majority even if every master
        that did not answer held them too."""
        missing = len(self.errors)
        return [entry for entry in self.held if len(entry.nodes) + missing < self.quorum]


def _shortest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def merge(per_node: Sequence[tuple[str, Sequence[LockInfo]]]) -> list[HeldAcross]:
    """The locks of several masters, one entry per key and owner token, newest first."""
    found: dict[tuple[str, str], tuple[LockInfo, list[str]]] = {}
    for url, locks in per_node:
        for info in locks:
            ident = (info.key, info.holder.token)
            seen = found.get(ident)
            if seen is None:
                found[ident] = (info, [url])
                continue
            first, nodes = seen
            nodes.append(url)
            shown = first if first.fence is not None or info.fence is None else info
            ttl = _shortest(first.ttl_ms, info.ttl_ms)
            found[ident] = (
                LockInfo(shown.key, shown.raw_value, shown.holder, ttl, shown.permits),
                nodes,
            )
    held = [HeldAcross(info, tuple(nodes)) for info, nodes in found.values()]
    return sorted(held, key=lambda entry: newest_first(entry.lock))


def list_across(urls: Sequence[str], option: str, match: bytes) -> MastersView:
    """Every master's locks matching ``match``, merged. Raises :class:`BackendUnavailable` only
    when no master answered."""
    redacted = [redact_url(url) for url in urls]

    def one(url: str) -> list[LockInfo] | str:
        try:
            return RedisStore(url, option).list_locks(match)
        except (BackendUnavailable, redis_errors.RedisError) as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        answers = list(pool.map(one, urls))
    errors = {url: a for url, a in zip(redacted, answers, strict=True) if isinstance(a, str)}
    if len(errors) == len(urls):
        reasons = "; ".join(f"{url}: {why}" for url, why in errors.items())
        raise BackendUnavailable(f"no Redlock master answered ({reasons})")
    per_node = [
        (url, a) for url, a in zip(redacted, answers, strict=True) if not isinstance(a, str)
    ]
    return MastersView(redacted, merge(per_node), errors)


def masters_text(view: MastersView, pattern: str) -> str:
    """The ``ls --urls`` text: the table with NODES (``3/5``), rows that cannot be a Redlock
    hold marked ``not held``, and a note saying why."""
    total = len(view.urls)
    answered = total - len(view.errors)
    where = f"{total} Redlock masters" + (f" ({answered} answered)" if view.errors else "")
    if not view.held:
        return f"No tasklock locks held on {where} matching {pattern!r}."
    short = {id(entry) for entry in view.without_quorum()}
    cells = [
        f"{len(entry.nodes)}/{total}" + (" not held" if id(entry) in short else "")
        for entry in view.held
    ]
    lines = [lock_table([entry.lock for entry in view.held], nodes=cells)]
    if short:
        lines.append("")
        lines.append(
            f"not held: on fewer than {view.quorum} of {total} masters, even counting those that "
            "did not answer, so no Redlock hold (an acquire in progress or being undone, or a "
            "value a master kept while unreachable; it expires with its TTL). "
            "`tasklock ls --json` names the masters of each row."
        )
    return "\n".join(lines)
