"""tasklock.prometheus on a real redis-server: the collector's output as Prometheus parses it
(fleet counts, held locks, an unreachable Redis), the exporter over HTTP, and the histograms in
process, in forked children and in a real `rq worker`'s work horses (multiprocess mode)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tasklock import fleet, observe, stats
from tasklock.guard import Guard
from tasklock.prometheus import Collector, instrument, uninstrument
from tests.support.guarding import hold_in_thread, run_call
from tests.support.polling import eventually
from tests.support.servers import RedisServer, free_port, start_servers

ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def settle(account_id: int, fence_token: int | None = None) -> str:
    return f"settled {account_id}"


def run(guard: Guard, args: tuple[Any, ...], body: Any = None, task_id: str = "t1") -> Any:
    return run_call(guard, args, body or (lambda extra: settle(*args)), task_id)


def parse(text: str) -> Samples:
    """Every sample of an exposition, by name and labels, through prometheus_client's parser."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(collector: Collector) -> Samples:
    registry = CollectorRegistry()
    registry.register(collector)
    return parse(generate_latest(registry).decode())


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture(autouse=True)
def written_first() -> None:
    fleet.flush()  # counts other tests left behind go to their own servers, not these


def test_fleet_counts_parse_and_add_up(r: redis.Redis, redis_server: RedisServer) -> None:
    skip = Guard(settle, "prom.skip", {"url": redis_server.url})
    retry = Guard(settle, "prom.retry", {"url": redis_server.url, "on_duplicate": "retry"})
    waits = Guard(settle, "prom.wait", {"url": redis_server.url, "on_duplicate": "wait"})
    for n in range(3):
        run(skip, (n,))
    done = hold_in_thread(skip, (1,))
    try:
        assert run(skip, (1,)) == run(skip, (1,)) == "skipped"
    finally:
        done()
    done = hold_in_thread(retry, (1,))
    try:
        assert run(retry, (1,)) == "retry"
    finally:
        done()
    done = hold_in_thread(waits, (1,))
    threading.Timer(0.2, done).start()  # the holder finishes while the other call waits
    assert run(waits, (1,), task_id="waiter") == "settled 1"
    fleet.flush()

    samples = scrape(Collector(redis_server.url))
    assert value(samples, "tasklock_up") == 1
    assert value(samples, "tasklock_scrape_errors_total") == 0
    assert value(samples, "tasklock_task_runs_total", task="prom.skip") == 4
    assert value(samples, "tasklock_task_duplicates_total", task="prom.skip", outcome="skip") == 2
    assert value(samples, "tasklock_task_duplicates_total", task="prom.skip", outcome="raise") == 0
    assert value(samples, "tasklock_task_duplicates_total", task="prom.retry", outcome="retry") == 1
    assert value(samples, "tasklock_task_retries_total", task="prom.retry") == 1
    assert value(samples, "tasklock_task_waits_total", task="prom.wait") == 1
    assert (value(samples, "tasklock_task_wait_seconds_total", task="prom.wait") or 0) > 0
    assert value(samples, "tasklock_task_runs_total", task="prom.wait") == 2
    for name in (
        "tasklock_task_lost_total",
        "tasklock_task_backend_errors_total",
        "tasklock_task_enqueue_dedupes_total",
        "tasklock_task_rate_limited_total",
        "tasklock_task_unlocked_runs_total",
    ):
        assert value(samples, name, task="prom.skip") == 0, name
    # Labels are task names (and outcomes), never a call's key.
    labels = {dict(key[1]).get("task") for key in samples if dict(key[1]).get("task")}
    assert labels == {"prom.skip", "prom.retry", "prom.wait"}
    assert value(samples, "tasklock_held_locks", task="prom.skip") == 0  # all released
    assert value(samples, "tasklock_oldest_hold_age_seconds", task="prom.skip") is None


