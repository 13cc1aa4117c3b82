"""The error tree: one root, redis-py's own classes as bases, and pickling for result backends."""

from __future__ import annotations

import pickle

import pytest
import redis.exceptions as redis_errors

import tasklock
from tasklock import errors


def test_every_public_error_has_the_one_root() -> None:
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.TaskLockError), name
        assert getattr(tasklock, name) is getattr(errors, name)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (errors.LockError, redis_errors.LockError),
        (errors.LockNotOwnedError, redis_errors.LockNotOwnedError),
        (errors.LockNotOwnedError, errors.LockError),
        (errors.LockLostError, errors.LockNotOwnedError),
        (errors.LockLostError, redis_errors.LockNotOwnedError),
        (errors.BackendUnavailable, redis_errors.ConnectionError),
        (errors.QuorumNotReached, errors.BackendUnavailable),
        (errors.ConfigurationError, ValueError),
        (errors.KeyEncodingError, TypeError),
        (errors.DuplicateTask, errors.DuplicateTaskError),
        (errors.DuplicateJob, errors.DuplicateTaskError),
    ],
)
def test_subclasses(ours: type[Exception], theirs: type[Exception]) -> None:
    assert issubclass(ours, theirs)


def test_redis_py_handlers_catch_ours() -> None:
    with pytest.raises(redis_errors.LockNotOwnedError):
        raise errors.LockLostError("gone", lock_name="x")
    with pytest.raises(redis_errors.RedisError):
        raise errors.BackendUnavailable("down")


def test_lock_errors_keep_lock_name_through_pickle() -> None:
    error = errors.LockLostError("lost it", lock_name="jobs:1")
    assert error.lock_name == "jobs:1"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is errors.LockLostError
    assert (copy.message, copy.lock_name, str(copy)) == ("lost it", "jobs:1", "lost it")


def test_quorum_not_reached_keeps_failures_through_pickle() -> None:
    error = errors.QuorumNotReached("2 of 5", failures={"redis://a:1/0": "timeout"})
    copy = pickle.loads(pickle.dumps(error))
    assert copy.failures == {"redis://a:1/0": "timeout"}
    assert str(copy) == "2 of 5"


@pytest.mark.parametrize("cls", [errors.DuplicateTask, errors.DuplicateJob])
def test_duplicates_pickle_with_their_args(cls: type[errors.DuplicateTaskError]) -> None:
    error = cls("already running", key="tl:t:abc", holder="host=w1 pid=7 fence=3")
    assert error.args == ("already running", "tl:t:abc", "host=w1 pid=7 fence=3")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert (copy.message, copy.key, copy.holder) == (error.message, error.key, error.holder)
    assert copy.args == error.args
    assert str(copy) == "already running"


def test_duplicate_defaults() -> None:
    copy = pickle.loads(pickle.dumps(errors.DuplicateTask("dup")))
    assert (copy.key, copy.holder) == (None, None)
