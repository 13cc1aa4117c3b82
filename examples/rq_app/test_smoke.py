"""Smoke test: three forking RQ workers; repeated enqueues return one job per customer, and a job
that bypasses the enqueue-time check is skipped by the worker and says so in job.meta."""

from __future__ import annotations

import re
from pathlib import Path

from rq import Queue, Worker
from tests.support.servers import RedisServer

from examples.conftest import PYTHON, Processes

HERE = Path(__file__).resolve().parent


def test_one_rebuild_per_customer(
    redis_server: RedisServer, processes: Processes, tmp_path: Path
) -> None:
    env = {"REDIS_URL": redis_server.url, "REPORTS_DIR": str(tmp_path / "reports")}
    for number in (1, 2, 3):
        argv = [PYTHON, "-m", "rq.cli", "worker", "reports", "--url", redis_server.url]
        processes.start(f"rq worker {number}", argv, HERE, env)
    queue = Queue("reports", connection=redis_server.client())
    processes.wait_until(lambda: len(Worker.all(queue=queue)) == 3, "three RQ workers")

    result = processes.run([PYTHON, "request.py"], HERE, env)

    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert re.search(r"customer 7: 5 clicks -> 1 job", out), out
    assert re.search(r"customer 8: 5 clicks -> 1 job", out), out
    ran = re.findall(r"ran with fence (\d+) -> (.*customer-(\d+)\.txt)", out)
    assert sorted(customer for _, _, customer in ran) == ["7", "8"], out
    assert re.search(r"skipped, the lock was held by .*fence=\d+", out), out
    for fence, path, customer in ran:
        assert Path(path).read_text() == f"customer {customer}: built with fence token {fence}\n"
