"""``tasklock demo``: real workers, bursts of duplicate work, and what tasklock made of them.

Steps: a Redis (an embedded redis-server unless ``--url``), a Celery worker with a prefork pool
and forking RQ workers as subprocesses (the first also runs RQ's scheduler), then the scenes:

1. Celery: bursts of duplicate ``settle`` calls, skipped while their twin runs; fence tokens;
2. RQ: the same with RQ jobs;
3. ``dedupe_enqueue``: ten concurrent submissions of one call give one task / job id;
4. ``limit=2`` (exports two at a time) and ``dedupe_enqueue="until_start"``;
5. ``rate="5/s"`` with ``limit=None``: ten notifications submitted at once get slots 0.2 s apart
   and start at them (Celery re-sends a call for its slot; an RQ work horse sleeps until a slot
   under 1 s away, and a job with a slot further away is rescheduled, for RQ's scheduler).

Each outcome is printed and checked; a broken promise is a one-line error and exit status 1.
Everything the demo started is stopped and its temp dir removed, on success, failure or Ctrl-C;
with ``--url``, the keys it wrote are deleted (they all carry the run's namespace).


The scenes themselves are in :mod:`tasklock.demo.scenes`; the handling of Ctrl-C and other stop
signals in :mod:`tasklock.demo.signals`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

import redis

from tasklock.demo import workers
from tasklock.demo.processes import DemoError, stop_all
from tasklock.demo.scenes import EXPORT_LIMIT, NOTIFY_RATE, Scenes, chain
from tasklock.demo.server import EmbeddedRedis
from tasklock.demo.signals import interrupts_ignored, signals_interrupt
from tasklock.ops.doctor import redact_url

__all__ = ["main", "run"]


def main(args: Any) -> int:
    """Entry point for ``tasklock demo``; ``args.url`` is None unless ``--url`` was given."""
    try:
        with signals_interrupt():
            run(getattr(args, "url", None), sys.stdout)
    except DemoError as exc:
        _error(str(exc))
        return 1
    except KeyboardInterrupt:
        _error("interrupted: stopped everything the demo started")
        return 130
    except BrokenPipeError:
        raise  # the reader went away (`| head`): tasklock.cli ends quietly
    except Exception as exc:
        _error(f"demo failed: {type(exc).__name__}: {exc}")
        return 1
    return 0


def _error(message: str) -> None:
    print(f"tasklock: error: {' '.join(message.split())}", file=sys.stderr, flush=True)


def run(url: str | None, out: TextIO) -> None:
    """Run the demo, printing to ``out``; DemoError when a step fails or a check does not hold."""
    cleanup = ExitStack()
    try:
        Demo(url, out, cleanup).run()
    finally:
        with interrupts_ignored():  # a second Ctrl-C must not leave processes behind
            cleanup.close()
    stopped = "the workers and the demo's Redis" if url is None else "the workers, deleted the keys"
    print(f"Stopped {stopped}, removed the temp files.", file=out)


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """This process sees the workers' environment while the demo runs (tasklock reads it)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --- the demo -----------------------------------------------------------------------------------


