"""The task layer on ZooKeeper (``url="zookeeper://..."``): a singleton with fences from the
nodes' czxids, waiting and raising duplicates, limits, enqueue markers, ``Leader``, Django's
``TASKLOCK["URL"]``, and what ZooKeeper cannot serve refused at decoration."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tasklock import Leader, backends
from tasklock.errors import BackendUnavailable, ConfigurationError, DuplicateTask
from tasklock.guard import Guard
from tasklock.zookeeper.client import client_for
from tests.support.guarding import check_singleton
from tests.support.servers import free_port


def settle(account_id: int, fence_token: int | None = None) -> str:
    return f"settled {account_id} {fence_token}"


def guard_on(url: str, name: str = "app.settle", **options: Any) -> Guard:
    return Guard(settle, name, {"url": url, **options})


def run(guard: Guard, args: tuple[Any, ...], body: Any = None, task_id: str = "t1") -> Any:
    return guard.run(
        args,
        {},
        body or (lambda extra: settle(*args, **extra)),
        task_id=task_id,
        on_skip=lambda d: ("skipped", d),
        on_retry=lambda d: ("retry", d),
        duplicate_error=DuplicateTask,
    )


def test_singleton_skips_a_duplicate_and_fences_increase(url: str) -> None:
    guard = check_singleton(url, "app.zk_singleton")
    assert guard.lock_for("k").__class__.__module__ == "tasklock.zookeeper.lock"


def test_a_waiting_duplicate_runs_after_the_holder_and_raise_names_it(url: str) -> None:
    guard = guard_on(url, "app.zk_wait", on_duplicate="wait", wait_timeout=30, fencing=True)
    entered, finish = threading.Event(), threading.Event()
    results: list[Any] = []

    def holder_body(extra: dict[str, Any]) -> int:
        entered.set()
        assert finish.wait(30)
        return int(extra["fence_token"])

    holder = threading.Thread(
        target=lambda: results.append(run(guard, (1,), holder_body, "holder-task"))
    )
    holder.start()
    assert entered.wait(10)
    raising = guard_on(url, "app.zk_wait", on_duplicate="raise", fencing=True)
    with pytest.raises(DuplicateTask, match="task=holder-task"):
        run(raising, (1,), task_id="other")
    waiter = threading.Thread(target=lambda: results.append(run(guard, (1,), task_id="t2")))
    waiter.start()
    finish.set()
    holder.join(10)
    waiter.join(30)
    first, second = results
    assert int(second.split()[-1]) > first


def test_limit_lets_n_in_on_a_zookeeper_semaphore(url: str) -> None:
    guard = guard_on(url, "app.zk_limited", limit=2)
    holds = [guard.lock_for(guard.lock_key((9,), {}), f"t{i}") for i in range(3)]
    assert type(holds[0]).__name__ == "Semaphore"
    assert holds[0].acquire(blocking=False)
    assert holds[1].acquire(blocking=False)
    assert not holds[2].acquire(blocking=False)
    holds[0].release()
    holds[1].release()


def test_enqueue_markers_claim_renew_expire_and_clear(url: str) -> None:
    guard = guard_on(url, "app.zk_marked", dedupe_enqueue=True, pending_ttl=30)
    assert guard.claim_pending((3,), {}, "first") is None
    assert guard.claim_pending((3,), {}, "second") == "first"
    assert guard.claim_pending((3,), {}, "first") is None  # its own marker
    assert guard.keep_pending((3,), {}, "first") is True
    assert guard.keep_pending((3,), {}, "second") is False
    guard.clear_pending((3,), {}, "second")  # not its marker: nothing happens
    assert guard.claim_pending((3,), {}, "third") == "first"
    guard.clear_pending((3,), {}, "first")
    assert guard.claim_pending((3,), {}, "third") is None
    guard.clear_pending((3,), {}, "third")
    # A stale marker (its task no longer pending) is replaced.
    assert guard.claim_pending((4,), {}, "gone") is None
    assert guard.claim_pending((4,), {}, "new", is_pending=lambda tid: tid != "gone") is None
    guard.clear_pending((4,), {}, "new")


def test_an_expired_marker_counts_as_absent(url: str) -> None:
    markers = backends.markers_on(url)
    assert markers.claim("zk:marker:short", "old", 1, "testing") is None
    assert markers.claim("zk:marker:short", "new", 30_000, "testing") in (None, "old")
    client = client_for(url)
    path = client.path("tasklock", "markers", "zk%3Amarker%3Ashort")
    client.call("testing", "sync", path)
    # Past its 1 ms the old marker is replaced (the claim above, or this one).
    assert markers.claim("zk:marker:short", "new", 30_000, "testing") is None
    assert markers.delete_if("zk:marker:short", "new", "testing")


def test_unreachable_zookeeper_is_a_backend_error_or_runs_unlocked() -> None:
    dead = f"zookeeper://127.0.0.1:{free_port()}?session_timeout=1"
    with pytest.raises(BackendUnavailable, match="unreachable"):
        run(guard_on(dead, "app.zk_dead"), (1,))
    assert run(guard_on(dead, "app.zk_dead_run", on_backend_error="run"), (1,)) == (
        "settled 1 None"
    )


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"rate": "5/s"}, "rate with a zookeeper url is refused"),
        ({"url": "zookeeper://"}, "names no server"),
        ({"url": "zookeeper://h:99999"}, "is not host:port"),
        ({"url": None, "urls": ["zookeeper://a:2181", "redis://b:6379/0"]}, "mixes ZooKeeper"),
    ],
)
def test_what_zookeeper_cannot_serve_is_refused_at_decoration(
    options: dict[str, Any], words: str
) -> None:
    merged = {"url": "zookeeper://127.0.0.1:2181", **options}
    with pytest.raises(ConfigurationError, match=words):
        Guard(settle, "app.zk_refused", {k: v for k, v in merged.items() if v is not None})


def test_urls_listing_members_is_one_ensemble(url: str) -> None:
    host = url.removeprefix("zookeeper://").partition("?")[0]
    guard = Guard(settle, "app.zk_members", {"urls": [f"zookeeper://{host}"], "limit": 1})
    assert guard.options.urls is None
    assert guard.options.url == f"zookeeper://{host}"


def test_an_election_on_zookeeper(url: str) -> None:
    first, second = Leader(url, "cron:zk", ttl=1), Leader(url, "cron:zk", ttl=1)
    assert first.campaign()
    assert first.is_leader
    assert not second.campaign()
    term = first.fence
    elected = threading.Event()
    thread = threading.Thread(
        target=lambda: second.wait_for_leadership(timeout=20) and elected.set()
    )
    thread.start()
    first.resign()
    assert elected.wait(10)  # woken by the watch on the node before its own
    thread.join(10)
    assert second.fence is not None
    assert term is not None
    assert second.fence > term
    assert second.confirm()
    second.resign()


def test_django_tasklock_url_may_name_zookeeper(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.checks import run_checks
    from django.test import override_settings

    from tests.django_project import setup

    setup()
    for name in ("TASKLOCK_URL", "TASKLOCK_URLS", "TASKLOCK_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    zk = "zookeeper://zk1:2181,zk2:2181,zk3:2181/tasklock"
    with override_settings(TASKLOCK={"URL": zk, "TTL": 10}):
        assert not [m for m in run_checks(tags=["tasklock"]) if m.id != "tasklock.W001"]
        assert Guard(settle, "app.dj_zk", {}).options.url == zk
    with override_settings(TASKLOCK={"URL": zk, "RATE": "5/s"}):
        assert "tasklock.E016" in {m.id for m in run_checks(tags=["tasklock"])}


def test_ha_beat_elects_one_scheduler_on_zookeeper(
    url: str, redis_server: Any, tmp_path: Any
) -> None:
    from celery import Celery

    from tasklock.celery import LeaderScheduler

    def beat(number: int) -> LeaderScheduler:
        app = Celery("tl_zk_beat", broker=redis_server.url)
        app.conf.update(tasklock_url=url, tasklock_beat_ttl=1)
        return LeaderScheduler(app, schedule_filename=str(tmp_path / f"s{number}"), max_interval=1)

    first, second = beat(1), beat(2)
    try:
        assert type(first.leader._lock).__module__ == "tasklock.zookeeper.lock"
        first.tick()
        assert first.leader.is_leader
        second.tick()  # a standby: it waits for the leader's release, then campaigns again
        assert not second.leader.is_leader
        term = first.leader.fence
        first.close()  # resigns: the standby takes over at its next tick
        second.tick()
        assert second.leader.is_leader
        assert (second.leader.fence or 0) > (term or 0)
    finally:
        second.close()
