"""Prometheus metrics for tasklock: the fleet's counts and held locks, read at scrape time, and
in-process histograms of acquire wait and hold time. Needs ``pip install 'tasklock[prometheus]'``.

Two sources, because they answer different questions:

* :class:`Collector` reads what Redis already knows, when Prometheus asks: the fleet-wide counts
  per task name that every worker's task layer writes (:mod:`tasklock.fleet`) and the locks held
  right now (:func:`tasklock.ops.inspect.list_locks`, Semaphore permits too). Any one process
  can export it, for the whole fleet, so counts from RQ work horses and Celery prefork children
  that are long gone are still there. Register it in a web process you already scrape::

      from prometheus_client import REGISTRY
      from tasklock.prometheus import Collector

      REGISTRY.register(Collector("redis://localhost:6379/0"))

  or run ``tasklock exporter --url redis://localhost:6379/0 --port 9464`` (:func:`serve`) when
  there is no Python web process to put it in. Several URLs are Redlock's masters: counts are
  summed over them (each process writes to the first it reaches) and a lock held on several is
  one hold. A scrape never fails because Redis does: ``tasklock_up`` is 0 and
  ``tasklock_scrape_errors_total`` counts it. Labels are task names only, never call keys, so
  the number of series stays that of your tasks.

* :func:`instrument` times each acquire and hold as it happens in this process, into
  histograms: the distribution of waits and of hold times, which totals cannot give. Call it
  once at import of your tasks module; until it is called the task layer's hot path pays
  nothing for it (:mod:`tasklock.observe` hands out a shared no-op).

Histograms under Celery prefork and RQ, where the work happens in forked children (RQ's work
horses exit after each job), use prometheus_client's multiprocess mode: each process writes its
samples to files in a shared directory, and whoever serves the metrics sums them.

1. Set ``PROMETHEUS_MULTIPROC_DIR`` to an empty, writable directory in the worker's environment
   (before anything imports prometheus_client: it picks the mode at import) and empty it when
   the worker (re)starts, as prometheus_client asks.
2. Call ``tasklock.prometheus.instrument()`` at import of the tasks module (Celery's children
   and RQ's horses then record into their own files; the files survive the process, so the
   counts of a horse that exited after one job are kept).
3. Serve them from a process of your choice (a small HTTP server beside the worker, your web
   app on the same host) with a registry of its own::

       from prometheus_client import CollectorRegistry, start_http_server
       from prometheus_client.multiprocess import MultiProcessCollector

       registry = CollectorRegistry()
       MultiProcessCollector(registry)
       registry.register(Collector("redis://localhost:6379/0"))  # optional: reads Redis
       start_http_server(9465, registry=registry)

   Not prometheus_client's default registry: in multiprocess mode it holds only the serving
   process's own samples.
4. Celery: mark children that ended, so their live gauges go (histograms are kept and summed).
   RQ needs nothing more (a horse's files simply stay)::

       from celery.signals import worker_process_shutdown
       from prometheus_client import multiprocess

       @worker_process_shutdown.connect
       def _dead(pid=None, **kwargs):
           multiprocess.mark_process_dead(pid)

Only calls that take the execution lock are timed (a task with ``limit=None`` has none).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Histogram, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        f"tasklock.prometheus needs prometheus_client ({exc}): pip install 'tasklock[prometheus]'"
    ) from exc

from tasklock import fleet, observe
from tasklock.backends import backend_for
from tasklock.core.connection import client_for_url
from tasklock.core.urls import validate_url
from tasklock.ops.inspect import LockInfo, list_locks
from tasklock.ops.permits import list_permits

__all__ = ["DEFAULT_BUCKETS", "Collector", "instrument", "serve", "uninstrument"]

log = logging.getLogger("tasklock")

#: Socket timeout of the clients made for URLs: a stalled Redis answers a scrape with
#: ``tasklock_up 0`` well inside Prometheus's default 10 s scrape timeout.
SCRAPE_SOCKET_TIMEOUT = 2.0

#: Histogram buckets (seconds) for waits and holds: from a few milliseconds to an hour, since
#: task bodies run from milliseconds (a cache refresh) to an hour (a nightly report).
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, float("inf"),
)  # fmt: skip

#: Fleet count field -> (counter name without ``_total``, help). Duplicates are apart: one
#: counter labelled by outcome.
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("ran", "tasklock_task_runs", "Task bodies run (under the lock, or without one)."),
    ("waited", "tasklock_task_waits", "Calls that waited for a running duplicate to finish."),
    ("retries", "tasklock_task_retries", "Calls sent again for later (duplicates, rate limits)."),
    ("lost", "tasklock_task_lost", "Holds whose lock was lost while the body ran."),
    ("backend_errors", "tasklock_task_backend_errors", "Calls failed: lock store unreachable."),
    ("ran_unlocked", "tasklock_task_unlocked_runs", "Bodies run without the lock (store down)."),
    ("enqueue_dedupes", "tasklock_task_enqueue_dedupes", "Enqueues dropped as already pending."),
    ("rate_limited", "tasklock_task_rate_limited", "Calls held back by the task's rate limit."),
)
#: Duplicate outcomes always exported (zero when none), so each task has the same series.
_DUPLICATE_OUTCOMES = ("skip", "raise", "retry")


def _targets(target: Any) -> list[Any]:
    """``target`` as a list of URLs and clients; a URL that is not one is refused now, at
    start-up, rather than at every scrape."""
    items = [target] if isinstance(target, str) or not isinstance(target, Sequence) else target
    if not items:
        raise ValueError("Collector needs at least one Redis URL or client")
    for item in items:
        backend = backend_for(item)
        if not backend.keeps_counts:
            raise ValueError(
                f"tasks on {backend.name} keep their counts in process only (no fleet counts to "
                "collect): use instrument() in their workers instead"
            )
        if isinstance(item, str):
            validate_url(item, "url")
    return list(items)


class Collector:
    """A prometheus_client collector of the fleet's counts and held locks, read at each scrape.

    ``target``: a Redis URL or client, or several (Redlock's masters). ``prefix``: the task
    layer's key prefix (``key_prefix``). ``match``: a SCAN glob for the locks to list (default
    every key: narrow it, e.g. ``"tasklock:*"``, on a Redis with many keys, since each scrape
    scans them). Each scrape costs one pipelined read of the counts and a SCAN per Redis.
    """

    def __init__(self, target: Any, *, prefix: str = "tasklock", match: str | None = None) -> None:
        self._targets = _targets(target)
        self._clients_made: list[Any] | None = None
        self.prefix = prefix
        self.match = "*" if match is None else match
        self._errors = 0
        self._failing = False
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        """Nothing: registering the collector must not scrape Redis (prometheus_client calls
        ``collect`` to learn names only when ``describe`` is missing)."""
        return []

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        up = 1
        families: list[Metric] = []
        try:
            clients = self._clients()
            counts = fleet.merge([self._read(client) for client in clients])
            holds = self._holds(clients)
        except Exception as exc:
            # Partial counts would look like a counter reset to rate(): export none this time.
            up = 0
            with self._lock:
                self._errors += 1
                first = not self._failing
                self._failing = True
            if first:
                log.warning("tasklock exporter: could not read Redis (tasklock_up 0): %s", exc)
        else:
            families.extend(_count_families(counts))
            families.extend(_hold_families(holds, counts, time.time()))
            with self._lock:
                if self._failing:
                    log.info("tasklock exporter: Redis answers again (tasklock_up 1)")
                self._failing = False
        yield from families
        yield GaugeMetricFamily(
            "tasklock_up", "1 if every Redis answered this scrape, else 0.", value=up
        )
        yield CounterMetricFamily(
            "tasklock_scrape_errors",
            "Scrapes that could not read Redis, since this collector started.",
            value=self._errors,
        )
        yield GaugeMetricFamily(
            "tasklock_scrape_duration_seconds",
            "Seconds this scrape spent reading Redis.",
            value=time.monotonic() - started,
        )

    def _clients(self) -> list[Any]:
        """Clients for the URLs, made at the first scrape that can (a Redis Cluster client
        connects when made: an unreachable cluster is a scrape with ``tasklock_up 0``)."""
        if self._clients_made is None:
            self._clients_made = [
                client_for_url(t, socket_timeout=SCRAPE_SOCKET_TIMEOUT) if isinstance(t, str) else t
                for t in self._targets
            ]
        return self._clients_made

    def _read(self, client: Any) -> dict[str, dict[str, int]]:
        return fleet.read_counts(client, self.prefix, "total")

    def _holds(self, clients: Iterable[Any]) -> dict[tuple[str, str], LockInfo]:
        """Every hold once: a Redlock hold is on a majority of the masters, under one key and
        token (each master appends its own fence)."""
        holds: dict[tuple[str, str], LockInfo] = {}
        for client in clients:
            for info in [*list_locks(client, self.match), *list_permits(client, self.match)]:
                holds.setdefault((info.key, info.holder.token), info)
        return holds


def _count_families(counts: dict[str, dict[str, int]]) -> Iterator[Metric]:
    tasks = sorted(counts)
    for field, name, text in _COUNTERS:
        family = CounterMetricFamily(name, text, labels=["task"])
        for task in tasks:
            family.add_metric([task], counts[task].get(field, 0))
        yield family
    duplicates = CounterMetricFamily(
        "tasklock_task_duplicates",
        "Calls that found their duplicate running, by the outcome applied.",
        labels=["task", "outcome"],
    )
    for task in tasks:
        found = {f[len("duplicates_") :] for f in counts[task] if f.startswith("duplicates_")}
        for outcome in sorted(found | set(_DUPLICATE_OUTCOMES)):
            duplicates.add_metric([task, outcome], counts[task].get(f"duplicates_{outcome}", 0))
    yield duplicates
    waited = CounterMetricFamily(
        "tasklock_task_wait_seconds",
        "Seconds calls spent waiting for a running duplicate.",
        labels=["task"],
    )
    for task in tasks:
        waited.add_metric([task], counts[task].get("wait_us", 0) / 1_000_000)
    yield waited


def _hold_families(
    holds: dict[tuple[str, str], LockInfo], counts: dict[str, dict[str, int]], now: float
) -> Iterator[Metric]:
    # Every counted task has a held count, 0 when idle: a series that drops to 0 is plainer to
    # graph and alert on than one that vanishes. An age exists only while something is held.
    held = dict.fromkeys(counts, 0)
    oldest: dict[str, float] = {}
    for info in holds.values():
        task = info.task_name or ""
        held[task] = held.get(task, 0) + 1
        if info.acquired_at is not None:
            # The holder's clock: a host ahead of this one must not give a negative age.
            age = max(0.0, now - info.acquired_at)
            oldest[task] = max(oldest.get(task, 0.0), age)
    family = GaugeMetricFamily(
        "tasklock_held_locks",
        "Locks and Semaphore permits held now, by holder task ('' when not a task's).",
        labels=["task"],
    )
    for task in sorted(held):
        family.add_metric([task], held[task])
    yield family
    family = GaugeMetricFamily(
        "tasklock_oldest_hold_age_seconds",
        "Age of the oldest hold, by holder task, by the holder's clock.",
        labels=["task"],
    )
    for task in sorted(oldest):
        family.add_metric([task], oldest[task])
    yield family


def serve(
    urls: list[str],
    port: int,
    addr: str = "127.0.0.1",
    prefix: str = "tasklock",
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Serve a :class:`Collector` of ``urls`` on ``http://addr:port/metrics`` until Ctrl-C
    (``tasklock exporter``). A registry of its own: the exporter's metrics are the fleet's,
    not this process's Python runtime. ``on_listening`` runs once the address is bound (an
    address in use raises OSError first)."""
    registry = CollectorRegistry()
    registry.register(Collector(list(urls), prefix=prefix))
    server, thread = start_http_server(port, addr=addr, registry=registry)
    log.info("tasklock exporter: serving http://%s:%s/metrics", addr, port)
    if on_listening is not None:
        on_listening()
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()


