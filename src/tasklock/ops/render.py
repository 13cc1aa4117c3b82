"""Text for people: the ``tasklock ls`` table, ``show`` details, the doctor report and the
``stats`` table.

Everything here is a pure function of already-read data and the current time, so output can be
checked without a server and stays consistent between commands. ``--json`` output does not come
from here: it is the ``to_json`` of the data classes, a stable interface for scripts.

Whatever a server holds, each lock is one line of printable text: keys are shown as
:func:`~tasklock.ops.inspect.key_text` writes them (the form ``show`` and ``release`` take back),
and every other cell, which comes from the holder's metadata and so from anyone who can write to
Redis, has its newlines and other characters that do not print escaped the same way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from tasklock.ops.doctor import Report, Status
from tasklock.ops.inspect import LockInfo, key_text, printable

__all__ = [
    "counts_table",
    "doctor_report",
    "duration",
    "holder_line",
    "lock_details",
    "lock_table",
    "permit_list",
    "semaphore_details",
    "with_fence_note",
]

_MISSING = "-"


def duration(seconds: float) -> str:
    """A short human duration: ``850ms``, ``29.5s``, ``12m03s``, ``5h07m``, ``3d04h``."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _ttl(info: LockInfo) -> str:
    return "no TTL" if info.ttl_ms is None else duration(info.ttl_ms / 1000)


def _age(info: LockInfo, now: float) -> str:
    at = info.acquired_at
    return _MISSING if at is None else duration(now - at)


def _cell(value: object) -> str:
    return _MISSING if value is None else printable(str(value))


def _task(info: LockInfo) -> str | None:
    """The task as the table shows it: ``name[id]``, or whichever of the two is known."""
    task, name = info.task, info.task_name
    if task is not None and name:
        return f"{name}[{task}]"
    return task if task is not None else name


def _columns(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(indent + line.rstrip() for line in lines)


def _kind(info: LockInfo) -> str:
    return "lock" if info.permits is None else f"permit ({info.permits} live)"


def lock_table(
    locks: Sequence[LockInfo], now: float | None = None, nodes: Sequence[str] | None = None
) -> str:
    """The ``ls`` table, one row per lock or permit in the order given (newest first).

    When a Semaphore's permit is among the rows, a last column KIND says which rows are permits
    and how many live permits each one's semaphore has; without one, the table is the locks'.
    ``nodes``, one cell per lock, adds a column NODES (Redlock: ``3/5``, the masters that hold
    that holder's value), since a Redlock hold is only one while a majority has it.
    """
    now = time.time() if now is None else now
    with_kind = any(info.permits is not None for info in locks)
    header = ("KEY", "HOST", "PID", "TASK", "AGE", "TTL", "FENCE") + (("KIND",) * with_kind)
    header += ("NODES",) * (nodes is not None)
    rows = [header]
    for index, info in enumerate(locks):
        row: tuple[str, ...] = (
            key_text(info.key),
            _cell(info.host),
            _cell(info.pid),
            _cell(_task(info)),
            _age(info, now),
            _ttl(info),
            _cell(info.fence),
        )
        row += (_kind(info),) * with_kind
        rows.append(row + (() if nodes is None else (nodes[index],)))
    return _columns(rows)


def holder_line(info: LockInfo) -> str:
    """One line naming the holder, for confirmations and error messages:
    ``host web-1, pid 4242, task 3b7… (app.settle), fence 17, TTL 29.5s left``."""
    parts = [f"host {_cell(info.host)}", f"pid {_cell(info.pid)}"]
    if info.task is not None and info.task_name is not None:
        parts.append(f"task {_cell(info.task)} ({_cell(info.task_name)})")
    elif info.task is not None or info.task_name is not None:
        parts.append(f"task {_cell(info.task if info.task is not None else info.task_name)}")
    parts.append(f"fence {_cell(info.fence)}")
    parts.append(f"TTL {_ttl(info)} left")
    return ", ".join(parts)


def lock_details(
    info: LockInfo,
    counters: Mapping[str, int | None],
    labels: Mapping[str, str],
    now: float | None = None,
) -> str:
    """The ``show`` text: value, holder, timing, fence and the fence counter(s)."""
    now = time.time() if now is None else now
    rows: list[tuple[str, str]] = [("key", key_text(info.key))]
    rows.append(("value", printable(info.holder.value)))
    rows.append(("host", _cell(info.host)))
    rows.append(("pid", _cell(info.pid)))
    if info.task is not None:
        rows.append(("task id", _cell(info.task)))
    if info.task_name is not None:
        rows.append(("task name", _cell(info.task_name)))
    extra = {k: v for k, v in info.meta.items() if k not in ("host", "pid", "task", "name", "at")}
    for name, value in extra.items():
        rows.append((f"meta {printable(name)}", _cell(value)))
    at = info.acquired_at
    if at is not None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(at))
        rows.append(("acquired", f"{stamp} ({duration(now - at)} ago, holder's clock)"))
    elif "at" in info.meta:  # there, but no time a clock gives (1e300, "yesterday", NaN)
        written = printable(repr(info.meta["at"]))
        written = written if len(written) <= 40 else written[:39] + "…"
        rows.append(("acquired", f"unknown (the holder's metadata has at={written})"))
    rows.append(("ttl", "no TTL (never expires!)" if info.ttl_ms is None else f"{_ttl(info)} left"))
    rows.append(("fence", _cell(info.fence)))
    rows.extend(_counter_rows(info.fence, counters, labels))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _counter_rows(
    fence: int | None, counters: Mapping[str, int | None], labels: Mapping[str, str]
) -> list[tuple[str, str]]:
    rows = []
    for key, value in counters.items():
        label = labels.get(key, "")
        text = "not set" if value is None else str(value)
        if value is not None and fence is not None and value < fence:
            text += " (BEHIND the held fence: the counter was lost, tokens will repeat)"
        rows.append((f"fence counter ({label})", f"{key_text(key)} = {text}"))
    return rows