def test_held_locks_and_the_oldest_hold_age(r: redis.Redis, redis_server: RedisServer) -> None:
    guard = Guard(settle, "prom.held", {"url": redis_server.url})
    done = [hold_in_thread(guard, (n,)) for n in range(2)]
    # One written as a holder on a host whose hold began two minutes ago, and a plain lock.
    meta = {"host": "web-1", "pid": 42, "at": time.time() - 120, "name": "prom.old"}
    r.set("tasklock:{prom.old}:lock:abc", f"{'0' * 32} {json.dumps(meta)}#7", px=60_000)
    ahead = {"host": "web-2", "pid": 44, "at": time.time() + 3600, "name": "prom.ahead"}
    r.set("tasklock:{prom.ahead}:lock:abc", f"{'2' * 32} {json.dumps(ahead)}#9", px=60_000)
    plain = {"host": "web-1", "pid": 43, "at": time.time()}
    r.set("report", f"{'1' * 32} {json.dumps(plain)}#8", px=60_000)
    try:
        samples = scrape(Collector(redis_server.url))
        narrowed = scrape(Collector(redis_server.url, match="tasklock:*"))
    finally:
        for finish in done:
            finish()
    assert value(samples, "tasklock_held_locks", task="prom.held") == 2
    assert value(samples, "tasklock_held_locks", task="prom.old") == 1
    assert value(samples, "tasklock_held_locks", task="") == 1  # not held by the task layer
    assert (value(samples, "tasklock_oldest_hold_age_seconds", task="prom.old") or 0) >= 120
    age = value(samples, "tasklock_oldest_hold_age_seconds", task="prom.held")
    assert age is not None
    assert age >= 0  # "at" is rounded to the millisecond, maybe up: clamped, never negative
    # A holder whose clock is ahead of this host's: an age of 0, not a negative one.
    assert value(samples, "tasklock_oldest_hold_age_seconds", task="prom.ahead") == 0
    assert value(narrowed, "tasklock_held_locks", task="") is None
    assert value(narrowed, "tasklock_held_locks", task="prom.held") == 2
    fleet.flush()
    after = scrape(Collector(redis_server.url))
    assert value(after, "tasklock_held_locks", task="prom.held") == 0  # released, still counted
    assert value(after, "tasklock_oldest_hold_age_seconds", task="prom.held") is None


def test_a_semaphores_permits_are_holds(r: redis.Redis, redis_server: RedisServer) -> None:
    guard = Guard(settle, "prom.limit", {"url": redis_server.url, "limit": 3})
    done = [hold_in_thread(guard, (1,)) for _ in range(2)]
    try:
        samples = scrape(Collector(redis_server.url))
    finally:
        for finish in done:
            finish()
    assert value(samples, "tasklock_held_locks", task="prom.limit") == 2


