"""A singleton call skipped as a duplicate inside a workflow (chain, ``link=``, ``link_error=``, a
group inside a chain) fails visibly instead of dropping the rest: real in-process workers, on a
Redis broker and, where the machine has one, on RabbitMQ (the same tests, one worker per broker).

The twin is a real call of the same task, running in the worker until the test lets it finish
(:class:`Gates`: the worker is a thread of this process), so the skipped link meets a real holder.
Every ``get()`` has a timeout: before the fix these waited for ever.
"""

from __future__ import annotations

import gc
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, chain, group
from celery.exceptions import ChordError
from celery.result import AsyncResult

from tasklock.celery import DUPLICATE, singleton_task
from tasklock.core.keys import wake_channel
from tasklock.errors import DuplicateTask
from tests.integration.celery.support import (
    Gates,
    clear_tasklock_keys,
    configure,
    in_process_worker,
)
from tests.support.polling import eventually
from tests.support.servers import RedisServer

pytestmark = pytest.mark.timeout(120)

#: How long a test waits for a workflow's outcome (the outcome comes in well under a second).
OUTCOME = 20


class Workflows:
    """One app on one broker, with the tasks the tests chain together."""

    def __init__(self, broker: str) -> None:
        self.broker = broker
        self.queue = f"tl-workflows-{broker}-{uuid.uuid4().hex[:8]}"
        self.parked = f"{self.queue}-parked"  # no worker consumes it
        self.app = app = Celery(f"tl_workflows_{broker}", set_as_current=False)
        self.gates = Gates()
        self.runs: list[tuple[Any, ...]] = []  # (task, argument) of every body that ran
        runs, gates = self.runs, self.gates

        def held(name: str, account: int, gate: str | None) -> int:
            runs.append((name, account))
            if gate:
                gates[f"{gate}:entered"].set()
                assert gates[f"{gate}:finish"].wait(60), "the test never let the body finish"
            return account

        @singleton_task(app=app, name=f"{broker}.skip", key=["account"], shared=False)
        def skip(account: int, gate: str | None = None) -> int:
            return held("skip", account, gate)

        @singleton_task(
            app=app, name=f"{broker}.wait", key=["account"], on_duplicate="wait",
            wait_timeout=30, shared=False,
        )  # fmt: skip
        def wait(account: int, gate: str | None = None) -> int:
            return held("wait", account, gate)

        @singleton_task(app=app, name=f"{broker}.deduped", dedupe_enqueue=True, shared=False)
        def deduped(account: int) -> int:
            runs.append(("deduped", account))
            return account

        @app.task(name=f"{broker}.add", shared=False)
        def add(a: int, b: int) -> int:
            runs.append(("add", (a, b)))
            return a + b

        @app.task(name=f"{broker}.collect", shared=False)
        def collect(results: list[Any]) -> list[Any]:
            runs.append(("collect", tuple(results)))
            return results

        @app.task(name=f"{broker}.errback", shared=False)
        def errback(task_id: str) -> None:
            runs.append(("errback", task_id))

        self.skip, self.wait, self.deduped = skip, wait, deduped
        self.add, self.collect, self.errback = add, collect, errback

    def ran(self, task: str) -> list[Any]:
        return [argument for name, argument in list(self.runs) if name == task]

    def start_holder(self, task: Any, account: int, gate: str) -> AsyncResult[Any]:
        """Send a call that holds its lock until :meth:`finish`; return once its body runs."""
        result: AsyncResult[Any] = task.delay(account, gate=gate)
        assert self.gates[f"{gate}:entered"].wait(OUTCOME), "the holder never started"
        return result

    def finish(self, gate: str) -> None:
        self.gates[f"{gate}:finish"].set()

    def errbacks_for(self, task_id: str) -> None:
        eventually(
            lambda: task_id in self.ran("errback"),
            timeout=OUTCOME,
            what=f"the errback called for {task_id}",
        )


BROKERS = [
    "redis",
    pytest.param(
        "rabbitmq",
        marks=[
            pytest.mark.rabbitmq,
        ],
    ),
]


@pytest.fixture(scope="module", params=BROKERS)
def wf(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Workflows]:
    """A worker per broker; results and locks always in the module's redis-server."""
    workflows = Workflows(request.param)
    app = workflows.app
    if workflows.broker == "redis":
        configure(app, redis_server.url, task_default_queue=workflows.queue)
        worker_options: dict[str, Any] = {}
    else:
        app.conf.update(
            broker_url=request.getfixturevalue("rabbitmq_url"),
            result_backend=redis_server.url,
            tasklock_url=redis_server.url,  # the broker is not Redis: the lock's Redis is explicit
            task_default_queue=workflows.queue,
            broker_connection_retry_on_startup=True,
            worker_hijack_root_logger=False,
            result_expires=600,
            broker_heartbeat=2,  # wakes the AMQP event loop every second: a quick teardown
        )
        worker_options = {"without_heartbeat": False}
    try:
        with in_process_worker(app, **worker_options):
            yield workflows
    finally:
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            for queue in (workflows.queue, workflows.parked):
                if workflows.broker == "rabbitmq":
                    channel.queue_delete(queue)
                else:
                    channel.queue_purge(queue)
        # Results the worker made (errbacks sent, chains failed) become garbage with it; one
        # collected after the server is gone would unsubscribe from it in __del__ and retry for
        # half a minute. Collect them while the server still answers.
        gc.collect()


