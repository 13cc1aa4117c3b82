"""High-availability ``celery beat``: :class:`LeaderScheduler`, exported by :mod:`tasklock.celery`.

::

    celery -A proj beat -S tasklock.celery.LeaderScheduler      # on as many hosts as you like

Every beat campaigns for one :class:`tasklock.Leader` lock; only the leader lets the wrapped
scheduler (Celery's ``PersistentScheduler`` unless ``app.conf.tasklock_beat_scheduler`` names
another, e.g. django-celery-beat's) send due tasks; the others wait and take over within about
one ``tasklock_beat_ttl`` of the leader's death, at once when it shuts down (it resigns).

What RedBeat's users reported, and how it is avoided here:

* beats exiting with ``LockNotOwnedError`` (the lock expired during a long sleep, then the
  extend raised): leadership is renewed by tasklock's watchdog thread, not by the beat loop,
  and a lost term is a step down (logged), never an exception out of ``tick()``;
* two leaders at once (a beat resumed after a pause past its TTL sends what is due): before it
  lets the wrapped scheduler send anything, the leader checks its lease by its own clock
  (``is_leader``, which a resumed process sees False at once) and then with the store
  (``confirm()``, one round trip); only then does it send;
* failed acquires ignored silently: every tick's campaign result is used, and a store that does
  not answer is logged (WARNING) and means "not leader" for that tick, so nothing is sent on
  an unconfirmed term and the beat keeps trying instead of exiting.

One tick per period across a takeover: each beat's schedule state (the shelve file) is its own,
so a new leader does not know when the old one last sent an entry, and would send at once what
its own stale state says is due (an interval entry the old leader sent a moment ago, or a
crontab entry of this very minute). So the leader writes each entry's last send time to a hash
in Redis (``<key_prefix>:beat:<app>:last_run``), and a beat that becomes leader first moves its
entries' ``last_run_at`` forward to those times. The hash lives on the lock's Redis; with
Redlock (``tasklock_urls``) or etcd there is no single Redis for it, and a takeover relies on
the new leader's own state (logged once at start).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from celery.utils.imports import symbol_by_name

from tasklock.backends import backend_for
from tasklock.config import resolve_options
from tasklock.core.connection import client_for_url
from tasklock.core.lease import check_seconds
from tasklock.errors import BackendUnavailable, ConfigurationError
from tasklock.leader import Leader

__all__ = ["LeaderScheduler"]

log = logging.getLogger("tasklock.celery.beat")

DEFAULT_TTL = 10.0
DEFAULT_SCHEDULER = "celery.beat:PersistentScheduler"

try:  # redis-py's errors are what a store that does not answer raises outside tasklock's calls
    from redis.exceptions import RedisError as _RedisError
except ImportError:  # pragma: no cover - redis is a dependency
    _RedisError = OSError  # type: ignore[misc,assignment]

_STORE_ERRORS: tuple[type[BaseException], ...] = (BackendUnavailable, _RedisError, OSError)


def beat_ttl(conf: Any) -> float:
    """``tasklock_beat_ttl`` (seconds, default 10), refused unless a number >= 1: shorter leases
    would be renewed more often than a busy Redis or a GC pause can keep up with."""
    value = conf.get("tasklock_beat_ttl")
    if value is None:
        return DEFAULT_TTL
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1:
        raise ConfigurationError(
            f"tasklock_beat_ttl must be a number of seconds >= 1, got {value!r}"
        )
    check_seconds("tasklock_beat_ttl", value, allow_none=False, allow_zero=False)  # inf, a year
    return float(value)


def wrapped_class(conf: Any) -> type[Any]:
    """The scheduler class ``tasklock_beat_scheduler`` names (a class, or a dotted path such as
    ``django_celery_beat.schedulers:DatabaseScheduler``); Celery's PersistentScheduler if unset."""
    value = conf.get("tasklock_beat_scheduler") or DEFAULT_SCHEDULER
    if isinstance(value, type):
        cls: Any = value
    else:
        try:
            cls = symbol_by_name(value)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigurationError(
                f"tasklock_beat_scheduler {value!r} could not be imported: {exc}"
            ) from None
    if not isinstance(cls, type) or not callable(getattr(cls, "tick", None)):
        raise ConfigurationError(
            f"tasklock_beat_scheduler must name a celery beat scheduler class, got {value!r}"
        )
    if issubclass(cls, LeaderScheduler):
        raise ConfigurationError(
            "tasklock_beat_scheduler names LeaderScheduler itself: name the scheduler it wraps"
        )
    return cls