class Demo:
    """One run: what it started is registered on ``cleanup`` as soon as it exists."""

    def __init__(self, url: str | None, out: TextIO, cleanup: ExitStack) -> None:
        self.given_url = url
        self.out = out
        self.cleanup = cleanup
        self.namespace = f"tasklock-demo-{secrets.token_hex(3)}"
        self.rq_job_ids: list[str] = []
        self.rq_locks_before: set[bytes] = set()

    # -- setup ----------------------------------------------------------------------------------
    def run(self) -> None:
        """Start a Redis and the workers (each registered on ``cleanup`` as it starts), wait
        until they are ready, then play the scenes."""
        began = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix="tasklock-demo-"))
        self.cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
        url, where = self._redis(tmp)
        env = workers.demo_environ(url, self.namespace, os.environ)
        started = [
            workers.start_celery_worker(self.namespace, env, tmp),
            *workers.start_rq_workers(url, self.namespace, env, tmp),
        ]
        self.cleanup.callback(stop_all, started, 10.0)
        self.cleanup.enter_context(_environ(env))

        # Imported only now: they read TASKLOCK_URL / TASKLOCK_KEY_PREFIX at import, like workers.
        from rq import Queue

        from tasklock.demo import celery_tasks, rq_jobs

        client = redis.Redis.from_url(url)
        self.cleanup.callback(client.close)
        queue = Queue(self.namespace, connection=client)
        workers.wait_until(
            workers.celery_ready(celery_tasks.app, self.namespace), started, "the Celery worker"
        )
        workers.wait_until(workers.rq_ready(queue), started, "the RQ workers")
        scenes = Scenes(
            self.out,
            self.namespace,
            client,
            queue,
            started,
            (celery_tasks, rq_jobs),
            self.rq_job_ids,
        )
        self._play(scenes, where, began)

    def _play(self, scenes: Scenes, where: str, began: float) -> None:
        """The scenes in order, between the header and the summary of what was checked."""
        scenes.say("tasklock demo")
        scenes.say(f"  Redis    {where}")
        scenes.say(
            f"  Workers  1 Celery worker (prefork, {workers.CELERY_CONCURRENCY} processes), "
            f"{workers.RQ_WORKERS} RQ workers (forking); ready in {time.monotonic() - began:.1f} s"
        )
        celery_fences = scenes.celery_burst()
        rq_fences = scenes.rq_burst()
        scenes.dedupe_bursts()
        scenes.limits_scene()
        scenes.rate_scene()
        scenes.say()
        scenes.say(
            "Checked: every submission ran or was skipped (none lost); no two runs of one call "
            f"overlapped\n(exports: never more than {EXPORT_LIMIT}; notifications: each ran once, "
            f"not before its slot, at most {NOTIFY_RATE} starts\na second, +1 at a window's edge); "
            "every fenced write was accepted; fence tokens only went up:\n"
            f"   Celery settle {chain(celery_fences)}\n   RQ     settle {chain(rq_fences)}"
        )
        scenes.say(f"Done in {time.monotonic() - began:.1f} s.")

    def _redis(self, tmp: Path) -> tuple[str, str]:
        if self.given_url is None:
            server = EmbeddedRedis(tmp)
            self.cleanup.callback(server.stop)
            server.start()
            where = (
                f"redis-server {server.version} ({server.origin}) on 127.0.0.1:{server.port}, "
                "started for this demo"
            )
            return server.url, where
        url = self.given_url
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        try:
            client.ping()
        except redis.exceptions.RedisError as exc:
            raise DemoError(f"cannot use --url {redact_url(url)}: {exc}") from exc
        # RQ's workers take global maintenance locks (rq:clean_*, with a TTL); delete at the end
        # only those that did not exist before this run.
        self.rq_locks_before = set(client.scan_iter(match="rq:clean_*", count=500))
        self.cleanup.callback(self._delete_keys, client)
        return url, f"{redact_url(url)} (--url); keys under {self.namespace!r}, deleted at the end"

    def _delete_keys(self, client: redis.Redis) -> None:
        """With --url: remove what this run wrote (its namespace, its RQ queue, jobs, workers)."""
        doomed = list(client.scan_iter(match=f"{self.namespace}*", count=500))
        ours = (self.namespace, *self.rq_job_ids)
        for key in client.scan_iter(match="rq:*", count=500):
            names_ours = any(mark in key.decode(errors="replace") for mark in ours)
            new_lock = key.startswith(b"rq:clean_") and key not in self.rq_locks_before
            if names_ours or new_lock:
                doomed.append(key)
        for start in range(0, len(doomed), 500):
            client.delete(*doomed[start : start + 500])
        for registry in ("rq:queues", "rq:workers"):
            members = [m for m in client.smembers(registry) if self.namespace.encode() in m]
            if members:
                client.srem(registry, *members)
        client.close()
