"""The admin page of held locks: who holds what, for how long, and the fleet's counts; with a
force-release that cannot delete a lock someone else took since the page was read.

The page hangs off :class:`tasklock.django.models.HeldLock`, a model without a table, because
Django's admin lists and permission-checks pages per model. It is at
``/admin/tasklock/heldlock/`` and reads, on every load, the same place the project's tasks lock
in: ``TASKLOCK["URL"]`` (or ``TASKLOCK["URLS"]``, and ``KEY_PREFIX``), else the ``TASKLOCK_URL``
(``TASKLOCK_URLS``, ``TASKLOCK_KEY_PREFIX``) environment variables, as
:func:`tasklock.config.resolve_options` merges them for a task without options of its own.

* Who may see it: active staff (others are sent to the admin login) with the
  ``tasklock.view_locks`` permission (staff without it get 403 Forbidden); force-release needs
  ``tasklock.release_locks`` as well. Superusers have both.
* Held locks: one row per lock (and per live permit of a Semaphore), newest first, with the
  key as ``tasklock ls`` prints it, the holder's host, pid and task, the age (by the holder's
  clock), the TTL left and the fence token. Under Redlock (``URLS``) each master is read and
  the rows merged: a lock is one row, with the masters that hold that same value.
* Force-release posts the key and the exact value shown (both base64). The store deletes only
  if the key still holds that value (the same compare-and-delete as ``tasklock release``), so a
  lock that expired and was taken again meanwhile is left alone and the page says so. Under
  Redlock, each master's copy of that same hold (the same token: a master between Redlock's two
  rounds has it without the fence) is released the same way.
* The stats table: the fleet's counts per task name (:mod:`tasklock.fleet`), over all time, the
  last hour or the last day; summed over the masters under Redlock. etcd keeps no such counts.

Every failure to read (no URL configured, an invalid setting, a server that does not answer) is
an error box on the page, not a 500: the page is what an operator opens when things are wrong.
Everything shown is escaped by the template: keys and holder metadata are anyone's data.
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from tasklock import fleet
from tasklock.backends import backend_for
from tasklock.config import resolve_options
from tasklock.django.models import HeldLock
from tasklock.errors import TaskLockError
from tasklock.ops.doctor import redact_url
from tasklock.ops.inspect import (
    LockInfo,
    key_bytes,
    key_text,
    newest_first,
    parse_lock_value,
    printable,
)
from tasklock.ops.render import duration, holder_line
from tasklock.ops.stores import Store, connect, open_store

__all__ = ["HeldLockAdmin", "LockRow", "Snapshot", "read_snapshot", "release_everywhere"]

VIEW_PERMISSION = "tasklock.view_locks"
RELEASE_PERMISSION = "tasklock.release_locks"
#: The stats table's windows, as :func:`tasklock.fleet.read_counts` names them.
WINDOWS = {"total": "all time", "hour": "the last hour", "day": "the last day"}
#: Columns of the stats table after the task name: the fields every task has, and rate limiting.
STAT_FIELDS = (*fleet.FIELDS, "rate_limited")
#: What a server can raise while it is read: unreachable, refusing, or answering nonsense.
_READ_ERRORS = (TaskLockError, redis.RedisError, OSError, ValueError)

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[HeldLock]
else:
    _ModelAdmin = admin.ModelAdmin


class NotConfigured(Exception):
    """No URL to read, or a setting that cannot be used: shown in the page's error box."""


@dataclass(frozen=True)
class Target:
    """Where the page reads: the URLs (several for Redlock), how the setting is named in
    messages, and the key prefix of the fleet counts."""

    urls: tuple[str, ...]
    option: str
    key_prefix: str


def configured_target() -> Target:
    """The URL(s) and key prefix the project's tasks use when they set none of their own."""
    try:
        options = resolve_options({})
    except TaskLockError as exc:
        raise NotConfigured(f"The tasklock setting cannot be used: {exc}") from None
    in_django = options.sources.get("urls" if options.urls else "url") == "Django TASKLOCK"
    if options.urls:
        urls, option = options.urls, "TASKLOCK['URLS']" if in_django else "TASKLOCK_URLS"
    elif options.url:
        urls, option = (options.url,), "TASKLOCK['URL']" if in_django else "TASKLOCK_URL"
    else:
        raise NotConfigured(
            "No lock server is configured: set TASKLOCK['URL'] (or TASKLOCK['URLS'] for "
            "Redlock) in the settings, or the TASKLOCK_URL environment variable, to the Redis "
            "or etcd the tasks lock in."
        )
    return Target(tuple(urls), option, options.key_prefix)


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def _decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text.encode("ascii"))


def _cell(value: object) -> str:
    return "-" if value is None else printable(str(value))


