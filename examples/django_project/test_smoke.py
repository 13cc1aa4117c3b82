"""Smoke test: the Django project passes `manage.py check`, and a real Celery worker and a real
django-rq worker run its task and job with every tasklock setting taken from TASKLOCK."""

from __future__ import annotations

import re
from pathlib import Path

from celery import Celery
from rq import Queue, Worker
from tests.support.servers import RedisServer

from examples.conftest import PYTHON, Processes

HERE = Path(__file__).resolve().parent


def test_task_and_job_configured_from_tasklock_setting(
    redis_server: RedisServer, processes: Processes
) -> None:
    env = {"REDIS_URL": redis_server.url, "DJANGO_SETTINGS_MODULE": "mysite.settings"}
    check = processes.run([PYTHON, "manage.py", "check"], HERE, env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "System check identified no issues" in check.stdout

    processes.start(
        "celery worker",
        [PYTHON, "-m", "celery", "-A", "mysite", "worker", "--concurrency", "2", "-l", "INFO",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        HERE,
        env,
    )  # fmt: skip
    processes.start("rqworker", [PYTHON, "manage.py", "rqworker", "default"], HERE, env)
    control = Celery(broker=redis_server.url).control
    processes.wait_until(lambda: control.ping(timeout=0.5), "the Celery worker")
    queue = Queue("default", connection=redis_server.client())
    processes.wait_until(lambda: Worker.all(queue=queue), "the RQ worker")

    result = processes.run([PYTHON, "manage.py", "billing_demo"], HERE, env)

    out = result.stdout
    assert result.returncode == 0, out + result.stderr + processes.output()
    for option in ("url", "ttl", "key_prefix", "on_duplicate"):
        assert re.search(rf"{option}=\S+ \(Django TASKLOCK\)", out), out
    assert "fencing=True (task options)" in out
    assert re.search(r"send_invoice\(1001\) x5: 1 ran \(fence \d+\), 4 skipped \(DUPLICATE\)", out)
    assert "export_ledger.delay('2026-11') x5: 1 job -> ledger-2026-11.csv" in out
    # The locks and counters live under TASKLOCK's KEY_PREFIX.
    keys = {key.decode() for key in redis_server.client().scan_iter(match="mysite:*")}
    assert "mysite:{billing.tasks.send_invoice}:fence" in keys, keys