def forget_never_run(result: Any) -> None:
    """Stop waiting for results that will never come (the members of a group after a failed
    link): left pending in this process's result backend, they would be collected after the
    module's server is gone and try to unsubscribe from it for half a minute each."""
    result.forget()


@pytest.fixture
def rc(redis_server: RedisServer, wf: Workflows) -> Iterator[redis.Redis]:
    client = redis_server.client()
    clear_tasklock_keys(client)
    wf.runs.clear()
    yield client
    client.close()


# -- chains ----------------------------------------------------------------------------------------
def test_a_skipped_link_fails_the_chain_and_runs_its_errbacks(
    wf: Workflows, rc: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: ``chain(t.si(50), add.si(1, 2))()`` while ``t(50)`` runs. The skipped
    link fails with DuplicateTask, Celery marks the rest of the chain failed with it and calls
    the errbacks; ``get()`` raises instead of waiting for ever, and ``add`` never runs."""
    holder = wf.start_holder(wf.skip, 50, "chain")
    try:
        with caplog.at_level(logging.WARNING, logger="tasklock"):
            result = chain(wf.skip.si(50), wf.add.si(1, 2)).apply_async(link_error=wf.errback.s())
            with pytest.raises(DuplicateTask, match="same key is running") as info:
                result.get(timeout=OUTCOME)
            wf.errbacks_for(result.parent.id)
    finally:
        wf.finish("chain")
    assert holder.id in str(info.value.holder)
    assert result.parent.state == "FAILURE"
    assert isinstance(result.parent.result, DuplicateTask)
    assert holder.get(timeout=OUTCOME) == 50
    assert wf.ran("skip") == [50]  # the holder only
    assert wf.ran("add") == []
    assert any("inside a chain" in r.getMessage() for r in caplog.records)


def test_a_skipped_last_link_fails_the_chain(wf: Workflows, rc: redis.Redis) -> None:
    """Nothing follows the last link, but the chain's result is that link's: it fails too, so
    ``get()`` on the chain raises rather than waiting on a DUPLICATE state."""
    holder = wf.start_holder(wf.skip, 51, "last")
    try:
        result = chain(wf.add.si(1, 1), wf.skip.si(51)).apply_async()
        with pytest.raises(DuplicateTask):
            result.get(timeout=OUTCOME)
    finally:
        wf.finish("last")
    assert result.parent.get(timeout=OUTCOME) == 2
    holder.get(timeout=OUTCOME)
    assert wf.ran("skip") == [51]


def test_wait_runs_the_rest_of_the_chain_after_the_twin(wf: Workflows, rc: redis.Redis) -> None:
    """The other way to keep a chain whole: on_duplicate="wait" (or "retry") runs the link once
    the twin is done, and the chain goes on from there."""
    holder = wf.start_holder(wf.wait, 52, "wait")
    try:
        result = chain(wf.wait.si(52), wf.add.si(2, 3)).apply_async()
        channel = wake_channel(wf.wait.tasklock_guard.lock_key((52,), {}))
        eventually(lambda: rc.pubsub_numsub(channel)[0][1] > 0, what="the link waiting")
        assert wf.ran("add") == []
    finally:
        wf.finish("wait")
    assert result.get(timeout=OUTCOME) == 5
    assert holder.get(timeout=OUTCOME) == 52
    assert wf.ran("wait") == [52, 52]


# -- link= and link_error= -----------------------------------------------------------------------
def test_a_skipped_call_with_link_fails_instead_of_dropping_the_callback(
    wf: Workflows, rc: redis.Redis
) -> None:
    holder = wf.start_holder(wf.skip, 53, "link")
    try:
        result = wf.skip.apply_async((53,), link=wf.add.si(4, 5))
        with pytest.raises(DuplicateTask):
            result.get(timeout=OUTCOME)
    finally:
        wf.finish("link")
    assert result.state == "FAILURE"
    holder.get(timeout=OUTCOME)
    assert wf.ran("add") == []  # Celery runs link= callbacks on success only


def test_a_skipped_call_with_link_error_calls_the_errback(wf: Workflows, rc: redis.Redis) -> None:
    holder = wf.start_holder(wf.skip, 54, "link_error")
    try:
        result = wf.skip.apply_async((54,), link_error=wf.errback.s())
        wf.errbacks_for(result.id)
        with pytest.raises(DuplicateTask):
            result.get(timeout=OUTCOME)
    finally:
        wf.finish("link_error")
    holder.get(timeout=OUTCOME)


def test_a_plain_skip_is_still_the_duplicate_state(wf: Workflows, rc: redis.Redis) -> None:
    """Nothing attached to the call: the skip stays a skip (DUPLICATE, no error)."""
    holder = wf.start_holder(wf.skip, 55, "plain")
    try:
        twin = wf.skip.delay(55)
        eventually(lambda: twin.state == DUPLICATE, timeout=OUTCOME, what="the DUPLICATE state")
    finally:
        wf.finish("plain")
    holder.get(timeout=OUTCOME)


# -- groups inside chains --------------------------------------------------------------------------
# Celery warns that errbacks on a chord's header will change; these tests only need the link's own.
@pytest.mark.filterwarnings("ignore:task_allow_error_cb_on_chord_header")
def test_a_skipped_link_before_a_group_fails_what_follows(wf: Workflows, rc: redis.Redis) -> None:
    """``chain(t, group(...), collect)``: the group and the step after it become a chord, which
    Celery fails with the link's error; the group's members never run."""
    holder = wf.start_holder(wf.skip, 56, "before_group")
    try:
        result = chain(
            wf.skip.si(56), group(wf.add.si(1, 2), wf.add.si(3, 4)), wf.collect.s()
        ).apply_async(link_error=wf.errback.s())
        with pytest.raises(DuplicateTask):
            result.get(timeout=OUTCOME)
        first = result
        while first.parent is not None:
            first = first.parent
        wf.errbacks_for(first.id)
    finally:
        wf.finish("before_group")
    holder.get(timeout=OUTCOME)
    assert wf.ran("add") == []
    assert wf.ran("collect") == []
    forget_never_run(result)


def test_a_skipped_link_before_a_final_group_runs_the_errbacks(
    wf: Workflows, rc: redis.Redis
) -> None:
    """``chain(t, group(...))`` ending in the group: the errbacks run and the link's own result
    raises. (The group's result itself is not marked: Celery does the same for any failed link
    before a final group, so wait on the link or use an errback.)"""
    holder = wf.start_holder(wf.skip, 57, "final_group")
    try:
        result = chain(wf.skip.si(57), group(wf.add.si(1, 2), wf.add.si(3, 4))).apply_async(
            link_error=wf.errback.s()
        )
        link = result.parent
        assert link is not None
        wf.errbacks_for(link.id)
        with pytest.raises(DuplicateTask):
            link.get(timeout=OUTCOME)
    finally:
        wf.finish("final_group")
    holder.get(timeout=OUTCOME)
    assert wf.ran("add") == []
    forget_never_run(result)


def test_a_skipped_member_of_a_group_inside_a_chain_fails_the_chain(
    wf: Workflows, rc: redis.Redis
) -> None:
    """``chain(group(t, b), collect)``: the group is a chord header, so the skipped member fails,
    the chord's callback fails with ChordError, and so does the chain.

    (The group comes first so that the chord is applied here, not by the worker: a chord applied
    in a worker thread leaves its header's results pending in that thread's result backend, which
    Celery's threads pool keeps after the worker stops, past the end of this module's server.)"""
    holder = wf.start_holder(wf.skip, 58, "group_member")
    try:
        result = chain(group(wf.skip.si(58), wf.add.si(3, 4)), wf.collect.s()).apply_async()
        with pytest.raises((ChordError, DuplicateTask)):
            result.get(timeout=OUTCOME)
        eventually(lambda: result.state == "FAILURE", timeout=OUTCOME, what="the chain failed")
    finally:
        wf.finish("group_member")
    holder.get(timeout=OUTCOME)
    assert "DuplicateTask" in str(result.result)
    assert wf.ran("collect") == []


# -- dedupe_enqueue --------------------------------------------------------------------------------
def test_dedupe_enqueue_never_swallows_the_last_link_of_a_chain(
    wf: Workflows, rc: redis.Redis
) -> None:
    """The worker sends a chain's last link with ``chain=[]``: that call belongs to the chain
    (which waits for its id) as much as the first, so it is sent even while a twin is pending."""
    parked = wf.deduped.apply_async((59,), queue=wf.parked)  # a pending twin that never runs
    assert wf.deduped.apply_async((59,)).id == parked.id  # deduplicated, as a plain call
    result = chain(wf.add.si(1, 1), wf.deduped.si(59)).apply_async()
    assert result.get(timeout=OUTCOME) == 59
    assert result.id != parked.id
    assert wf.ran("deduped") == [59]
