"""tasklock's options in the ``@app.task(base=SingletonTask, ttl=5, ...)`` form and as class
attributes of ``SingletonTask`` subclasses: honoured like ``@singleton_task``'s, and near-misses
refused at decoration with the same error.

Celery's ``app.task(base=X, **options)`` makes every option a class attribute of the task class it
creates, so without this ``on_duplicate="raise"`` became a plain attribute that nothing read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from tasklock.celery import SingletonTask, singleton_task
from tasklock.errors import ConfigurationError, DuplicateTask
from tasklock.guard import reset_all
from tests.integration.celery.support import clear_tasklock_keys, configure
from tests.support.servers import RedisServer

PARKED = "tl-base-options-parked"  # no worker consumes it


@pytest.fixture
def rc(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    clear_tasklock_keys(client)
    yield client
    client.delete(PARKED)
    client.close()


@pytest.fixture
def app(redis_server: RedisServer) -> Iterator[Celery]:
    app = configure(Celery(f"base{id(object())}", set_as_current=False), redis_server.url)
    app.finalize()  # the task class is created at decoration, where errors should surface
    yield app
    reset_all()


def hold_twin(task: Any, args: tuple[Any, ...]) -> Any:
    """Hold the lock of ``task(*args)`` as a twin running elsewhere would."""
    guard = task.tasklock_guard
    lock = guard.lock_for(guard.lock_key(args, {}), task_id="twin-elsewhere")
    assert lock.acquire(blocking=False)
    return lock


def test_the_issues_task_gets_the_options_it_was_written_with(app: Celery, rc: redis.Redis) -> None:
    """The issue's case: all three options were ignored (skip, 30 s, no dedupe)."""

    @app.task(base=SingletonTask, on_duplicate="raise", ttl=5, dedupe_enqueue=True, shared=False)
    def settle(account: int) -> int:
        (key,) = rc.keys("tasklock:*:lock:*")
        return int(rc.pttl(key))

    options = settle.tasklock_guard.options
    assert (options.on_duplicate, options.ttl, options.dedupe_enqueue) == ("raise", 5.0, True)
    assert options.sources["ttl"] == "task options"
    assert 0 < settle(1) <= 5000  # the lock's TTL in Redis
    twin = hold_twin(settle, (2,))
    try:
        failed = settle.apply((2,))
        assert failed.state == "FAILURE"
        assert isinstance(failed.result, DuplicateTask)
    finally:
        twin.release()
    first = settle.apply_async((3,), queue=PARKED)
    assert settle.apply_async((3,), queue=PARKED).id == first.id  # dedupe_enqueue
    assert rc.llen(PARKED) == 1


def test_bound_tasks_and_callable_keys_in_the_base_form(app: Celery) -> None:
    @app.task(
        base=SingletonTask, bind=True, key=lambda account, day: account, fencing=True,
        shared=False,
    )  # fmt: skip
    def bound(self: Any, account: int, day: str, fence_token: int | None = None) -> int | None:
        return self.request.fence_token  # type: ignore[no-any-return]

    guard = bound.tasklock_guard
    assert guard.lock_key((1, "mon"), {}) == guard.lock_key((1, "tue"), {})
    assert isinstance(bound(1, "mon"), int)


def test_keywords_win_over_the_tasklock_dict_as_with_singleton_task(app: Celery) -> None:
    @app.task(base=SingletonTask, tasklock={"ttl": 3, "on_duplicate": "wait"}, ttl=9, shared=False)
    def both(x: int) -> int:
        return x

    @singleton_task(app=app, tasklock={"ttl": 3, "on_duplicate": "wait"}, ttl=9, shared=False)
    def decorated(x: int) -> int:
        return x

    for task in (both, decorated):
        options = task.tasklock_guard.options
        assert (options.ttl, options.on_duplicate) == (9.0, "wait")


