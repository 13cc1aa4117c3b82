"""tasklock.opentelemetry with the real SDK (an in-memory exporter) on a real redis-server: the
spans of the framework-free guard (attributes, status, parentage); an RQ SimpleWorker with and
without a span around the job (the module docstring's recipe); a real in-process Celery worker
with ``opentelemetry-instrumentation-celery`` on, whose task span is the parent of tasklock's;
and a ``celery worker --pool=prefork`` whose children set tracing up in ``worker_process_init``
exactly as the module docstring says (they write their spans to JSON lines the test reads).

The tracer provider is passed to :func:`tasklock.opentelemetry.instrument` (and to
``CeleryInstrumentor``) rather than set globally: the global provider can be set only once per
process, and other tests must not inherit it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import tasklock.opentelemetry as tl_otel
from tasklock import fleet, observe
from tasklock.core.keys import wake_channel
from tasklock.errors import BackendUnavailable
from tasklock.guard import Guard
from tests.support.guarding import hold_in_thread, run_call
from tests.support.polling import eventually
from tests.support.servers import RedisServer, free_port, start_servers

ROOT = Path(__file__).resolve().parents[2]


def settle(account_id: int, fence_token: int | None = None) -> str:
    return f"settled {account_id}"


def run(guard: Guard, args: tuple[Any, ...], body: Any = None, task_id: str = "t1") -> Any:
    return run_call(guard, args, body or (lambda extra: settle(*args, **extra)), task_id)


class Traces:
    """A provider whose finished spans land in memory, and helpers to read them."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def children(self, parent: ReadableSpan, name: str | None = None) -> list[ReadableSpan]:
        """The finished spans whose parent is ``parent`` (same trace, its span id)."""
        ctx = parent.get_span_context()
        assert ctx is not None
        return [
            s
            for s in self.spans(name)
            if s.parent is not None
            and s.parent.span_id == ctx.span_id
            and s.get_span_context().trace_id == ctx.trace_id  # type: ignore[union-attr]
        ]

    def one(self, name: str) -> ReadableSpan:
        [span] = self.spans(name)
        return span


@pytest.fixture(autouse=True)
def counts_written() -> Iterator[None]:
    """Write the fleet counts the test made while its server still runs: counts left for a
    server that is gone are retried (and warned about) in the background for the rest of the
    session, which later tests that assert on tasklock's warnings would see."""
    yield
    fleet.flush()


@pytest.fixture(scope="module")
def module_traces() -> Traces:
    return Traces()


@pytest.fixture
def traces(module_traces: Traces) -> Iterator[Traces]:
    """Instrumented with the module's provider, its exporter emptied; uninstrumented after."""
    module_traces.exporter.clear()
    tl_otel.instrument(tracer_provider=module_traces.provider)
    yield module_traces
    tl_otel.uninstrument()
    assert not tl_otel.instrumented()


def test_acquire_and_hold_are_children_of_the_current_span(
    r: redis.Redis, redis_server: RedisServer, traces: Traces
) -> None:
    guard = Guard(settle, "otel.settle", {"url": redis_server.url, "fencing": True})
    fences: list[int] = []

    def body(extra: dict[str, Any]) -> str:
        fences.append(extra["fence_token"])
        with traces.tracer.start_as_current_span("body.work"):
            return settle(7, **extra)

    with traces.tracer.start_as_current_span("outer") as outer:
        assert run(guard, (7,), body) == "settled 7"
        # The hold's context is detached when the body ends: the caller's span is current again.
        assert trace.get_current_span() is outer

    outer_span = traces.one("outer")
    [acquire] = traces.children(outer_span, tl_otel.ACQUIRE_SPAN)
    [hold] = traces.children(outer_span, tl_otel.HOLD_SPAN)
    [work] = traces.children(hold, "body.work")
    assert work is traces.one("body.work")
    [fence] = fences
    assert dict(acquire.attributes or {}) == {
        "tasklock.task": "otel.settle",
        "tasklock.lock.name": guard.lock_key((7,), {}),
        "tasklock.outcome": "acquired",
        "tasklock.waited": 0.0,
        "tasklock.fence": fence,
    }
    assert isinstance((acquire.attributes or {})["tasklock.waited"], float)
    assert dict(hold.attributes or {}) == {
        "tasklock.task": "otel.settle",
        "tasklock.lock.name": guard.lock_key((7,), {}),
        "tasklock.outcome": "acquired",
        "tasklock.fence": fence,
    }
    assert acquire.status.status_code is StatusCode.UNSET
    assert hold.status.status_code is StatusCode.UNSET
    assert acquire.instrumentation_scope is not None
    assert acquire.instrumentation_scope.name == "tasklock"


