"""tasklock.compat without a server: the originals' keys, their bugs in key making fixed, options
checked where the task is defined, the file backend, errors that pickle."""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from tasklock.compat.celery_once import AlreadyQueued, QueueOnce
from tasklock.compat.celery_once.backends.file import File, key_to_lock_name
from tasklock.compat.celery_once.helpers import import_backend, queue_once_key
from tasklock.compat.celery_singleton import DuplicateTaskError, Singleton
from tasklock.compat.celery_singleton.config import Config
from tasklock.errors import ConfigurationError


@pytest.fixture
def app() -> Celery:
    app = Celery("tl_compat_unit", broker="memory://", backend="cache+memory://")
    app.conf.ONCE = {"backend": "celery_once.backends.Redis", "settings": {"url": "redis://x"}}
    app.finalize()  # task classes are made (and checked) where each task is decorated
    return app


def test_once_key_format_is_the_original(app: Celery) -> None:
    @app.task(shared=False, name="t.add", base=QueueOnce)
    def add(a: int, b: int) -> int:
        return a + b

    assert add.get_key((1, 2)) == "qo_t.add_a-1_b-2"
    assert add.get_key(kwargs={"b": 2, "a": 1}) == "qo_t.add_a-1_b-2"
    assert queue_once_key("example", {"pk": 10, "id": 10}, restrict_to=["pk"]) == "qo_example_pk-10"


def test_once_keys_naming_a_defaulted_argument(app: Celery) -> None:
    """The original raised KeyError at delay() when keys= named an argument left to its
    default."""

    @app.task(shared=False, name="t.page", base=QueueOnce, once={"keys": ["size"]})
    def page(number: int, size: int = 20) -> None: ...

    assert page.get_key((3,)) == "qo_t.page_size-20"
    assert page.get_key((3,), {"size": 20}) == page.get_key((3,))


def test_once_bound_task_key_leaves_the_task_out(app: Celery) -> None:
    """celery-once #93: a bound task's key held the task's repr (``<@task: ... at 0x10af06d38>``),
    a memory address that differs in every process, so two producers never excluded each
    other. The key is the call's arguments only, the same in any process."""

    @app.task(shared=False, name="t.bound", base=QueueOnce, bind=True)
    def bound(self: Any, a: int) -> int:
        return a

    assert bound.get_key((1,)) == "qo_t.bound_a-1"
    assert bound.get_key(kwargs={"a": 1}) == "qo_t.bound_a-1"


def test_once_tuple_and_list_are_one_key(app: Celery) -> None:
    @app.task(shared=False, name="t.pair", base=QueueOnce)
    def pair(p: Any) -> None: ...

    assert pair.get_key(((1, 2),)) == pair.get_key(([1, 2],)) == "qo_t.pair_p-[1, 2]"


def test_once_bad_options_fail_where_the_task_is_defined(app: Celery) -> None:
    with pytest.raises(ConfigurationError, match="once=.*unknown option.*'gracefull'"):

        @app.task(shared=False, name="t.bad1", base=QueueOnce, once={"gracefull": True})
        def bad1() -> None: ...

    with pytest.raises(ConfigurationError, match=r"once\['keys'\].*'nope'"):

        @app.task(shared=False, name="t.bad2", base=QueueOnce, once={"keys": ["nope"]})
        def bad2(a: int) -> None: ...

    with pytest.raises(ConfigurationError, match=r"once\['timeout'\]"):

        @app.task(shared=False, name="t.bad3", base=QueueOnce, once={"timeout": -1})
        def bad3() -> None: ...


def test_once_backend_paths_are_served_by_tasklock() -> None:
    backend = import_backend(
        {"backend": "celery_once.backends.Redis", "settings": {"url": "redis://h:1/2"}}
    )
    assert type(backend).__module__ == "tasklock.compat.celery_once.backends.redis"
    with pytest.raises(ConfigurationError, match=r"ONCE\['backend'\] = 'nowhere.Backend'"):
        import_backend({"backend": "nowhere.Backend", "settings": {}})
    with pytest.raises(ConfigurationError, match=r"ONCE\['settings'\]\['url'\]"):
        import_backend({"backend": "celery_once.backends.Redis", "settings": {}})


