"""Starts of rate-limited test tasks and jobs, as their bodies record them: ``RPUSH
starts:<name>:<batch> "<label>|<server time>|<pid>"`` (the server's clock, which the limit counts
on), and what the rate tests judge them by."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["most_in_a_second", "starts"]


def starts(client: Any, name: str, batch: str) -> list[tuple[str, float, int]]:
    """(label, server time, pid) of every start of ``name`` in ``batch``, in recorded order."""
    out = []
    for raw in client.lrange(f"starts:{name}:{batch}", 0, -1):
        label, at, pid = raw.decode().split("|")
        out.append((label, float(at), int(pid)))
    return out


def most_in_a_second(times: Sequence[float]) -> int:
    """The most starts in any rolling second ``[t, t + 1)``."""
    ordered = sorted(times)
    return max(sum(1 for u in ordered if t <= u < t + 1.0) for t in ordered)