def test_a_duplicate_has_an_acquire_span_and_no_hold(
    r: redis.Redis, redis_server: RedisServer, traces: Traces
) -> None:
    guard = Guard(settle, "otel.dup", {"url": redis_server.url, "fencing": True})
    done = hold_in_thread(guard, (1,))
    try:
        with traces.tracer.start_as_current_span("outer"):
            assert run(guard, (1,)) == "skipped"
    finally:
        done()
    outer = traces.one("outer")
    [acquire] = traces.children(outer, tl_otel.ACQUIRE_SPAN)
    assert (acquire.attributes or {})["tasklock.outcome"] == "duplicate_skip"
    assert "tasklock.fence" not in (acquire.attributes or {})
    assert acquire.status.status_code is StatusCode.UNSET
    assert traces.children(outer, tl_otel.HOLD_SPAN) == []
    # The holder (its own thread, no span current there) made a root acquire and hold.
    holds = traces.spans(tl_otel.HOLD_SPAN)
    assert len(holds) == 1
    assert holds[0].parent is None


def test_a_wait_is_measured_in_seconds(
    r: redis.Redis, redis_server: RedisServer, traces: Traces
) -> None:
    guard = Guard(settle, "otel.wait", {"url": redis_server.url, "on_duplicate": "wait"})
    done = hold_in_thread(guard, (1,))
    results: list[str] = []
    waiter = threading.Thread(target=lambda: results.append(run(guard, (1,), task_id="waiter")))
    try:
        waiter.start()
        channel = wake_channel(guard.lock_key((1,), {}))
        eventually(lambda: r.pubsub_numsub(channel)[0][1] > 0, what="the waiter waiting")
    finally:
        done()
        waiter.join(20)
    assert results == ["settled 1"]
    waited: list[float] = []
    for span in traces.spans(tl_otel.ACQUIRE_SPAN):
        assert (span.attributes or {})["tasklock.outcome"] == "acquired"
        value = (span.attributes or {})["tasklock.waited"]
        assert isinstance(value, float)
        waited.append(value)
    holder, waiter_waited = sorted(waited)
    assert holder == 0.0  # the holder did not wait
    assert waiter_waited > 0.0  # the waiter did (it was seen subscribed before the release)


def test_an_exception_in_the_body_marks_the_hold_as_an_error(
    r: redis.Redis, redis_server: RedisServer, traces: Traces
) -> None:
    guard = Guard(settle, "otel.fails", {"url": redis_server.url})
    with traces.tracer.start_as_current_span("outer") as outer:
        with pytest.raises(ZeroDivisionError):
            run(guard, (1,), lambda extra: 1 / 0)
        assert trace.get_current_span() is outer
    hold = traces.one(tl_otel.HOLD_SPAN)
    assert hold.status.status_code is StatusCode.ERROR
    assert hold.status.description == "ZeroDivisionError: division by zero"
    [event] = [e for e in hold.events if e.name == "exception"]
    assert (event.attributes or {})["exception.type"] == "ZeroDivisionError"
    # The acquire succeeded: the failure is the body's, not the lock's.
    assert traces.one(tl_otel.ACQUIRE_SPAN).status.status_code is StatusCode.UNSET


def test_celery_control_flow_is_not_an_error(
    r: redis.Redis, redis_server: RedisServer, traces: Traces
) -> None:
    exceptions = pytest.importorskip("celery.exceptions")
    guard = Guard(settle, "otel.retry", {"url": redis_server.url})

    def body(extra: dict[str, Any]) -> str:
        raise exceptions.Retry("again later")

    with pytest.raises(exceptions.Retry):
        run(guard, (1,), body)
    hold = traces.one(tl_otel.HOLD_SPAN)
    assert hold.status.status_code is StatusCode.UNSET
    assert not [e for e in hold.events if e.name == "exception"]
    assert (hold.attributes or {})["tasklock.control_flow"] == "celery.exceptions.Retry"