def test_once_without_once_config_says_what_to_set() -> None:
    app = Celery("tl_compat_noconf", broker="memory://")

    @app.task(shared=False, name="t.noconf", base=QueueOnce)
    def noconf() -> None: ...

    with pytest.raises(ConfigurationError, match="app.conf.ONCE is not set"):
        noconf.delay()


def test_once_bad_per_call_option(app: Celery) -> None:
    @app.task(shared=False, name="t.call", base=QueueOnce)
    def call() -> None: ...

    with pytest.raises(ConfigurationError, match="unknown option.*'keys'"):
        call.apply_async(once={"keys": ["a"]})


def test_file_backend_claims_owns_and_clears(tmp_path: Path) -> None:
    backend = File({"location": str(tmp_path)})
    assert backend.claim("qo_t", "task-1", 60_000, "test") is None
    assert backend.claim("qo_t", "task-1", 60_000, "test") is None  # its own: a retry
    assert backend.claim("qo_t", "task-2", 60_000, "test") == "task-1"
    with pytest.raises(AlreadyQueued) as caught:
        backend.raise_or_lock("qo_t", 60)
    assert 59 < caught.value.countdown <= 60
    assert backend.delete_if("qo_t", "task-2", "test") is False
    assert backend.delete_if("qo_t", "task-1", "test") is True
    (tmp_path / key_to_lock_name("qo_t")).touch()  # the original's (empty) lock file
    assert backend.claim("qo_t", "task-3", 60_000, "test") == "celery-once"
    assert backend.delete_if("qo_t", "task-3", "test") is True
    assert backend.claim("qo_t", "task-4", 1, "test") is None
    assert backend.claim("qo_t", "task-5", 60_000, "test") in (None, "task-4")


def test_file_lock_name_is_the_original() -> None:
    assert key_to_lock_name("qo_test") == "qo_test_999f583e69db6a0c04b86beeebb2b631"


def test_singleton_unique_on_defaults_and_empty(app: Celery) -> None:
    """celery-singleton #15/#23: unique_on=[] (the name alone) and a unique_on argument left to
    its default."""

    @app.task(shared=False, name="t.report", base=Singleton, unique_on=["fmt"])
    def report(user: int, fmt: str = "pdf") -> None: ...

    @app.task(shared=False, name="t.nightly", base=Singleton, unique_on=[])
    def nightly(day: str | None = None) -> None: ...

    assert report.generate_lock(report.name, [1]) == report.generate_lock(report.name, [2], {})
    assert report.generate_lock(report.name, [1]) == report.generate_lock(
        report.name, [1], {"fmt": "pdf"}
    )
    assert nightly.generate_lock(nightly.name, ["mon"]) == nightly.generate_lock(nightly.name)


def test_singleton_uuid_keys_as_its_text(app: Celery) -> None:
    @app.task(shared=False, name="t.user", base=Singleton)
    def user(ident: Any) -> None: ...

    ident = uuid.uuid4()
    assert user.generate_lock(user.name, [ident]) == user.generate_lock(user.name, [str(ident)])


def test_singleton_explicit_none_encoder_is_the_originals(app: Celery) -> None:
    app.conf.singleton_json_encoder_class = None

    @app.task(shared=False, name="t.plain", base=Singleton)
    def plain(ident: Any) -> None: ...

    assert Config(app).json_encoder_class is None
    with pytest.raises(TypeError, match="singleton_json_encoder_class"):
        plain.generate_lock(plain.name, [uuid.uuid4()])


def test_singleton_bad_options_fail_where_the_task_is_defined(app: Celery) -> None:
    with pytest.raises(ConfigurationError, match="unique_on of .* names 'nope'"):

        @app.task(shared=False, name="t.s1", base=Singleton, unique_on=["nope"])
        def s1(a: int) -> None: ...

    with pytest.raises(ConfigurationError, match="lock_expiry of"):

        @app.task(shared=False, name="t.s2", base=Singleton, lock_expiry="soon")
        def s2() -> None: ...


def test_errors_pickle() -> None:
    duplicate = pickle.loads(pickle.dumps(DuplicateTaskError("dup of abc", task_id="abc")))
    assert (str(duplicate), duplicate.task_id) == ("dup of abc", "abc")
    queued = pickle.loads(pickle.dumps(AlreadyQueued(3)))
    assert (queued.countdown, str(queued)) == (3, "Expires in 3 seconds")