def permit_list(permits: Sequence[LockInfo], most: int = 10) -> str:
    """The permits on one line, for errors: their :func:`holder_line` joined by ``; ``, the
    first ``most`` of them and how many more."""
    shown = "; ".join(holder_line(p) for p in permits[:most])
    if len(permits) > most:
        shown += f"; and {len(permits) - most} more (`tasklock show` lists them all)"
    return shown


def semaphore_details(
    key: str,
    permits: Sequence[LockInfo],
    counters: Mapping[str, int | None],
    labels: Mapping[str, str],
    now: float | None = None,
    backend: str = "Redis",
) -> str:
    """The ``show`` text of a Semaphore: its live permits (first to free first), each with its
    holder, fence, age, time left and owner token (what ``release --token`` takes), and its
    fence counter(s). ``backend`` names where the permits are kept ("Redis", "etcd"): the limit
    is not, and an operator should not go looking for it there."""
    now = time.time() if now is None else now
    fences = [p.fence for p in permits if p.fence is not None]
    count = f"{len(permits)} live permit" + ("" if len(permits) == 1 else "s")
    limit = f"its limit is the holders' setting, not kept in {backend}"
    rows: list[tuple[str, str]] = [
        ("key", key_text(key)),
        ("kind", f"semaphore, {count} ({limit})"),
    ]
    rows.extend(_counter_rows(max(fences, default=None), counters, labels))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name.ljust(width)}  {value}" for name, value in rows]
    table = [("FENCE", "HOST", "PID", "TASK", "AGE", "TTL", "TOKEN")]
    for p in permits:
        table.append(
            (
                _cell(p.fence),
                _cell(p.host),
                _cell(p.pid),
                _cell(_task(p)),
                _age(p, now),
                _ttl(p),
                printable(p.holder.token),
            )
        )
    lines.append("permits, first to free first:")
    lines.append(_columns(table, indent="  "))
    return "\n".join(lines)


def with_fence_note(details: str, key: str, note: str | None) -> str:
    """``show``'s text (:func:`lock_details`, :func:`semaphore_details`) with the store's word
    on fence counters (etcd has none) as the last row of its ``name  value`` block (whose first
    row is ``key``), aligned with the rows above."""
    if note is None:
        return details
    head, sep, tail = details.partition("\npermits, first to free first:")
    rows = head.splitlines()
    width = len(rows[0]) - len(key_text(key)) - 2
    name = "fence counter"
    if len(name) > width:
        rows = [row[:width] + " " * (len(name) - width) + row[width:] for row in rows]
        width = len(name)
    rows.append(f"{name.ljust(width)}  {note}")
    return "\n".join(rows) + sep + tail


