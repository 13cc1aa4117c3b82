"""Work for the multiprocess tests of :mod:`tasklock.prometheus`, run where prometheus_client is in
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before it is imported), which the test
process itself is not.

* ``python -m tests.integration.prometheus_jobs URL TASK CHILDREN RUNS``: a prefork parent that
  calls :func:`instrument` at import, as a tasks module would, then forks ``CHILDREN`` children
  (as Celery's prefork pool does) that each run ``RUNS`` guarded calls and leave with
  ``os._exit`` (no atexit: whatever they recorded must already be in their files).
* :func:`timed`: an RQ job for a real ``rq worker``, whose work horses import this module (and
  so call :func:`instrument`) after the fork.
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
except ImportError:  # RQ not installed: only the prefork part is usable
    pass
else:

    @singleton_job(ttl=30)
    def timed(n: int) -> int:
        return n


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