def test_class_attributes_of_a_subclass_are_options(app: Celery) -> None:
    class Quiet(SingletonTask):
        on_duplicate = "raise"
        ttl = 7
        tasklock = {"pending_ttl": 60}

    @app.task(base=Quiet, ttl=4, shared=False)
    def merged(x: int) -> int:
        return x

    @app.task(base=Quiet, shared=False)
    def inherited(x: int) -> int:
        return x

    options = merged.tasklock_guard.options
    assert (options.on_duplicate, options.ttl, options.pending_ttl) == ("raise", 4.0, 60.0)
    assert inherited.tasklock_guard.options.ttl == 7.0

    class Settle(Quiet):
        """A class-based task, options in its body."""

        name = "base.class_settle"
        key = staticmethod(lambda account, day: account)
        wait_timeout = 3

        def run(self, account: int, day: str) -> int:
            return account

    guard = app.register_task(Settle()).tasklock_guard
    assert (guard.options.wait_timeout, guard.options.on_duplicate) == (3.0, "raise")
    assert guard.lock_key((1, "mon"), {}) == guard.lock_key((1, "tue"), {})


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"on_duplicat": "raise"}, r"unknown option 'on_duplicat'; did you mean 'on_duplicate'\?"),
        ({"ttll": 5}, r"'ttll'; did you mean 'ttl'\?"),
        ({"dedupe_enqeue": True}, r"did you mean 'dedupe_enqueue'\?"),
        ({"tasklock_ttl": 5}, r"unknown option 'tasklock_ttl'; did you mean 'ttl'\?"),
        ({"tasklock_nonsense": 5}, r"unknown option 'tasklock_nonsense'"),
        ({"ttl": 0}, r"ttl must be a number of seconds > 0"),
        ({"on_duplicate": "sometimes"}, r"on_duplicate must be one of"),
        ({"key": ["acount"]}, r"acount"),
        ({"fencing": True}, r"fence_token"),
    ],
)
def test_bad_options_in_the_base_form_fail_at_decoration(
    app: Celery, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):

        @app.task(base=SingletonTask, shared=False, **options)
        def settle(account: int) -> None: ...


def test_the_same_near_miss_is_the_same_error_in_every_form(app: Celery) -> None:
    """@singleton_task, @app.task(base=...) and a class body name the same typo alike."""

    def settle(account: int) -> int:
        return account

    messages = []
    for define in (
        lambda: singleton_task(app=app, shared=False, on_duplicat="raise")(settle),
        lambda: app.task(base=SingletonTask, shared=False, on_duplicat="raise")(settle),
        lambda: type("Typo", (SingletonTask,), {"on_duplicat": "raise"}),
    ):
        with pytest.raises(ConfigurationError) as info:
            define()
        messages.append(str(info.value).split(": ", 1)[1])
    assert len(set(messages)) == 1, messages
    assert "did you mean 'on_duplicate'?" in messages[0]


def test_near_misses_in_a_class_body_fail_where_the_class_is_defined() -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'on_duplicate'"):

        class Typo(SingletonTask):  # no run(): a base for other tasks
            on_duplicat = "raise"

    with pytest.raises(ConfigurationError, match="'tasklock_on_duplicate'; did you mean"):

        class ConfName(SingletonTask):
            tasklock_on_duplicate = "raise"

    with pytest.raises(ConfigurationError, match="ttl must be a number"):

        class BadValue(SingletonTask):
            ttl = -1

    with pytest.raises(ConfigurationError, match=r"'key' is a tasklock option.*staticmethod"):

        class KeyMethod(SingletonTask):
            def key(self, account: int) -> int:  # would be called without self
                return account


def test_what_is_not_an_option_is_left_alone(app: Celery) -> None:
    """Celery's own options, and methods or unrelated attributes of a class-based task."""

    class Helpers(SingletonTask):
        retries_note = "not an option"
        urls_for_reports = ("a", "b")

        def keys(self) -> list[str]:  # a method whose name is close to an option
            return []

        @property
        def tll(self) -> int:
            return 0

    @app.task(
        base=Helpers, shared=False, acks_late=True, autoretry_for=(ValueError,),
        retry_backoff=True, max_retries=3,
    )  # fmt: skip
    def settle(account: int) -> int:
        return account

    assert settle.acks_late is True
    assert settle.max_retries == 3
    assert settle.tasklock_guard.options.ttl == 30.0
