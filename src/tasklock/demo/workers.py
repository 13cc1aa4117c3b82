"""Start the demo's real workers as subprocesses and wait until they take work.

One Celery worker (prefork pool, several child processes) and several forking RQ workers (the
first with RQ's scheduler), all on the demo's Redis; one more worker of each kind than the demo
has accounts (see runner). They get their configuration from the environment (``TASKLOCK_URL``,
``TASKLOCK_KEY_PREFIX``) exactly as a deployed worker would.
"""

from __future__ import annotations

import os
import signal
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tasklock
from tasklock.demo.processes import DemoError, Process

__all__ = [
    "CELERY_CONCURRENCY",
    "RQ_WORKERS",
    "demo_environ",
    "start_celery_worker",
    "start_rq_workers",
    "wait_until",
]

CELERY_CONCURRENCY = 4
RQ_WORKERS = 4
READY_DEADLINE = 40.0


def demo_environ(url: str, namespace: str, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without settings that would point the demo elsewhere, plus the demo's own."""
    dropped = ("TASKLOCK_", "CELERY_", "DJANGO_SETTINGS_MODULE", "RQ_")
    env = {k: v for k, v in base.items() if not k.startswith(dropped)}
    # The workers import the same tasklock as this process, also when it runs from a checkout.
    package_root = str(Path(tasklock.__file__).resolve().parent.parent)
    installed = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    if package_root not in installed:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, base.get("PYTHONPATH")]))
    env.update(TASKLOCK_URL=url, TASKLOCK_KEY_PREFIX=namespace, PYTHONUNBUFFERED="1")
    return env


def celery_node(namespace: str) -> str:
    return f"celery@{namespace}"


def start_celery_worker(namespace: str, env: Mapping[str, str], logs: Path) -> Process:
    argv = [
        sys.executable, "-m", "celery", "-A", "tasklock.demo.celery_tasks", "worker",
        "--pool", "prefork", "--concurrency", str(CELERY_CONCURRENCY),
        "--hostname", celery_node(namespace), "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    # SIGTERM on the demo's death: a warm shutdown that also ends the pool processes.
    return Process.start("Celery worker", argv, logs / "celery.log", env, signal.SIGTERM)


def start_rq_workers(url: str, namespace: str, env: Mapping[str, str], logs: Path) -> list[Process]:
    """RQ workers; the first also runs RQ's scheduler (a forked process), which brings back a
    rescheduled job: one whose rate-limit slot was too far away to sleep for in the horse."""
    workers = []
    for number in range(1, RQ_WORKERS + 1):
        argv = [
            sys.executable, "-m", "tasklock.demo.rq_worker", "--url", url,
            "--name", f"{namespace}-rq-{number}", "--logging_level", "INFO",
            *(["--with-scheduler"] if number == 1 else []), namespace,
        ]  # fmt: skip
        log = logs / f"rq-{number}.log"
        workers.append(Process.start(f"RQ worker {number}", argv, log, env, signal.SIGTERM))
    return workers


def wait_until(
    ready: Callable[[], Any],
    processes: Sequence[Process],
    what: str,
    deadline: float = READY_DEADLINE,
) -> Any:
    """Poll ``ready()`` until it is truthy; DemoError if a process dies or time runs out."""
    end = time.monotonic() + deadline
    while True:
        for process in processes:
            process.check_alive()
        value = ready()
        if value:
            return value
        if time.monotonic() > end:
            raise DemoError(f"timed out after {deadline:.0f} s waiting for {what}")
        time.sleep(0.05)  # workers and tasks report through Redis: there is nothing to block on


def celery_ready(app: Any, namespace: str) -> Callable[[], bool]:
    node = celery_node(namespace)

    def ping() -> bool:
        replies = app.control.ping(destination=[node], timeout=0.5)
        return any(node in reply for reply in replies or [])

    return ping


def rq_ready(queue: Any) -> Callable[[], bool]:
    from rq import Worker

    def registered() -> bool:
        return len(Worker.all(queue=queue)) >= RQ_WORKERS

    return registered
