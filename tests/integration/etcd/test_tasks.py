"""The task layer on etcd: ``url="etcd://..."`` selects etcd for the execution lock (``limit``
too), ``on_duplicate``, the ``dedupe_enqueue`` markers and fencing, through the same
framework-free guard the Celery and RQ adapters use; and what etcd cannot serve is refused with
an error naming the option."""

from __future__ import annotations

import base64
import threading
from typing import Any

import httpx
import pytest

from tasklock import backends
from tasklock.errors import BackendUnavailable, ConfigurationError, DuplicateTask
from tasklock.etcd import backend as etcd_backend
from tasklock.guard import Guard
from tests.integration.etcd.conftest import EtcdServer
from tests.support.guarding import check_singleton
from tests.support.servers import free_port


def settle(account_id: int, fence_token: int | None = None) -> str:
    return f"settled {account_id} {fence_token}"


@pytest.fixture
def url(etcd: EtcdServer) -> str:
    return "etcd://" + etcd.url.removeprefix("http://")


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


def read_key(etcd: EtcdServer, key: str) -> dict[str, Any] | None:
    reply = httpx.post(
        f"{etcd.url}/v3/kv/range", json={"key": base64.b64encode(key.encode()).decode()}
    ).json()
    kvs = reply.get("kvs") or []
    return dict(kvs[0]) if kvs else None


def lease_ttl(etcd: EtcdServer, lease: str) -> int:
    reply = httpx.post(f"{etcd.url}/v3/lease/timetolive", json={"ID": lease}).json()
    return int(reply.get("TTL", -1))


def test_singleton_skips_a_duplicate_and_fences_increase(url: str) -> None:
    guard = check_singleton(url, "app.etcd_singleton")
    assert guard.lock_for("k").__class__.__module__ == "tasklock.etcd.lock"


def test_the_fence_is_etcds_revision_of_the_lock_key(url: str, etcd: EtcdServer) -> None:
    guard = guard_on(url, fencing=True)
    seen: dict[str, Any] = {}

    def body(extra: dict[str, Any]) -> int:
        seen["kv"] = read_key(etcd, guard.lock_key((7,), {}))
        return int(extra["fence_token"])

    fence = run(guard, (7,), body)
    assert int(seen["kv"]["create_revision"]) == fence
    assert '"name":"app.settle"' in base64.b64decode(seen["kv"]["value"]).decode()
    assert read_key(etcd, guard.lock_key((7,), {})) is None  # released after the body


def test_a_waiting_duplicate_runs_after_the_holder(url: str) -> None:
    guard = guard_on(url, on_duplicate="wait", wait_timeout=30, fencing=True)
    entered, finish = threading.Event(), threading.Event()
    results: list[Any] = []

    def holder_body(extra: dict[str, Any]) -> int:
        entered.set()
        assert finish.wait(30)
        return int(extra["fence_token"])

    holder = threading.Thread(target=lambda: results.append(run(guard, (1,), holder_body)))
    holder.start()
    assert entered.wait(10)
    waiter_done = threading.Event()
    waiter = threading.Thread(
        target=lambda: (results.append(run(guard, (1,), task_id="t2")), waiter_done.set())
    )
    waiter.start()
    assert not waiter_done.wait(0.3)  # it waits (the holder has not finished)
    finish.set()
    holder.join(10)
    waiter.join(30)
    first, second = results
    assert second == f"settled 1 {int(second.split()[-1])}"
    assert int(second.split()[-1]) > first


def test_raise_policy_names_the_holder(url: str) -> None:
    guard = guard_on(url, on_duplicate="raise")
    entered, finish = threading.Event(), threading.Event()

    def body(extra: dict[str, Any]) -> str:
        entered.set()
        assert finish.wait(30)
        return "held"

    holder = threading.Thread(target=run, args=(guard, (2,), body, "holder-task"))
    holder.start()
    try:
        assert entered.wait(10)
        with pytest.raises(DuplicateTask, match="task=holder-task"):
            run(guard, (2,), task_id="other")
    finally:
        finish.set()
        holder.join(10)


def test_enqueue_markers_claim_renew_and_clear(url: str, etcd: EtcdServer) -> None:
    guard = guard_on(url, dedupe_enqueue=True, pending_ttl=30)
    key = guard.pending_key((3,), {})
    assert guard.claim_pending((3,), {}, "first") is None
    assert guard.claim_pending((3,), {}, "second") == "first"
    assert guard.claim_pending((3,), {}, "first") is None  # its own marker
    kv = read_key(etcd, key)
    assert kv is not None
    assert base64.b64decode(kv["value"]) == b"first"
    old_lease = kv["lease"]
    assert guard.keep_pending((3,), {}, "first") is True
    renewed = read_key(etcd, key)
    assert renewed is not None
    assert renewed["lease"] != old_lease  # moved to a fresh lease
    assert lease_ttl(etcd, old_lease) == -1  # and the old one revoked
    assert guard.keep_pending((3,), {}, "second") is False  # names "first": left alone
    guard.clear_pending((3,), {}, "second")  # not its marker: nothing happens
    assert read_key(etcd, key) is not None
    guard.clear_pending((3,), {}, "first")
    assert read_key(etcd, key) is None
    assert lease_ttl(etcd, renewed["lease"]) == -1  # no lease left behind