# -- in-process histograms -------------------------------------------------------------------
class _Hold:
    __slots__ = ("_child", "_started")

    def __init__(self, child: Any) -> None:
        self._child = child
        self._started = time.monotonic()

    def done(self, error: BaseException | None) -> None:
        self._child.observe(time.monotonic() - self._started)


class _Scope:
    __slots__ = ("_observer", "_task")

    def __init__(self, observer: _Observer, task: str) -> None:
        self._observer = observer
        self._task = task

    def done(self, outcome: str, waited: float, fence: int | None) -> None:
        self._observer.wait_child(self._task, outcome).observe(waited)

    def hold(self) -> observe.HoldScope:
        return _Hold(self._observer.hold_child(self._task))


class _Observer:
    """Records into two histograms; label children are cached so a call costs a dict lookup,
    not prometheus_client's label validation."""

    def __init__(self, registry: CollectorRegistry, buckets: Sequence[float]) -> None:
        self.registry = registry
        self.waits = Histogram(
            "tasklock_acquire_wait_seconds",
            "Seconds the task layer waited for its execution lock, by outcome (0 when it did "
            "not wait).",
            ["task", "outcome"],
            buckets=buckets,
            registry=registry,
        )
        self.holds = Histogram(
            "tasklock_hold_seconds",
            "Seconds task bodies held their execution lock.",
            ["task"],
            buckets=buckets,
            registry=registry,
        )
        self._waits: dict[tuple[str, str], Any] = {}
        self._holds: dict[str, Any] = {}

    def acquiring(self, task: str, lock: str) -> observe.AcquireScope:
        return _Scope(self, task)

    def wait_child(self, task: str, outcome: str) -> Any:
        child = self._waits.get((task, outcome))
        if child is None:
            child = self._waits[(task, outcome)] = self.waits.labels(task, outcome)
        return child

    def hold_child(self, task: str) -> Any:
        child = self._holds.get(task)
        if child is None:
            child = self._holds[task] = self.holds.labels(task)
        return child


