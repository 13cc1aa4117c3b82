"""The Celery app of the OpenTelemetry real-worker tests
(``tests/integration/test_opentelemetry.py``), in two modes:

* in-process (a thread of the test's process): the test configures the app
  (:func:`tests.integration.celery.support.configure`), instruments with its own provider and sets
  :data:`TRACER`, so the spans land in the test's in-memory exporter;
* ``celery -A tests.integration.celery.otel_app worker --pool=prefork`` (a subprocess), configured
  from the environment: ``TL_OTEL_URL`` (broker, results, locks) and ``TL_OTEL_DIR``. Each pool
  child sets up tracing in ``worker_process_init``, as :mod:`tasklock.opentelemetry`'s docstring
  says to (``CeleryInstrumentor().instrument()`` and ``tasklock.opentelemetry.instrument()``), and
  writes every span it ends as a JSON line to ``<TL_OTEL_DIR>/spans-<pid>.jsonl`` for the test to
  read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_init
from opentelemetry import trace

import tasklock.opentelemetry
from tasklock.celery import singleton_task
from tests.integration.celery.support import Gates

URL = os.environ.get("TL_OTEL_URL")
DIRECTORY = os.environ.get("TL_OTEL_DIR")
#: The queue of the prefork worker (the in-process worker's is the test's own).
PREFORK_QUEUE = "tl_otel_prefork"

app = Celery("tl_otel_tests", set_as_current=False)
if URL is not None:
    app.conf.update(
        broker_url=URL,
        result_backend=URL,
        broker_connection_retry_on_startup=True,
        task_default_queue=PREFORK_QUEUE,
        worker_prefetch_multiplier=1,
        result_expires=600,
    )
GATES = Gates()
#: The tracer of bodies' own spans (a non-recording one until the test or the pool child sets it).
TRACER: trace.Tracer = trace.NoOpTracer()


@singleton_task(app=app, name="otel.traced", key=["account"], fencing=True)
def traced(account: int, gate: str | None = None, fence_token: int | None = None) -> Any:
    """A body that starts a span of its own (a child of the hold), optionally held on a gate."""
    with TRACER.start_as_current_span("body.work", attributes={"fence": fence_token or -1}):
        if gate:
            GATES[f"{gate}:entered"].set()
            assert GATES[f"{gate}:finish"].wait(30), "the test never let the body finish"
    return fence_token


@singleton_task(app=app, name="otel.failing", key=["account"])
def failing(account: int) -> Any:
    raise ValueError(f"account {account} failed")


def span_line(span: Any) -> str:
    """One finished span as a JSON line: what the test checks (names, ids, attributes)."""
    context = span.get_span_context()
    return (
        json.dumps(
            {
                "name": span.name,
                "trace_id": f"{context.trace_id:032x}",
                "span_id": f"{context.span_id:016x}",
                "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                "attributes": dict(span.attributes or {}),
                "status": span.status.status_code.name,
                "pid": os.getpid(),
            }
        )
        + "\n"
    )


if DIRECTORY is not None:
    SPANS = Path(DIRECTORY)

    @worker_process_init.connect(weak=False)
    def init_tracing(*args: Any, **kwargs: Any) -> None:
        """The docstring's recipe, in each pool child after the fork."""
        global TRACER
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

        out = (SPANS / f"spans-{os.getpid()}.jsonl").open("a")
        provider = TracerProvider()
        provider.add_span_processor(
            SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=span_line))
        )
        CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
        tasklock.opentelemetry.instrument(tracer_provider=provider)
        TRACER = provider.get_tracer("tests")
