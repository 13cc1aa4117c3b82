"""How long a queued (fair) waiter waits between tries: renewals, not backoff (issue 13)."""

from __future__ import annotations

from tasklock.core.lease import SUBSCRIBE, AcquireLoop, Attempt


def test_a_queued_waiter_tries_only_to_renew_its_place() -> None:
    loop = AcquireLoop(True, None, 0.1, renew_every=1.0)
    assert loop.after_failure(Attempt(False, holder_ttl=30.0)) == SUBSCRIBE
    delays = [loop.after_failure(Attempt(False, holder_ttl=30.0)) for _ in range(50)]
    assert all(isinstance(d, float) and 0.75 <= d <= 1.0 for d in delays)  # not 0.05, 0.1, ...
    assert len(set(delays)) > 1  # drawn: many waiters do not renew in step


def test_a_queued_waiter_tries_again_when_the_first_place_or_the_holder_runs_out() -> None:
    loop = AcquireLoop(True, None, 0.1, renew_every=1.0)
    loop.subscribed()  # subscribed before the first try: no SUBSCRIBE step
    assert loop.after_failure(Attempt(False, holder_ttl=0.2)) == 0.201


def test_an_unqueued_waiter_keeps_the_backoff() -> None:
    loop = AcquireLoop(True, None, 0.1)
    assert loop.after_failure(Attempt(False, holder_ttl=30.0)) == SUBSCRIBE
    first = loop.after_failure(Attempt(False, holder_ttl=30.0))
    assert isinstance(first, float)
    assert first <= 0.1