_instrumented: dict[int, _Observer] = {}
_instrument_lock = threading.Lock()


def instrument(
    registry: CollectorRegistry | None = None, buckets: Sequence[float] = DEFAULT_BUCKETS
) -> _Observer:
    """Record ``tasklock_acquire_wait_seconds`` and ``tasklock_hold_seconds`` for every task
    in this process, into ``registry`` (prometheus_client's default one when None).

    Idempotent per registry (calling it at import of several task modules is fine); a second
    call's ``buckets`` are ignored. Returns the installed observer (for :func:`uninstrument`).
    """
    registry = REGISTRY if registry is None else registry
    with _instrument_lock:
        observer = _instrumented.get(id(registry))
        if observer is None or observer.registry is not registry:
            observer = _instrumented[id(registry)] = _Observer(registry, buckets)
            observe.install(observer)
        return observer


def uninstrument(registry: CollectorRegistry | None = None) -> None:
    """Stop recording into ``registry`` and unregister its histograms (tests; a reload)."""
    registry = REGISTRY if registry is None else registry
    with _instrument_lock:
        observer = _instrumented.pop(id(registry), None)
    if observer is not None and observer.registry is registry:
        observe.uninstall(observer)
        registry.unregister(observer.waits)
        registry.unregister(observer.holds)