@dataclass
class LockRow:
    """One held lock (or permit) as the page shows it; ``nodes`` are the masters (indexes into
    the target's URLs) that hold this same hold (its token), ``ttl_ms`` the least TTL left."""

    info: LockInfo
    nodes: list[int] = field(default_factory=list)
    ttl_ms: int | None = None

    @property
    def key(self) -> str:
        return key_text(self.info.key)

    @property
    def host(self) -> str:
        return _cell(self.info.host)

    @property
    def pid(self) -> str:
        return _cell(self.info.pid)

    @property
    def task(self) -> str:
        return _cell(self.info.task)

    @property
    def task_name(self) -> str:
        return _cell(self.info.task_name)

    @property
    def fence(self) -> str:
        return _cell(self.info.fence)

    @property
    def kind(self) -> str:
        permits = self.info.permits
        return "lock" if permits is None else f"permit ({permits} live)"

    @property
    def ttl(self) -> str:
        return "no TTL" if self.ttl_ms is None else duration(self.ttl_ms / 1000)

    def age(self, now: float) -> str:
        at = self.info.acquired_at
        return "-" if at is None else duration(now - at)

    @property
    def key_field(self) -> str:
        """The key's bytes, base64: what the release form posts (a key is any bytes)."""
        return _encode(key_bytes(self.info.key))

    @property
    def value_field(self) -> str:
        """The value's bytes as read, base64: release deletes only if the key still holds it."""
        return _encode(self.info.raw_value)


@dataclass
class Snapshot:
    """Everything the page shows, read in one go."""

    where: list[str] = field(default_factory=list)
    rows: list[LockRow] = field(default_factory=list)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    stats_note: str | None = None
    errors: list[str] = field(default_factory=list)


def _read_locks(url: str, option: str, match: bytes) -> list[LockInfo]:
    store = open_store(url, option)
    try:
        return store.list_locks(match)
    finally:
        store.close()


def _read_counts(url: str, option: str, prefix: str, window: str) -> dict[str, dict[str, int]]:
    client = connect(url, option)
    try:
        return fleet.read_counts(client, prefix, window)
    finally:
        client.close()


def read_snapshot(match: bytes = b"*", window: str = "total") -> Snapshot:
    """Locks and counts from every configured server; each failure becomes one error line."""
    snapshot = Snapshot()
    try:
        target = configured_target()
    except NotConfigured as exc:
        snapshot.errors.append(str(exc))
        return snapshot
    snapshot.where = [redact_url(url) for url in target.urls]
    merged: dict[tuple[str, str], LockRow] = {}
    per_node: list[dict[str, dict[str, int]]] = []
    for index, url in enumerate(target.urls):
        shown = redact_url(url)
        try:
            locks = _read_locks(url, target.option, match)
        except _READ_ERRORS as exc:
            snapshot.errors.append(f"Could not read the locks on {shown}: {exc}")
            continue
        for info in locks:
            # One hold is one row: its token names it on every master (a master between
            # Redlock's two rounds holds it without the fence; the row shows the fenced copy).
            row = merged.setdefault(
                (info.key, info.holder.token), LockRow(info, ttl_ms=info.ttl_ms)
            )
            row.nodes.append(index)
            if row.info.fence is None and info.fence is not None:
                row.info = info
            if info.ttl_ms is not None and (row.ttl_ms is None or info.ttl_ms < row.ttl_ms):
                row.ttl_ms = info.ttl_ms  # the copy that expires first
        backend = backend_for(url)
        if not backend.keeps_counts:
            snapshot.stats_note = (
                f"{backend.name} keeps no fleet counts: each process counts in memory only."
            )
            continue
        try:
            per_node.append(_read_counts(url, target.option, target.key_prefix, window))
        except _READ_ERRORS as exc:
            snapshot.errors.append(f"Could not read the fleet counts on {shown}: {exc}")
    snapshot.rows = sorted(merged.values(), key=lambda row: newest_first(row.info))
    snapshot.stats = fleet.merge(per_node)
    return snapshot


@dataclass(frozen=True)
class Outcome:
    """What one force-release did on each server: released, found changed, or failed."""

    released: int
    changed: int
    errors: list[str]
    holder: str | None


def _same_hold(found: bytes, shown: bytes, *, redlock: bool) -> bool:
    """Whether a master's value is the hold that was shown: the very value; under Redlock also
    that value without its fence (or with it), i.e. the same token, because a master between
    Redlock's two rounds holds ``<token> <meta>`` and the others ``<token> <meta>#<fence>``."""
    if found == shown:
        return True
    if not redlock:
        return False
    found_holder, shown_holder = parse_lock_value(found), parse_lock_value(shown)
    return (
        found_holder is not None
        and shown_holder is not None
        and found_holder.token == shown_holder.token
    )


def _release_on(store: Store, key: str, value: bytes, *, redlock: bool) -> LockInfo | None:
    """Release ``key`` on ``store`` if it still holds ``value``: the lock released, else None.

    The key is read again and released through the store's compare-and-delete (the script every
    lock releases with on Redis, a transaction on the create revision on etcd) of the value just
    read: whatever happens between the read and the delete, a value that is no longer the hold
    shown is never deleted.
    """
    state = store.read(key)
    if store.is_semaphore(state):
        permit = next((p for p in store.permits(key) if p.raw_value == value), None)
        if permit is not None and store.release_permit(key, permit):
            return permit
        return None
    lock = state.lock
    if (
        lock is not None
        and _same_hold(lock.raw_value, value, redlock=redlock)
        and store.release(lock)
    ):
        return lock
    return None


