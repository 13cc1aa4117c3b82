"""Work for the multiprocess tests of :mod:`tasklock.prometheus`, run where prometheus_client is in
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before it is imported), which the test
process itself is not.

* ``python -m tests.integration.prometheus_jobs URL TASK CHILDREN RUNS``: a prefork parent that
  calls :func:`instrument` at import, as a tasks module would, then forks ``CHILDREN`` children
  (as Celery's prefork pool does) that each run ``RUNS`` guarded calls and leave with
  ``os._exit`` (no atexit: whatever they recorded must already be in their files).
* :func:`timed`: an RQ job for a real ``rq worker``, whose work horses import this module (and
  so call :func:`instrument`) after the fork.
* ``celery -A tests.integration.prometheus_jobs worker --pool=prefork``: the worker's parent
  imports this module (and so calls :func:`instrument`) before it forks its pool's children.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from tasklock.errors import DuplicateTask
from tasklock.guard import Guard
from tasklock.prometheus import instrument

instrument()  # at import, as the docs tell a tasks module to

try:
    from tasklock.rq import singleton_job
except ImportError:  # RQ not installed
    pass
else:

    @singleton_job(ttl=30)
    def timed(n: int) -> int:
        return n


try:
    from celery import Celery
    from celery.signals import worker_process_shutdown
    from prometheus_client import multiprocess

    from tasklock.celery import singleton_task
except ImportError:  # Celery not installed
    pass
else:
    #: Broker, results and locks: the test's redis-server, given in the worker's environment.
    URL = os.environ.get("TL_PROM_URL", "redis://127.0.0.1:1/0")
    app = Celery("tl_prom", broker=URL, backend=URL)
    app.conf.update(
        broker_connection_retry_on_startup=True,
        task_default_queue="tl_prom",
        worker_prefetch_multiplier=1,
        result_expires=600,
        tasklock_url=URL,
    )

    @singleton_task(app=app, name="prom.celery_timed")
    def celery_timed(n: int) -> int:
        return os.getpid()

    @worker_process_shutdown.connect
    def _dead(pid: int | None = None, **kwargs: Any) -> None:
        """As the module docstring of tasklock.prometheus tells Celery users to."""
        multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]


def settle(account_id: int) -> str:
    return f"settled {account_id}"


def run_child(url: str, task: str, runs: int) -> None:
    guard = Guard(settle, task, {"url": url})

    def body(n: int) -> Callable[[dict[str, Any]], str]:
        return lambda extra: settle(n)

    for n in range(runs):
        result: Any = guard.run(
            (os.getpid() * 1000 + n,),
            {},
            body(n),
            task_id=f"{os.getpid()}-{n}",
            on_skip=lambda d: "skipped",
            on_retry=lambda d: "retry",
            duplicate_error=DuplicateTask,
        )
        assert result == f"settled {n}", result


def main(url: str, task: str, children: int, runs: int) -> int:
    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                run_child(url, task, runs)
                code = 0
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        pids.append(pid)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    print(" ".join(str(pid) for pid in pids))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