def test_an_unreachable_store_is_an_error_or_an_unlocked_hold(
    r: redis.Redis, redis_server: RedisServer, traces: Traces
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(BackendUnavailable):
        run(Guard(settle, "otel.dead", {"url": dead}), (1,))
    acquire = traces.one(tl_otel.ACQUIRE_SPAN)
    assert (acquire.attributes or {})["tasklock.outcome"] == "backend_error"
    assert acquire.status.status_code is StatusCode.ERROR
    assert traces.spans(tl_otel.HOLD_SPAN) == []

    traces.exporter.clear()
    unlocked = Guard(settle, "otel.dead_run", {"url": dead, "on_backend_error": "run"})
    assert run(unlocked, (1,)) == "settled 1"
    acquire = traces.one(tl_otel.ACQUIRE_SPAN)
    assert (acquire.attributes or {})["tasklock.outcome"] == "ran_unlocked"
    assert acquire.status.status_code is StatusCode.UNSET
    hold = traces.one(tl_otel.HOLD_SPAN)
    assert (hold.attributes or {})["tasklock.outcome"] == "ran_unlocked"
    for task in ("otel.dead", "otel.dead_run"):  # their counts: to a server that answers
        fleet.bind(task, r, "tasklock")


def test_an_interrupted_acquire_is_an_error(
    r: redis.Redis, redis_server: RedisServer, traces: Traces, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception that lands during the acquire (a time limit, Ctrl-C) fails the acquire span."""

    class Interrupt(BaseException):
        pass

    guard = Guard(settle, "otel.interrupted", {"url": redis_server.url})

    def interrupted(key: str, task_id: str | None) -> Any:
        raise Interrupt

    monkeypatch.setattr(guard, "lock_for", interrupted)
    with pytest.raises(Interrupt):
        run(guard, (1,))
    acquire = traces.one(tl_otel.ACQUIRE_SPAN)
    assert (acquire.attributes or {})["tasklock.outcome"] == "interrupted"
    assert acquire.status.status_code is StatusCode.ERROR
    assert traces.spans(tl_otel.HOLD_SPAN) == []


def test_instrument_is_idempotent_and_uninstrument_stops_the_spans(
    r: redis.Redis, redis_server: RedisServer, traces: Traces
) -> None:
    guard = Guard(settle, "otel.once", {"url": redis_server.url})
    tl_otel.instrument(tracer_provider=traces.provider)
    tl_otel.instrument()  # no provider: keeps the one in effect
    run(guard, (1,))
    assert len(traces.spans(tl_otel.ACQUIRE_SPAN)) == 1
    assert len(traces.spans(tl_otel.HOLD_SPAN)) == 1

    # Another provider replaces the first: one observer, spans only to the new provider.
    other = Traces()
    tl_otel.instrument(tracer_provider=other.provider)
    run(guard, (2,))
    assert len(traces.spans(tl_otel.ACQUIRE_SPAN)) == 1
    assert len(other.spans(tl_otel.ACQUIRE_SPAN)) == 1
    assert len(observe.installed()) == 1

    tl_otel.uninstrument()
    tl_otel.uninstrument()  # twice is harmless
    assert not tl_otel.instrumented()
    assert observe.installed() == ()
    run(guard, (3,))
    assert len(other.spans()) == 2
    assert len(traces.spans()) == 2


def test_without_opentelemetry_the_import_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"  # as if opentelemetry-api were not installed
        "import tasklock.opentelemetry\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert "pip install 'tasklock[opentelemetry]'" in done.stderr


# -- RQ (no official instrumentation): children of whatever span is current ------------------


def test_rq_jobs_are_children_of_a_span_the_worker_starts(
    r: redis.Redis, redis_server: RedisServer, traces: Traces
) -> None:
    """The docstring's RQ recipe: without a span around the job, tasklock's spans are roots; a
    worker class that starts one (and flushes, for forking workers) gathers them under it."""
    rq = pytest.importorskip("rq")
    from tasklock.guard import reset_all
    from tests.integration.rq import jobs
    from tests.integration.rq.support import InProcessWorker

    tracer, provider = traces.tracer, traces.provider

    class TracedWorker(InProcessWorker):
        def perform_job(self, job: Any, queue: Any, *args: Any, **kwargs: Any) -> bool:
            with tracer.start_as_current_span(f"rq.job/{job.func_name}"):
                try:
                    return bool(super().perform_job(job, queue, *args, **kwargs))
                finally:
                    provider.force_flush()

    reset_all()  # the jobs' guards resolve their options (the job's connection) anew
    try:
        queue = rq.Queue("tasklock-otel", connection=r)
        queue.enqueue(jobs.bare, "plain")
        assert InProcessWorker([queue], connection=r).work(burst=True)
        roots = traces.spans(tl_otel.ACQUIRE_SPAN) + traces.spans(tl_otel.HOLD_SPAN)
        assert len(roots) == 2
        assert all(span.parent is None for span in roots)

        traces.exporter.clear()
        queue.enqueue(jobs.bare, "traced")
        assert TracedWorker([queue], connection=r).work(burst=True)
    finally:
        reset_all()
    job_span = traces.one("rq.job/tests.integration.rq.jobs.bare")
    [acquire] = traces.children(job_span, tl_otel.ACQUIRE_SPAN)
    [hold] = traces.children(job_span, tl_otel.HOLD_SPAN)
    assert (acquire.attributes or {})["tasklock.task"] == "tests.integration.rq.jobs.bare"
    assert (hold.attributes or {})["tasklock.outcome"] == "acquired"


# -- a real Celery worker ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def celery_traces() -> Iterator[tuple[Traces, Any]]:
    """An in-process Celery worker with CeleryInstrumentor and tasklock's spans on one provider,
    on a redis-server of its own (the guard tests' ``r`` flushes theirs, which would drop kombu's
    queue bindings)."""
    pytest.importorskip("celery")
    instrumentation = pytest.importorskip("opentelemetry.instrumentation.celery")
    from tests.integration.celery import otel_app
    from tests.integration.celery.support import configure, in_process_worker

    found = Traces()
    otel_app.TRACER = found.tracer
    instrumentor = instrumentation.CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=found.provider)
    tl_otel.instrument(tracer_provider=found.provider)
    try:
        with start_servers(1) as [server]:
            configure(otel_app.app, server.url, task_default_queue="tl_otel_tests")
            with in_process_worker(otel_app.app):
                yield found, otel_app
            fleet.flush()  # while the server runs (see counts_written)
    finally:
        tl_otel.uninstrument()
        instrumentor.uninstrument()


def run_span(traces: Traces, task_name: str, task_id: str) -> ReadableSpan:
    """The worker's ``run/<task name>`` span of task ``task_id`` (ended after the result is
    stored: waited for)."""

    def find() -> ReadableSpan | None:
        for span in traces.spans(f"run/{task_name}"):
            if (span.attributes or {}).get("messaging.message.id") == task_id:
                return span
        return None

    span = eventually(find, what=f"the run span of {task_id}")
    assert span is not None
    return span


def test_the_celery_task_span_is_the_parent(celery_traces: tuple[Traces, Any]) -> None:
    traces, otel_app = celery_traces
    traces.exporter.clear()
    result = otel_app.traced.delay(3)
    fence = result.get(timeout=20)
    assert isinstance(fence, int)

    run = run_span(traces, "otel.traced", result.id)
    [acquire] = traces.children(run, tl_otel.ACQUIRE_SPAN)
    [hold] = traces.children(run, tl_otel.HOLD_SPAN)
    [work] = traces.children(hold, "body.work")
    assert (acquire.attributes or {})["tasklock.outcome"] == "acquired"
    assert (acquire.attributes or {})["tasklock.task"] == "otel.traced"
    assert (acquire.attributes or {})["tasklock.fence"] == fence
    assert (hold.attributes or {})["tasklock.fence"] == fence
    assert (work.attributes or {})["fence"] == fence
    assert hold.status.status_code is StatusCode.UNSET
    # The task's span itself continues the producer's trace (apply_async/<name> in this thread).
    [publish] = traces.spans("apply_async/otel.traced")
    assert run.parent is not None
    assert run.parent.span_id == publish.get_span_context().span_id  # type: ignore[union-attr]


def test_a_celery_duplicate_has_no_hold_under_its_task_span(
    celery_traces: tuple[Traces, Any],
) -> None:
    from tasklock.celery import DUPLICATE

    traces, otel_app = celery_traces
    traces.exporter.clear()
    holder = otel_app.traced.delay(4, gate="dup")
    try:
        assert otel_app.GATES["dup:entered"].wait(20)
        twin = otel_app.traced.delay(4)
        # Skipped: a state of its own, not a ready one (get() would wait for ever).
        eventually(lambda: twin.state == DUPLICATE, timeout=20, what="the twin skipped")
    finally:
        otel_app.GATES["dup:finish"].set()
    assert isinstance(holder.get(timeout=20), int)

    twin_run = run_span(traces, "otel.traced", twin.id)
    [acquire] = traces.children(twin_run, tl_otel.ACQUIRE_SPAN)
    assert (acquire.attributes or {})["tasklock.outcome"] == "duplicate_skip"
    assert traces.children(twin_run, tl_otel.HOLD_SPAN) == []
    holder_run = run_span(traces, "otel.traced", holder.id)
    assert len(traces.children(holder_run, tl_otel.HOLD_SPAN)) == 1


def test_a_failing_celery_task_marks_its_hold(celery_traces: tuple[Traces, Any]) -> None:
    traces, otel_app = celery_traces
    traces.exporter.clear()
    result = otel_app.failing.delay(5)
    with pytest.raises(ValueError):
        result.get(timeout=20)
    run = run_span(traces, "otel.failing", result.id)
    [hold] = traces.children(run, tl_otel.HOLD_SPAN)
    assert hold.status.status_code is StatusCode.ERROR
    assert run.status.status_code is StatusCode.ERROR  # Celery's instrumentation agrees


# -- ``celery worker --pool=prefork``, set up as tasklock.opentelemetry's docstring says ----------


@pytest.fixture(scope="module")
def prefork(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """A prefork worker of ``otel_app`` (its children trace to JSON lines in the directory), and
    a client app on its redis-server."""
    pytest.importorskip("opentelemetry.instrumentation.celery")
    celery = pytest.importorskip("celery")
    from tests.integration.celery.otel_app import PREFORK_QUEUE
    from tests.integration.celery.support import WorkerProcess, configure

    directory = tmp_path_factory.mktemp("otel")
    with start_servers(1) as [server]:
        client = configure(celery.Celery("tl_otel_client", set_as_current=False), server.url)
        env = {"TL_OTEL_URL": server.url, "TL_OTEL_DIR": str(directory)}
        process = WorkerProcess(
            "tests.integration.celery.otel_app",
            env,
            directory / "worker.log",
            concurrency=2,
            queues=PREFORK_QUEUE,
        )
        try:
            process.start(client)
            yield directory, client
        finally:
            process.stop()


def written_spans(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("spans-*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def test_a_prefork_child_traces_as_the_docstring_says(prefork: tuple[Path, Any]) -> None:
    from tests.integration.celery.otel_app import PREFORK_QUEUE

    directory, client = prefork
    result = client.send_task("otel.traced", args=(8,), queue=PREFORK_QUEUE)
    fence = result.get(timeout=30)
    assert isinstance(fence, int)

    def run_span() -> list[dict[str, Any]]:
        return [
            s
            for s in written_spans(directory)
            if s["name"] == "run/otel.traced"
            and s["attributes"].get("messaging.message.id") == result.id
        ]

    [run] = eventually(run_span, timeout=20, what="the task's span written by the pool child")
    spans = written_spans(directory)

    def children(parent: dict[str, Any], name: str) -> list[dict[str, Any]]:
        return [
            s
            for s in spans
            if s["name"] == name
            and s["parent_id"] == parent["span_id"]
            and s["trace_id"] == parent["trace_id"]
        ]

    [acquire] = children(run, tl_otel.ACQUIRE_SPAN)
    [hold] = children(run, tl_otel.HOLD_SPAN)
    [work] = children(hold, "body.work")
    assert acquire["attributes"]["tasklock.outcome"] == "acquired"
    assert acquire["attributes"]["tasklock.fence"] == hold["attributes"]["tasklock.fence"] == fence
    assert work["attributes"]["fence"] == fence
    assert run["pid"] == acquire["pid"] == hold["pid"] != os.getpid()  # a pool child