def test_redis_down_is_a_metric_not_a_failed_scrape(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    run(Guard(settle, "prom.down", {"url": redis_server.url}), (1,))
    fleet.flush()
    collector = Collector(dead)
    for scrapes in (1, 2):
        samples = scrape(collector)
        assert value(samples, "tasklock_up") == 0
        assert value(samples, "tasklock_scrape_errors_total") == scrapes
    # One master of two down: no partial sums (rate() would read a drop as a counter reset).
    samples = scrape(Collector([redis_server.url, dead]))
    assert value(samples, "tasklock_up") == 0
    assert not [key for key in samples if key[0] == "tasklock_task_runs_total"]
    assert value(scrape(Collector(redis_server.url)), "tasklock_up") == 1


def test_a_stalled_redis_answers_within_the_scrape(redis_server: RedisServer) -> None:
    redis_server.pause()
    try:
        samples = scrape(Collector(redis_server.url))
    finally:
        redis_server.resume()
    assert value(samples, "tasklock_up") == 0


def test_masters_are_summed_and_a_redlock_hold_is_one() -> None:
    with start_servers(3) as servers:
        urls = [server.url for server in servers]
        clients = [server.client() for server in servers]
        for client, runs in zip(clients, (1, 2, 0), strict=True):
            fleet.bind("prom.masters", client, "tasklock")  # as processes reaching each first
            for _ in range(runs):
                stats.increment("ran", "prom.masters")
            fleet.flush()
        guard = Guard(settle, "prom.redlock", {"urls": urls})
        done = hold_in_thread(guard, (1,))
        try:
            samples = scrape(Collector(urls))
            from_clients = scrape(Collector(clients))
        finally:
            done()
        fleet.flush()
    assert value(samples, "tasklock_task_runs_total", task="prom.masters") == 3
    assert value(samples, "tasklock_held_locks", task="prom.redlock") == 1
    assert value(from_clients, "tasklock_task_runs_total", task="prom.masters") == 3


def test_registering_does_not_scrape() -> None:
    touched: list[str] = []

    class Untouchable:
        def __getattr__(self, name: str) -> Any:
            touched.append(name)
            raise ConnectionError(f"{name}: not reachable")

    registry = CollectorRegistry(auto_describe=True)  # as prometheus_client's default one
    registry.register(Collector(Untouchable()))
    assert touched == []  # registering asked nothing of Redis
    assert value(parse(generate_latest(registry).decode()), "tasklock_up") == 0
    assert touched


def test_etcd_and_malformed_urls_are_refused_at_start() -> None:
    with pytest.raises(ValueError, match="etcd"):
        Collector("etcd://127.0.0.1:2379")
    with pytest.raises(ValueError):
        Collector("http://127.0.0.1:6379")


def test_the_exporter_serves_the_fleet_over_http(
    r: redis.Redis, redis_server: RedisServer, tmp_path: Path
) -> None:
    run(Guard(settle, "prom.http", {"url": redis_server.url}), (1,))
    fleet.flush()
    port = free_port()
    code = f"from tasklock.prometheus import serve; serve([{redis_server.url!r}], {port})"
    log = (tmp_path / "exporter.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}/metrics"

    def fetched() -> str | None:
        assert process.poll() is None, (tmp_path / "exporter.log").read_text()
        try:
            response = httpx.get(url, timeout=5)
        except httpx.TransportError:
            return None
        return response.text if response.status_code == 200 else None

    try:
        text = eventually(fetched, timeout=20, interval=0.05, what=url)
        assert text is not None
        samples = parse(text)
        assert value(samples, "tasklock_up") == 1
        assert value(samples, "tasklock_task_runs_total", task="prom.http") == 1
        assert not [key for key in samples if key[0].startswith("python_")]  # its own registry
        process.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop
        assert process.wait(20) == 0, (tmp_path / "exporter.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    yield registry
    uninstrument(registry)


def test_histograms_of_waits_and_holds(
    r: redis.Redis, redis_server: RedisServer, registry: CollectorRegistry
) -> None:
    observer = instrument(registry)
    assert instrument(registry) is observer  # idempotent: one set of histograms
    assert observe.installed().count(observer) == 1
    skip = Guard(settle, "prom.hist", {"url": redis_server.url})
    waits = Guard(settle, "prom.hwait", {"url": redis_server.url, "on_duplicate": "wait"})
    run(skip, (1,))
    with pytest.raises(ZeroDivisionError):
        run(skip, (2,), lambda extra: 1 / 0)
    done = hold_in_thread(skip, (3,))
    try:
        assert run(skip, (3,)) == "skipped"
    finally:
        done()
    done = hold_in_thread(waits, (1,))
    threading.Timer(0.2, done).start()
    assert run(waits, (1,), task_id="waiter") == "settled 1"

    samples = parse(generate_latest(registry).decode())
    wait = "tasklock_acquire_wait_seconds_count"
    assert value(samples, wait, task="prom.hist", outcome="acquired") == 3
    assert value(samples, wait, task="prom.hist", outcome="duplicate_skip") == 1
    assert value(samples, "tasklock_hold_seconds_count", task="prom.hist") == 3
    assert value(samples, wait, task="prom.hwait", outcome="acquired") == 2
    waited = value(
        samples, "tasklock_acquire_wait_seconds_sum", task="prom.hwait", outcome="acquired"
    )
    assert (waited or 0) > 0
    uninstrument(registry)
    assert observer not in observe.installed()
    run(skip, (4,))  # no longer recorded
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "tasklock_hold_seconds_count", task="prom.hist") is None


def multiprocess_samples(directory: Path) -> Samples:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return parse(generate_latest(registry).decode())


def test_histograms_from_prefork_children(redis_server: RedisServer, tmp_path: Path) -> None:
    """Celery prefork's shape: a parent that imported the tasks module, children forked from
    it that do the work and leave with os._exit. Their histograms add up in the directory."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.prometheus_jobs", redis_server.url, "prom.fork",
         "3", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    children = set(done.stdout.split())
    assert len(children) == 3
    written = {path.stem.rsplit("_", 1)[-1] for path in directory.glob("histogram_*.db")}
    assert children <= written  # each child its own file
    samples = multiprocess_samples(directory)
    assert value(samples, "tasklock_hold_seconds_count", task="prom.fork") == 6
    count = "tasklock_acquire_wait_seconds_count"
    assert value(samples, count, task="prom.fork", outcome="acquired") == 6


def test_histograms_from_rq_work_horses(
    r: redis.Redis, redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `rq worker`: each job runs in a work horse that imports the job's module (and so
    calls instrument()) after the fork, and leaves with os._exit after the job."""
    pytest.importorskip("rq")
    from rq import Queue
    from rq.job import JobStatus

    from tests.integration.rq.support import QUEUE, rq_workers, wait_status

    directory = tmp_path / "metrics"
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    monkeypatch.delenv("TASKLOCK_URL", raising=False)
    queue = Queue(QUEUE, connection=r)
    with rq_workers(redis_server.url, 1, tmp_path):
        jobs = [queue.enqueue("tests.integration.prometheus_jobs.timed", n) for n in range(4)]
        for job in jobs:
            assert wait_status(job, JobStatus.FINISHED, JobStatus.FAILED) is JobStatus.FINISHED
    samples = multiprocess_samples(directory)
    task = "tests.integration.prometheus_jobs.timed"
    assert value(samples, "tasklock_hold_seconds_count", task=task) == 4
    assert len(list(directory.glob("histogram_*.db"))) >= 2  # one horse per job, at least two


@pytest.mark.slow
def test_histograms_from_celery_prefork_children(
    r: redis.Redis, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A real ``celery worker --pool=prefork``: the parent imports the tasks module (and so calls
    instrument()) and forks its children, which run the tasks and record into their own files."""
    pytest.importorskip("celery")
    from celery import Celery

    from tests.integration.celery.support import WorkerProcess

    directory = tmp_path / "metrics"
    directory.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory), "TL_PROM_URL": redis_server.url}
    app = Celery("tl_prom_client", broker=redis_server.url, backend=redis_server.url)
    app.conf.update(task_default_queue="tl_prom", broker_connection_retry_on_startup=True)
    worker = WorkerProcess(
        "tests.integration.prometheus_jobs", env, tmp_path / "worker.log", concurrency=2
    )
    worker.start(app)
    try:
        results = [app.send_task("prom.celery_timed", args=(n,)) for n in range(6)]
        pids = {result.get(timeout=30) for result in results}
    finally:
        worker.stop()
    samples = multiprocess_samples(directory)
    assert value(samples, "tasklock_hold_seconds_count", task="prom.celery_timed") == 6
    count = "tasklock_acquire_wait_seconds_count"
    assert value(samples, count, task="prom.celery_timed", outcome="acquired") == 6
    written = {path.stem.rsplit("_", 1)[-1] for path in directory.glob("histogram_*.db")}
    assert {str(pid) for pid in pids} <= written  # the children's own files