def _store(app: Any) -> tuple[Any, Any | None]:
    """The Leader's store (as tasks choose theirs: ``tasklock_url``/``tasklock_urls``,
    ``TASKLOCK_URL``, else the broker's Redis) and the Redis client for the last-run hash, or
    None where the store is not one Redis."""
    options = resolve_options({}, app.conf)
    if options.urls:
        return list(options.urls), None
    if options.url is not None:
        if backend_for(options.url).external:
            return options.url, None
        client = client_for_url(options.url)
        return client, client
    from tasklock.celery.options import broker_client

    client = broker_client(app, None)
    return client, client


class LeaderScheduler:
    """A beat scheduler that sends only while this beat leads; see the module docstring.

    Not a :class:`celery.beat.Scheduler` subclass but a wrapper around one, so that it can wrap
    any scheduler class (django-celery-beat's has its own constructor and storage). It takes
    what beat's ``Service`` passes, builds the wrapped scheduler with it, and hands everything
    it does not define itself (``schedule``, ``should_sync``, ``_do_sync``, ...) to it.
    """

    def __init__(self, app: Any, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        self.app = app
        self.ttl = beat_ttl(app.conf)
        self.scheduler = wrapped_class(app.conf)(app, *args, lazy=lazy, **kwargs)
        prefix = resolve_options({}, app.conf).key_prefix
        self.name = f"{prefix}:beat:{app.main or 'celery'}"
        self.last_run_key = f"{self.name}:last_run"
        self._leader: Leader | None = None
        self._shared: Any | None = None
        self._leading = False  # what this beat last logged: leading or not
        self._waiting_for: str | None = None  # the holder last logged as leading
        if not lazy:  # lazy: beat's startup banner only reads info and max_interval
            store, self._shared = _store(app)
            self._leader = Leader(
                store,
                self.name,
                ttl=self.ttl,
                owner_info={"name": "celery beat", "role": "beat"},  # host and pid: the core's
            )
            # The beat reports its terms itself, saying what it does ("beat: became leader of
            # ..."); the Leader's own lines would say each event a second time.
            self._leader._report_level = logging.DEBUG
            if self._shared is None:
                log.info(
                    "beat: the lock's store is not one Redis: a new leader starts from its own "
                    "schedule state"
                )

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class does not define: the wrapped scheduler's.
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    @property
    def max_interval(self) -> float:
        return float(self.scheduler.max_interval)

    @property
    def info(self) -> str:
        inner = str(getattr(self.scheduler, "info", "") or "")
        lead = f"    . leader election -> {self.name} (ttl {self.ttl:g}s)"
        return f"{inner}\n{lead}" if inner else lead

    @property
    def leader(self) -> Leader:
        if self._leader is None:
            raise RuntimeError("LeaderScheduler built lazy has no leader election")
        return self._leader

    # -- the beat loop ---------------------------------------------------------------------
    def _standby_sleep(self) -> float:
        """At most half a TTL, so a standby tries again at least twice per lease: it takes over
        within about one TTL of a leader's death."""
        return min(self.ttl / 2, self.max_interval)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass of beat's loop: campaign when not leading; when leading, confirm the term
        with the store, then let the wrapped scheduler send what is due."""
        leader = self.leader
        if not leader.is_leader:
            self._note_lost()
            try:
                won = leader.campaign()
                if not won:
                    self._note_waiting()
                    # Wait here rather than sleep in beat's loop: the leader's release (it
                    # resigns when it shuts down) wakes this at once.
                    won = leader.wait_for_leadership(timeout=self._standby_sleep())
            except _STORE_ERRORS as exc:
                log.warning("beat: could not campaign for %s: %s", self.name, exc)
                return self._standby_sleep()
            if not won:
                return 0.0  # waited already: campaign again at once
        # Confirm right before sending: a beat resumed after a pause, whose watchdog has not yet
        # noticed, must not send on a term the store gave to another beat.
        try:
            confirmed = leader.confirm()
        except _STORE_ERRORS as exc:
            log.warning("beat: could not confirm leadership of %s: %s", self.name, exc)
            confirmed = False
        if not confirmed:
            self._note_lost()
            return self._standby_sleep()
        if not self._leading:  # a new term (or one confirmed again after the store was away)
            self._elected()
        interval = self.scheduler.tick(*args, **kwargs)
        # Capped so a leader that lost its term notices (and says so) within half a TTL.
        return min(float(interval), self.ttl / 2) if interval is not None else self.ttl / 2

    def _elected(self) -> None:
        self._leading = True
        self._waiting_for = None
        log.info("beat: became leader of %s (term %s)", self.name, self.leader.fence)
        self._seed_last_runs()
        self._wrap_apply_entry()

    def _note_lost(self) -> None:
        if not self._leading:
            return
        self._leading = False
        lost = self.leader.lost
        if lost:
            reason = getattr(lost, "reason", None) or "its lease ran out"
        elif self.leader.is_leader:
            reason = "the store could not confirm the term (nothing is sent until it does)"
        else:
            reason = "its lease ran out"
        log.warning("beat: stepped down from %s: %s", self.name, reason)

    def _note_waiting(self) -> None:
        try:
            holder = self.leader.leader()
        except _STORE_ERRORS:
            holder = None
        if holder is None:
            who = "another beat"
        else:
            meta = holder.meta
            who = f"{meta.get('host', '?')} pid {meta.get('pid', '?')}"
        if who != self._waiting_for:
            self._waiting_for = who
            log.info("beat: waiting: %s is leader of %s", who, self.name)

    # -- last runs shared across takeovers -------------------------------------------------
    def _wrap_apply_entry(self) -> None:
        """Record each entry the wrapped scheduler sends (its ``apply_entry``, which Celery's
        ``tick()`` calls once per due entry) in the shared hash."""
        scheduler = self.scheduler
        if self._shared is None or "apply_entry" in vars(scheduler):
            return
        original = scheduler.apply_entry

        def apply_entry(entry: Any, producer: Any = None) -> Any:
            result = original(entry, producer=producer)
            self._record(entry.name)
            return result

        scheduler.apply_entry = apply_entry

    def _record(self, entry_name: str) -> None:
        now = datetime.now(UTC).timestamp()
        try:
            self._shared.hset(self.last_run_key, entry_name, repr(now))  # type: ignore[union-attr]
        except _STORE_ERRORS as exc:
            log.warning("beat: could not record the last run of %s: %s", entry_name, exc)

    def _seed_last_runs(self) -> None:
        """Move each entry's ``last_run_at`` forward to the last send any leader recorded, so
        the new leader does not send again what the old one sent this period."""
        if self._shared is None:
            return
        try:
            recorded = self._shared.hgetall(self.last_run_key)
        except _STORE_ERRORS as exc:
            log.warning("beat: could not read the last runs of %s: %s", self.name, exc)
            return
        schedule = self.scheduler.schedule
        moved = 0
        for raw_name, raw_time in recorded.items():
            name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
            entry = schedule.get(name)
            if entry is None:
                continue
            try:
                when = datetime.fromtimestamp(float(raw_time), UTC)
            except (TypeError, ValueError, OverflowError):
                continue
            last = entry.last_run_at
            if last is not None and last.tzinfo is None:
                last = last.replace(tzinfo=UTC)  # Celery stores naive UTC with enable_utc
            if last is None or when > last:
                entry.last_run_at = when
                schedule[name] = entry  # shelve, or a dict-like: assign back to persist
                moved += 1
        if moved:
            self.scheduler._heap = None  # rebuilt from the moved entries on the next tick
            log.info("beat: %s entries resume from the last leader's runs", moved)

    # -- shutdown --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the wrapped scheduler (it syncs its state), then resign, so a standby takes
        over at once instead of after the TTL."""
        try:
            self.scheduler.close()
        finally:
            if self._leader is not None:
                try:
                    self._leader.resign()
                except _STORE_ERRORS as exc:
                    log.warning("beat: could not resign %s: %s", self.name, exc)
                if self._leading:
                    log.info("beat: resigned leadership of %s", self.name)
                self._leading = False