def test_a_stale_marker_is_replaced(url: str) -> None:
    guard = guard_on(url, dedupe_enqueue=True)
    assert guard.claim_pending((4,), {}, "gone") is None
    assert guard.claim_pending((4,), {}, "new", is_pending=lambda tid: tid != "gone") is None
    assert guard.claim_pending((4,), {}, "third") == "new"
    guard.clear_pending((4,), {}, "new")


def test_a_marker_expires_with_its_lease(url: str, etcd: EtcdServer) -> None:
    guard = guard_on(url, dedupe_enqueue=True, pending_ttl=1)
    assert guard.claim_pending((5,), {}, "short") is None
    kv = read_key(etcd, guard.pending_key((5,), {}))
    assert kv is not None
    assert 0 < lease_ttl(etcd, kv["lease"]) <= 1


def test_until_start_clears_the_marker_when_the_body_begins(url: str, etcd: EtcdServer) -> None:
    guard = guard_on(url, dedupe_enqueue="until_start", on_duplicate="retry")
    assert guard.claim_pending((6,), {}, "queued") is None
    seen: list[Any] = []
    run(
        guard,
        (6,),
        lambda extra: seen.append(read_key(etcd, guard.pending_key((6,), {}))),
        "queued",
    )
    assert seen == [None]


def test_unreachable_etcd_is_a_backend_error_or_runs_unlocked() -> None:
    dead = f"etcd://127.0.0.1:{free_port()}"
    with pytest.raises(BackendUnavailable, match="etcd unreachable"):
        run(guard_on(dead, "app.dead"), (1,))
    assert run(guard_on(dead, "app.dead_run", on_backend_error="run"), (1,)) == "settled 1 None"
    with pytest.raises(BackendUnavailable, match="etcd unreachable"):
        guard_on(dead, "app.dead_marker", dedupe_enqueue=True).claim_pending((1,), {}, "x")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"rate": "5/s"}, "rate with an etcd url is refused"),
        ({"ttl": 0.5}, "etcd leases are whole seconds"),
        ({"url": "etcd://127.0.0.1:0"}, "invalid port"),
        ({"url": "etcd://"}, "empty host"),
        ({"url": None, "urls": ["etcd://a:2379", "redis://b:6379/0"]}, "mixes etcd and Redis"),
        ({"url": None, "urls": ["etcd://a:2379", "etcd://b:0"]}, "invalid port"),
    ],
)
def test_what_etcd_cannot_serve_is_refused_at_decoration(
    options: dict[str, Any], words: str
) -> None:
    merged = {"url": "etcd://127.0.0.1:2379", **options}
    with pytest.raises(ConfigurationError, match=words):
        Guard(settle, "app.refused", {k: v for k, v in merged.items() if v is not None})


def test_a_rate_refused_across_layers_names_both_sources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TASKLOCK_URL", "etcd://127.0.0.1:2379")
    guard = Guard(settle, "app.rated", {"rate": "5/s"})
    with pytest.raises(ConfigurationError, match=r"rate='5/s' \(task options\).*environment"):
        _ = guard.options


def test_urls_listing_etcd_members_is_one_etcd_cluster(url: str) -> None:
    dead = f"etcd://127.0.0.1:{free_port()}"
    guard = Guard(settle, "app.members", {"urls": [dead, url], "fencing": True, "limit": 1})
    assert guard.options.urls is None
    assert guard.options.url == f"{dead},{url}"
    assert guard.options.sources["url"] == "task options"
    # The first member refuses connections: the request moves on to the next one.
    assert run(guard, (1,)).startswith("settled 1 ")
    with pytest.raises(ConfigurationError, match="rate with an etcd url"):
        Guard(settle, "app.members_rated", {"urls": [url], "rate": "1/s"})


def test_the_etcd_client_is_shared_per_url(url: str) -> None:
    assert etcd_backend.client(url) is etcd_backend.client(url)
    assert backends.markers_on(url) is backends.markers_on(url)


def test_limit_runs_n_at_once_on_etcd_and_excludes_the_lock(url: str) -> None:
    guard = guard_on(url, "app.limited", limit=2, fencing=True)
    assert type(guard.lock_for("k")).__name__ == "Semaphore"
    entered = [threading.Event(), threading.Event()]
    finish = threading.Event()
    fences: list[int] = []

    def body(index: int) -> Any:
        def held(extra: dict[str, Any]) -> str:
            fences.append(int(extra["fence_token"]))
            entered[index].set()
            assert finish.wait(30)
            return "held"

        return held

    threads = [
        threading.Thread(target=run, args=(guard, (9,), body(i), f"holder-{i}")) for i in range(2)
    ]
    for thread in threads:
        thread.start()
    try:
        assert all(event.wait(10) for event in entered)  # two at once
        skipped = run(guard, (9,), task_id="third")
        assert skipped[0] == "skipped"
        assert "task=holder-" in skipped[1].holder
        # The same task moved to limit=1 (a rolling deployment): its Lock sees the permits.
        assert run(guard_on(url, "app.limited", fencing=True), (9,))[0] == "skipped"
    finally:
        finish.set()
        for thread in threads:
            thread.join(10)
    assert len(set(fences)) == 2
    later = run(guard, (9,), lambda extra: extra["fence_token"], "last")
    assert later > max(fences)
