"""``tasklock stats``: the fleet's counts (:mod:`tasklock.fleet`) read from one Redis, a Redis
Cluster or every Redlock master, and the text that shows them.

Why every master for Redlock: a process writes its counts to one master only (the first its
task layer reaches), so each master holds the counts of the processes that write to it and the
fleet's are their sum (:func:`tasklock.fleet.merge`). Masters are read in parallel, so a stopped
or paused one costs one timeout, and one that does not answer is named rather than failing the
whole read: the sum of the others is still worth seeing, and the text says which master answered
what so a missing share is visible.

etcd keeps no fleet counts (tasks on etcd count in process, :mod:`tasklock.stats`), so an etcd
URL is a usage error that says so, not an empty table that would read as "nothing ran".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import redis.exceptions as redis_errors

from tasklock import fleet
from tasklock.backends import backend_for
from tasklock.core.connection import backend_errors
from tasklock.errors import BackendUnavailable, ConfigurationError
from tasklock.ops.doctor import redact_url
from tasklock.ops.render import counts_table
from tasklock.ops.stores import connect

__all__ = ["WINDOWS", "FleetCounts", "NodeCounts", "read_fleet", "stats_text"]

#: ``--window`` values: what :func:`tasklock.fleet.read_counts` takes.
WINDOWS = ("total", "hour", "day")

_WINDOW_TEXT = {
    "total": "totals, kept while a task is counted at least once a week",
    "hour": "the last hour",
    "day": "the last 24 hours",
}


@dataclass(frozen=True)
class NodeCounts:
    """What one Redis answered: its counts per task, or why it did not answer."""

    url: str  # redacted
    counts: dict[str, dict[str, int]] | None
    error: str | None = None


@dataclass(frozen=True)
class FleetCounts:
    """The counts of every node read, and their sum."""

    window: str
    prefix: str
    nodes: list[NodeCounts]

    @property
    def merged(self) -> dict[str, dict[str, int]]:
        """Per task name, each field summed over the nodes that answered."""
        return fleet.merge([node.counts for node in self.nodes if node.counts is not None])

    @property
    def failed(self) -> list[NodeCounts]:
        return [node for node in self.nodes if node.error is not None]

    @property
    def where(self) -> str:
        """The nodes as messages name them."""
        if len(self.nodes) == 1:
            return self.nodes[0].url
        return f"{len(self.nodes)} Redlock masters"


def _refuse_elsewhere(urls: Sequence[str], option: str) -> None:
    for url in urls:
        backend = backend_for(url)
        if not backend.keeps_counts:
            raise ConfigurationError(
                f"{option}={redact_url(url)!r} is {backend.name}, and fleet counts live in Redis: "
                f"tasks on {backend.name} keep their counts in each process "
                "(tasklock.stats.snapshot(), or tasklock.prometheus.instrument() to export them). "
                "Give the Redis URL your tasks use"
            )


def _read(url: str, option: str, prefix: str, window: str) -> dict[str, dict[str, int]]:
    client = connect(url, option)  # the process's shared client for the URL: not closed here
    with backend_errors(client, "reading fleet counts"):
        return fleet.read_counts(client, prefix=prefix, window=window)


def read_fleet(urls: Sequence[str], option: str, prefix: str, window: str) -> FleetCounts:
    """The counts on ``urls`` (one Redis, or Redlock's masters). With one URL a failure raises
    (:class:`BackendUnavailable`, as for every command); with several, a master that does not
    answer is recorded in its :class:`NodeCounts`, and only when none answers does it raise."""
    _refuse_elsewhere(urls, option)
    if len(urls) == 1:
        counts = _read(urls[0], option, prefix, window)
        return FleetCounts(window, prefix, [NodeCounts(redact_url(urls[0]), counts)])

    def one(url: str) -> NodeCounts:
        try:
            return NodeCounts(redact_url(url), _read(url, option, prefix, window))
        except (BackendUnavailable, redis_errors.RedisError) as exc:
            return NodeCounts(redact_url(url), None, str(exc))

    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        nodes = list(pool.map(one, urls))
    result = FleetCounts(window, prefix, nodes)
    if len(result.failed) == len(nodes):
        reasons = "; ".join(f"{node.url}: {node.error}" for node in nodes)
        raise BackendUnavailable(f"no Redlock master answered ({reasons})")
    return result


def _node_line(node: NodeCounts, width: int) -> str:
    if node.counts is None:
        return f"  {node.url.ljust(width)}  did not answer (its share is missing above)"
    if not node.counts:
        return f"  {node.url.ljust(width)}  no counts"
    ran = sum(fields.get("ran", 0) for fields in node.counts.values())
    duplicates = sum(fields.get("duplicates", 0) for fields in node.counts.values())
    tasks = f"{len(node.counts)} task" + ("" if len(node.counts) == 1 else "s")
    return f"  {node.url.ljust(width)}  {tasks}, ran {ran}, duplicates {duplicates}"


def _per_node(nodes: Sequence[NodeCounts]) -> list[str]:
    width = max(len(node.url) for node in nodes)
    lines = ["", "per master (each process writes to one master; the table is their sum):"]
    lines.extend(_node_line(node, width) for node in nodes)
    return lines


def stats_text(result: FleetCounts, merged: Mapping[str, Mapping[str, int]] | None = None) -> str:
    """The ``stats`` text: a title naming where and which window, the table, and for several
    masters what each answered."""
    counts = result.merged if merged is None else merged
    window = f"window {result.window}: {_WINDOW_TEXT[result.window]}"
    prefix = "" if result.prefix == "tasklock" else f", prefix {result.prefix!r}"
    if not counts:
        lines = [
            f"No tasklock counts on {result.where} ({window}{prefix}).",
            "Counts appear within a second of tasks running through tasklock's task layer on "
            "this Redis (each worker writes them every second); tasks on etcd keep theirs in "
            "process (tasklock.stats).",
        ]
    else:
        lines = [f"tasklock counts on {result.where} ({window}{prefix})", ""]
        lines.append(counts_table(counts))
    if len(result.nodes) > 1:
        lines.extend(_per_node(result.nodes))
    return "\n".join(lines)