def release_everywhere(key: str, value: bytes) -> Outcome:
    """Force-release ``key`` on every configured server where it still holds ``value``."""
    target = configured_target()
    released = changed = 0
    errors: list[str] = []
    holder: str | None = None
    for url in target.urls:
        try:
            store = open_store(url, target.option)
            try:
                lock = _release_on(store, key, value, redlock=len(target.urls) > 1)
            finally:
                store.close()
        except _READ_ERRORS as exc:
            errors.append(f"{redact_url(url)}: {exc}")
            continue
        if lock is None:
            changed += 1
        else:
            released += 1
            holder = holder_line(lock)
    return Outcome(released, changed, errors, holder)


def _allowed(request: HttpRequest, permission: str) -> bool:
    """``request.user.has_perm(permission)``, for any user model (the admin requires one with
    ``has_perm``; a custom user without it is simply allowed nothing)."""
    has_perm = getattr(request.user, "has_perm", None)
    return callable(has_perm) and bool(has_perm(permission))


def _match(request: HttpRequest) -> str:
    return request.GET.get("match", "").strip() or "*"


def _window(request: HttpRequest) -> str:
    window = request.GET.get("window", "total")
    return window if window in WINDOWS else "total"


@admin.register(HeldLock)
class HeldLockAdmin(_ModelAdmin):
    """The page of held locks, instead of a change list (there is no table to list).

    Only two URLs: the page and the force-release POST, both behind ``admin_view`` (active
    staff, CSRF, no caching); the model's permissions are checked in each view.
    """

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _allowed(request, VIEW_PERMISSION)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        info = (self.opts.app_label, self.opts.model_name)
        return [
            path(
                "",
                self.admin_site.admin_view(self.locks_view),
                name="{}_{}_changelist".format(*info),
            ),
            path(
                "release/",
                self.admin_site.admin_view(self.release_view),
                name="{}_{}_release".format(*info),
            ),
        ]

    def locks_view(self, request: HttpRequest) -> HttpResponse:
        """The page: held locks and the stats table, read now."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        match, window = _match(request), _window(request)
        snapshot = read_snapshot(key_bytes(match), window)
        now = time.time()
        redlock = len(snapshot.where) > 1
        rows = [
            {
                "row": row,
                "age": row.age(now),
                "nodes": f"{len(row.nodes)} of {len(snapshot.where)}" if redlock else "",
            }
            for row in snapshot.rows
        ]
        stats = [
            {"task": printable(task), "counts": [counts.get(name, 0) for name in STAT_FIELDS]}
            for task, counts in sorted(snapshot.stats.items())
        ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Held locks",
            "snapshot": snapshot,
            "rows": rows,
            "redlock": redlock,
            "match": match,
            "window": window,
            "windows": WINDOWS,
            "window_label": WINDOWS[window],
            "stat_fields": STAT_FIELDS,
            "stats": stats,
            "can_release": _allowed(request, RELEASE_PERMISSION),
            "release_url": reverse(f"{self.admin_site.name}:tasklock_heldlock_release"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "tasklock/admin/held_locks.html", context)

    def release_view(self, request: HttpRequest) -> HttpResponse:
        """Force-release the posted key if it still holds the posted value; back to the page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and _allowed(request, RELEASE_PERMISSION)):
            raise PermissionDenied
        back = HttpResponseRedirect(reverse(f"{self.admin_site.name}:tasklock_heldlock_changelist"))
        try:
            key = _decode(request.POST["key"]).decode("utf-8", "surrogateescape")
            value = _decode(request.POST["value"])
        except (KeyError, ValueError, binascii.Error):
            messages.error(request, "The release form was incomplete: nothing released.")
            return back
        shown = f"'{key_text(key)}'"
        try:
            outcome = release_everywhere(key, value)
        except NotConfigured as exc:
            messages.error(request, str(exc))
            return back
        _report(request, shown, outcome)
        return back


def _report(request: HttpRequest, shown: str, outcome: Outcome) -> None:
    """One message per force-release, saying exactly what happened where."""
    total = outcome.released + outcome.changed + len(outcome.errors)
    for error in outcome.errors:
        messages.error(request, f"Could not release {shown} on {error}")
    if outcome.released and outcome.released == total:
        messages.success(request, f"Released {shown} ({outcome.holder}).")
    elif outcome.released:
        changed = (
            f"; on {outcome.changed} it had changed since you looked and was left alone"
            if outcome.changed
            else ""
        )
        messages.warning(
            request, f"Released {shown} on {outcome.released} of {total} servers{changed}."
        )
    elif outcome.changed:
        messages.warning(
            request,
            f"{shown} changed since you looked (released, expired or taken again by someone "
            "else): not released.",
        )
