"""SingletonTask / @singleton_task without a worker: decoration-time validation, the default Redis,
configuration precedence, direct calls, ``apply()`` and ``task_always_eager``.

A "twin" here is a real tasklock lock held in the test's redis-server on the key the task computes,
exactly as a running twin in another worker would hold it.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, Task
from celery.exceptions import Ignore

import tasklock
from tasklock import stats
from tasklock.celery import SingletonTask, singleton_task
from tasklock.core.lock import Lock
from tasklock.errors import ConfigurationError, DuplicateTask, KeyEncodingError
from tasklock.guard import reset_all
from tests.integration.celery.support import clear_tasklock_keys, configure
from tests.support.servers import RedisServer


@pytest.fixture
def rc(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    clear_tasklock_keys(client)
    yield client
    client.close()


@pytest.fixture
def app(redis_server: RedisServer) -> Iterator[Celery]:
    app = configure(Celery(f"api{id(object())}", set_as_current=False), redis_server.url)
    yield app
    reset_all()


def hold_twin(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Lock:
    """Hold the lock of ``task(*args, **kwargs)`` as a twin running elsewhere would."""
    guard = task.tasklock_guard
    lock = guard.lock_for(guard.lock_key(args, kwargs or {}), task_id="twin-elsewhere")
    assert lock.acquire(blocking=False)
    return lock  # type: ignore[return-value]


# -- decoration time ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"on_duplicate": "ignore"}, "on_duplicate"),
        ({"ttl": 0}, "ttl"),
        ({"ttl": -5}, "ttl"),
        ({"key": ["acount_id"]}, "acount_id"),
        ({"fencing": True}, "fence_token"),
        ({"fencing": "token"}, "token"),
        ({"wait_timeout": -1}, "wait_timeout"),
        ({"on_duplicat": "raise"}, "on_duplicate"),  # a near-miss typo, not a Celery attribute
        ({"url": "http://localhost"}, "url"),
    ],
)
def test_bad_options_fail_at_decoration(app: Celery, options: dict[str, Any], names: str) -> None:
    def settle(account_id: int, day: str = "today") -> None: ...

    with pytest.raises(ConfigurationError, match=names):
        singleton_task(app=app, shared=False, **options)(settle)
    with pytest.raises(ConfigurationError, match=names):
        singleton_task(**options)(settle)  # shared-task form validates as early


def test_bad_options_via_app_task_fail_when_celery_creates_the_class(app: Celery) -> None:
    # A finalized app creates the task class at decoration. (shared=False: a shared task with bad
    # options would be re-created, and fail, in every app finalized later in this process.)
    app.finalize()

    with pytest.raises(ConfigurationError, match="on_duplicate"):

        @app.task(base=SingletonTask, tasklock={"on_duplicate": "sometimes"}, shared=False)
        def settle(account_id: int) -> None: ...

    with pytest.raises(ConfigurationError, match="must be a dict"):

        @app.task(base=SingletonTask, tasklock=["ttl", 3], shared=False)
        def rebuild(report_id: int) -> None: ...


def test_lazy_app_validates_at_finalize(redis_server: RedisServer) -> None:
    app = configure(Celery("lazy", set_as_current=False), redis_server.url)

    @app.task(base=SingletonTask, tasklock={"ttl": 0}, shared=False)
    def settle(account_id: int) -> None: ...

    with pytest.raises(ConfigurationError, match="ttl"):
        app.finalize()


def test_base_must_be_a_singleton_task(app: Celery) -> None:
    class Other(Task):  # type: ignore[type-arg]
        pass

    with pytest.raises(ConfigurationError, match="SingletonTask"):
        singleton_task(app=app, base=Other, shared=False)(lambda x: x)


def test_bound_task_signature_excludes_self(app: Celery) -> None:
    with pytest.raises(ConfigurationError, match="'self'"):

        @singleton_task(app=app, shared=False, bind=True, key=["self"])
        def rebuild(self: Any, report_id: int) -> None: ...

    @singleton_task(app=app, shared=False, bind=True, key=["report_id"], fencing=True)
    def rebuild_ok(self: Any, report_id: int, fence_token: int | None = None) -> int | None:
        return fence_token

    assert rebuild_ok.tasklock_guard.call_key.canonical((7,), {}) == '{"report_id":7}'


def test_celery_options_pass_through_and_duplicate_task_is_expected(app: Celery) -> None:
    @singleton_task(app=app, shared=False, name="api.custom", max_retries=7, acks_late=True, ttl=12)
    def custom(x: int) -> int:
        return x

    assert custom.name == "api.custom"
    assert custom.max_retries == 7
    assert custom.acks_late is True
    assert custom.tasklock == {"ttl": 12}
    assert DuplicateTask in custom.throws
    assert isinstance(custom, SingletonTask)


def test_tasklock_dicts_merge_along_the_class_hierarchy(app: Celery) -> None:
    class Quiet(SingletonTask):
        tasklock = {"on_duplicate": "raise", "ttl": 9}

    @app.task(base=Quiet, tasklock={"ttl": 4}, shared=False)
    def merged(x: int) -> int:
        return x

    options = merged.tasklock_guard.options
    assert (options.on_duplicate, options.ttl) == ("raise", 4.0)


def test_shared_form_registers_on_every_app(redis_server: RedisServer, rc: redis.Redis) -> None:
    @singleton_task
    def shared_settle(x: int) -> int:
        return x * 2

    app = configure(Celery("shared", set_as_current=False), redis_server.url)
    app.finalize()
    task = app.tasks[f"{__name__}.shared_settle"]
    assert isinstance(task, SingletonTask)
    assert task.apply((21,)).get() == 42


# -- where the lock lives ------------------------------------------------------------------------
def test_default_redis_is_the_redis_broker(app: Celery, rc: redis.Redis) -> None:
    @singleton_task(app=app, shared=False)
    def uses_broker(x: int) -> list[bytes]:
        return sorted(rc.keys("tasklock:*:lock:*"))

    assert len(uses_broker(1)) == 1


@pytest.mark.parametrize(
    ("broker", "message"),
    [
        ("amqp://guest:secret@rabbit:5672//", "amqp://guest:\\*\\*@rabbit"),
        ("redis://a:6379/0;redis://b:6379/0", "several brokers"),
        ("sentinel://s1:26379", "not a redis:// or rediss://"),
    ],
)
def test_no_redis_is_a_clear_error(broker: str, message: str, monkeypatch: Any) -> None:
    monkeypatch.delenv("TASKLOCK_URL", raising=False)
    monkeypatch.delenv("TASKLOCK_URLS", raising=False)
    app = Celery("noredis", broker=broker, set_as_current=False)

    @singleton_task(app=app, shared=False)
    def needs_redis(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match=message) as info:
        needs_redis(1)
    assert "tasklock_url" in str(info.value)
    assert "secret" not in str(info.value)


def test_configuration_precedence(
    redis_server: RedisServer, rc: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """task options > Celery app.conf (tasklock_*) > environment > defaults, seen in Redis."""
    app = configure(Celery("prec", set_as_current=False), "redis://127.0.0.1:1/0")
    seen: list[tuple[str, int]] = []

    def record() -> None:
        (key,) = rc.keys("*:lock:*")
        seen.append((key.decode().split(":", 1)[0], rc.pttl(key)))

    @singleton_task(app=app, shared=False, key_prefix="from-task")
    def explicit(x: int) -> None:
        record()

    @singleton_task(app=app, shared=False)
    def implicit(x: int) -> None:
        record()

    monkeypatch.setenv("TASKLOCK_URL", redis_server.url)  # the broker above is a dead port
    monkeypatch.setenv("TASKLOCK_KEY_PREFIX", "from-env")
    app.conf.tasklock_key_prefix = "from-conf"
    app.conf.tasklock_ttl = 7
    explicit(1)
    implicit(1)
    app.conf.tasklock_key_prefix = None
    reset_all()
    implicit(1)
    monkeypatch.delenv("TASKLOCK_KEY_PREFIX")
    app.conf.tasklock_ttl = None
    reset_all()
    implicit(1)
    assert [prefix for prefix, _ in seen] == ["from-task", "from-conf", "from-env", "tasklock"]
    assert [6000 < pttl <= 7000 for _, pttl in seen] == [True, True, True, False]
    assert implicit.tasklock_guard.options.sources["key_prefix"] == "defaults"


def test_django_style_namespace(redis_server: RedisServer, rc: redis.Redis) -> None:
    class Settings:
        CELERY_BROKER_URL = redis_server.url
        CELERY_TASKLOCK_ON_DUPLICATE = "raise"
        CELERY_TASKLOCK_TTL = 11

    app = Celery("django_style", set_as_current=False)
    app.config_from_object(Settings, namespace="CELERY")

    @singleton_task(app=app, shared=False)
    def from_settings(x: int) -> int:
        return x

    options = from_settings.tasklock_guard.options
    assert (options.on_duplicate, options.ttl) == ("raise", 11.0)
    assert options.sources["ttl"] == "Celery app.conf"


def test_app_conf_errors_name_the_source(app: Celery) -> None:
    app.conf.tasklock_on_duplicate = "never"

    @singleton_task(app=app, shared=False)
    def misconfigured(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match="Celery app.conf.*on_duplicate"):
        misconfigured(1)


# -- direct calls --------------------------------------------------------------------------------
def test_direct_call_takes_the_lock(app: Celery, rc: redis.Redis) -> None:
    @singleton_task(app=app, shared=False, fencing=True)
    def direct(x: int, fence_token: int | None = None) -> tuple[int, bool]:
        held = bool(rc.exists(direct.tasklock_guard.lock_key((x,), {})))
        return fence_token or 0, held

    first, held = direct(1)
    assert held
    assert first > 0
    assert direct(x=1)[0] > first
    assert not rc.keys("*:lock:*")


def test_direct_call_duplicate_skips_raises_and_run_bypasses(
    app: Celery, rc: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    @singleton_task(app=app, shared=False)
    def skipper(x: int) -> int:
        calls.append(x)
        return x

    @singleton_task(app=app, shared=False, on_duplicate="raise")
    def raiser(x: int) -> int:
        return x

    @singleton_task(app=app, shared=False, on_duplicate="retry")
    def retrier(x: int) -> int:
        return x

    twins = [hold_twin(skipper, (1,)), hold_twin(raiser, (1,)), hold_twin(retrier, (1,))]
    try:
        with caplog.at_level(logging.INFO, logger="tasklock"):
            assert skipper(1) is None
        assert calls == []
        assert any("holder" in r.getMessage() and "skip" in r.getMessage() for r in caplog.records)
        with pytest.raises(DuplicateTask, match="same key is running"):
            raiser(1)
        with pytest.raises(DuplicateTask):  # a direct call cannot be retried
            retrier(1)
        assert skipper.run(1) == 1  # the raw function: no lock
        assert skipper(2) == 2  # another key
    finally:
        for twin in twins:
            twin.release()


def test_unencodable_argument_is_named(app: Celery) -> None:
    @singleton_task(app=app, shared=False)
    def settle(account: Any, day: str = "today") -> None: ...

    with pytest.raises(KeyEncodingError, match="argument 'account'.*object"):
        settle(object())
    with pytest.raises(KeyEncodingError, match=r"argument 'account'\[1\].*float"):
        settle([1, float("nan")])


def test_key_equivalence_of_call_shapes(app: Celery) -> None:
    @singleton_task(app=app, shared=False)
    def shaped(a: int, b: tuple[int, int] = (1, 2), *, c: dict[str, int] | None = None) -> None: ...

    guard = shaped.tasklock_guard
    key = guard.lock_key((1,), {})
    assert guard.lock_key((), {"a": 1}) == key
    assert guard.lock_key((1, [1, 2]), {"c": None}) == key
    assert guard.lock_key((1,), {"c": {"x": 1, "y": 2}}) == guard.lock_key(
        (1,), {"c": {"y": 2, "x": 1}}
    )
    assert guard.lock_key((2,), {}) != key


# -- apply() and task_always_eager ---------------------------------------------------------------
def test_apply_runs_like_a_worker(app: Celery, rc: redis.Redis) -> None:
    @singleton_task(app=app, shared=False, fencing=True)
    def eager(x: int, fence_token: int | None = None) -> int | None:
        return fence_token

    @singleton_task(app=app, shared=False, on_duplicate="raise")
    def eager_raise(x: int) -> int:
        return x

    first = eager.apply((1,)).get()
    assert eager.apply((1,)).get() > first
    twin = hold_twin(eager, (1,))
    twin2 = hold_twin(eager_raise, (1,))
    try:
        skipped = eager.apply((1,))
        assert skipped.state == "IGNORED"  # Celery's eager result for Ignore; nothing stored
        assert isinstance(skipped.result, Ignore)
        assert "holder" in str(skipped.result)
        failed = eager_raise.apply((1,))
        assert failed.state == "FAILURE"
        assert isinstance(failed.result, DuplicateTask)
        with pytest.raises(DuplicateTask):
            eager_raise.apply((1,), throw=True)
    finally:
        twin.release()
        twin2.release()


def test_always_eager_goes_through_the_lock(redis_server: RedisServer, rc: redis.Redis) -> None:
    app = configure(Celery("eager", set_as_current=False), redis_server.url, task_always_eager=True)

    @singleton_task(app=app, shared=False, dedupe_enqueue=True, fencing=True)
    def eager(x: int, fence_token: int | None = None) -> int | None:
        assert rc.exists(eager.tasklock_guard.pending_key((x,), {}))  # pending while it runs
        return fence_token

    first = eager.delay(1).get()
    assert eager.delay(1).get() > first
    assert not rc.keys("tasklock:*:pending:*")  # cleared after each eager run
    twin = hold_twin(eager, (1,))
    try:
        assert eager.delay(1).state == "IGNORED"
    finally:
        twin.release()


def test_duplicate_task_pickles_with_its_details() -> None:
    error = DuplicateTask("busy", "tasklock:{t}:lock:abc", "host=a pid=1")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.key, copy.holder) == (
        DuplicateTask,
        "busy",
        error.key,
        error.holder,
    )
    assert isinstance(copy, tasklock.DuplicateTaskError)


def test_skip_counts(app: Celery, rc: redis.Redis) -> None:
    @singleton_task(app=app, shared=False, name="api.counted")
    def counted(x: int) -> int:
        return x

    before = stats.snapshot().get("duplicate_skip:api.counted", 0)
    twin = hold_twin(counted, (3,))
    try:
        counted(3)
        counted.apply((3,))
    finally:
        twin.release()
    assert stats.snapshot()["duplicate_skip:api.counted"] == before + 2
