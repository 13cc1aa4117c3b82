"""The `tasklock` command against a real ZooKeeper: ls, show, release and doctor on
``zookeeper://`` URLs, with the same output and exit codes as on Redis and etcd."""

from __future__ import annotations

import json
import re
import sys
import uuid

import pytest

from tasklock.cli import main
from tasklock.zookeeper import Lock, Semaphore
from tests.integration.test_cli import FakeTerminal, Run

TASK = "tasks.settle"


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.delenv("TASKLOCK_URL", raising=False)
    monkeypatch.delenv("TASKLOCK_URLS", raising=False)

    def call(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return call


@pytest.fixture
def prefix() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}:"


def test_ls_and_show_a_lock_and_a_semaphore(url: str, prefix: str, run: Run) -> None:
    lock = Lock(url, prefix + "job", owner_info={"task": "t-1", "name": TASK})
    assert lock.acquire()
    permits = [Semaphore(url, prefix + "sem", 2, owner_info={"task": f"p-{i}"}) for i in range(2)]
    for permit in permits:
        assert permit.acquire()

    code, out, err = run("ls", "--url", url, "--match", prefix + "*", "--json")
    assert (code, err) == (0, "")
    rows = json.loads(out)
    assert {(row["key"], row["kind"]) for row in rows} == {
        (prefix + "job", "lock"),
        (prefix + "sem", "permit"),
    }
    assert len(rows) == 3

    code, out, err = run("show", prefix + "job", "--url", url)
    assert (code, err) == (0, "")
    assert re.search(rf"^fence +{lock.fence}$", out, re.M)
    assert "none on ZooKeeper: the fence is the holder node's creation zxid" in out

    code, out, err = run("show", prefix + "sem", "--url", url, "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert (data["kind"], data["permits"]) == ("semaphore", 2)
    assert {h["task"] for h in data["holders"]} == {"p-0", "p-1"}

    code, out, err = run("show", prefix + "missing", "--url", url)
    assert (code, out) == (1, "")
    lock.release()
    for permit in permits:
        permit.release()


def test_release_deletes_the_holders_node_and_it_learns_it_lost(
    url: str, prefix: str, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = prefix + "stuck"
    lock = Lock(url, name, owner_info={"task": "t-1", "name": TASK})
    assert lock.acquire()
    monkeypatch.setattr(sys, "stdin", FakeTerminal("yes\n"))

    code, out, err = run("release", name, "--force", "--url", url)

    assert (code, err.count("[y/N]")) == (0, 1)
    assert f"fence {lock.fence}," in out
    assert f"Released {name}" in out
    assert lock.lost.wait(10), "the holder's watchdog did not report the lock lost"
    waiter = Lock(url, name)
    assert waiter.acquire(blocking=False)
    assert (waiter.fence or 0) > (lock.fence or 0)
    waiter.release()


def test_doctor_opens_a_session_and_probes_a_lock(url: str, run: Run) -> None:
    code, out, err = run("doctor", "--url", url)
    assert (code, err) == (0, "")
    assert out.startswith("tasklock doctor (ZooKeeper, 1 endpoint(s))")
    for name in ("session", "version", "lock probe", "cleanup"):
        assert f"ok    {name}" in out


def test_doctor_sweeps_empty_lock_directories_and_expired_markers(url: str, run: Run) -> None:
    from tasklock.zookeeper.client import client_for
    from tasklock.zookeeper.markers import Markers

    client = client_for(url)
    left = client.path("tasklock", "locks", f"left-{uuid.uuid4().hex}")
    client.kazoo.ensure_path(left)  # (as a crashed holder's session leaves it)
    Markers(client).claim(f"gone-{uuid.uuid4().hex}", "t-1", 0, "a test")  # expired at once
    code, out, _ = run("doctor", "--url", url)
    assert code == 0
    found = re.search(r"removed (\d+) empty lock directories and (\d+) expired", out)
    assert found is not None, out
    assert int(found[1]) >= 1
    assert int(found[2]) >= 1
    assert client.kazoo.exists(left) is None


@pytest.mark.parametrize(
    ("given", "words"),
    [("zookeeper://", "names no server"), ("zookeeper://h:2181?x=1", "unknown option")],
)
def test_bad_urls_are_usage_errors(given: str, words: str, run: Run) -> None:
    code, out, err = run("ls", "--url", given)
    assert (code, out) == (2, "")
    assert "--url" in err
    assert words in err
    assert "Traceback" not in err


def test_a_missing_chroot_and_mixed_backends_are_named(
    url: str, run: Run, zookeeper: object
) -> None:
    chrooted = url.replace("?", "/absent?")
    code, _, err = run("ls", "--url", chrooted)
    assert code == 2
    assert "chroot '/absent'" in err
    assert "Traceback" not in err
    code, _, err = run("doctor", "--urls", url, "redis://localhost:6379/0")
    assert code == 2
    assert "mixes Redis and ZooKeeper URLs" in err


def test_stats_and_the_exporter_say_zookeeper_keeps_no_fleet_counts(url: str, run: Run) -> None:
    code, out, err = run("stats", "--url", url)
    assert (code, out) == (2, "")
    assert "is ZooKeeper, and fleet counts live in Redis" in err
    code, out, err = run("exporter", "--url", url, "--port", "9")
    assert (code, out) == (2, "")
    assert "names ZooKeeper, and the exporter reads fleet counts and locks from Redis" in err