_MARK = {Status.OK: "ok  ", Status.WARN: "WARN", Status.FAIL: "FAIL"}


def doctor_report(report: Report, strict: bool = False, title: str | None = None) -> str:
    """The doctor's verdicts grouped by node, each problem followed by its fix, and a summary.
    ``title`` is the first line; by default it names the Redis setup (one server or Redlock's
    masters), so the etcd doctor, whose report has the same shape, passes its own."""
    if title is None:
        many = len(report.urls) > 1
        kind = f"{len(report.urls)} Redlock masters" if many else "single-instance lock"
        title = f"tasklock doctor ({kind})"
    lines = [title]
    groups: dict[str | None, list[str]] = {}
    for url in report.urls:
        groups.setdefault(url, [])
    width = max((len(c.name) for c in report.checks), default=0)
    for check in report.checks:
        entry = groups.setdefault(check.node, [])
        entry.append(f"  {_MARK[check.status]}  {check.name.ljust(width)}  {check.message}")
        if check.fix and check.status is not Status.OK:
            entry.append(f"        {' ' * width}  fix: {check.fix}")
    for node, entries in groups.items():
        lines.append("")
        lines.append(node if node is not None else "across nodes")
        lines.extend(entries)
    failures, warnings = len(report.failures), len(report.warnings)
    oks = len(report.checks) - failures - warnings
    verdict = "problems found" if report.exit_code(strict) else "no problem that breaks locks"
    if not failures and warnings and not strict:
        verdict += " (warnings only; --strict makes them fail)"
    lines.append("")
    lines.append(f"{oks} ok, {warnings} warning(s), {failures} failure(s): {verdict}")
    return "\n".join(lines)


#: The extra integer fields shown as columns of their own, when any task has one.
_OPTIONAL_COUNTS = (("rate_limited", "RATE LIMITED"), ("ran_unlocked", "RAN UNLOCKED"))


def _duplicates(fields: Mapping[str, int]) -> str:
    """``3 (skip 2, retry 1)``: the total and each policy that took a part of it."""
    total = fields.get("duplicates", 0)
    prefix = "duplicates_"
    parts = [
        f"{name[len(prefix) :]} {value}"
        for name, value in sorted(fields.items())
        if name.startswith(prefix) and value
    ]
    return f"{total} ({', '.join(parts)})" if parts else str(total)


def _waited(fields: Mapping[str, int]) -> str:
    """``4 (mean 212ms)``: the calls that waited for a holder, and how long they waited."""
    waited = fields.get("waited", 0)
    if not waited:
        return "0"
    return f"{waited} (mean {duration(fields.get('wait_us', 0) / waited / 1e6)})"


def counts_table(counts: Mapping[str, Mapping[str, int]]) -> str:
    """The ``stats`` table: one row per task name, sorted by name, of the fleet's counts
    (:func:`tasklock.fleet.read_counts`). Duplicates show which policy handled them and waits
    their mean, the two things an operator asks next; rate limiting and unlocked runs get a
    column only when some task has them, so the usual table stays narrow."""
    optional = [
        (field, title)
        for field, title in _OPTIONAL_COUNTS
        if any(fields.get(field) for fields in counts.values())
    ]
    header: tuple[str, ...] = ("TASK", "RAN", "DUPLICATES", "WAITED", "RETRIES", "LOST")
    header += ("BACKEND ERRORS", "ENQUEUE DEDUPES", *(title for _, title in optional))
    rows = [header]
    for task in sorted(counts):
        fields = counts[task]
        row = (
            printable(task),
            str(fields.get("ran", 0)),
            _duplicates(fields),
            _waited(fields),
            str(fields.get("retries", 0)),
            str(fields.get("lost", 0)),
            str(fields.get("backend_errors", 0)),
            str(fields.get("enqueue_dedupes", 0)),
        )
        rows.append(row + tuple(str(fields.get(field, 0)) for field, _ in optional))
    return _columns(rows)
