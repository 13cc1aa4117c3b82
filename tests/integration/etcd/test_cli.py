"""The `tasklock` command against a real etcd: ls, show, release and doctor on ``etcd://`` URLs.

Same output and exit codes as on Redis (tests/integration/test_cli.py): what differs is where the
fence comes from (the key's create revision), that there is no fence counter, and what doctor
checks. Semaphore permits are made by hand as ``<name>:permit:<i>`` keys on leases of their own
(the layout the etcd Semaphore uses), so these tests do not depend on it.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import tasklock.etcd
from tasklock.cli import main
from tasklock.core.owner import new_token, parse_value
from tasklock.etcd import Lock
from tasklock.ops import etcd_inspect
from tasklock.ops.etcd_doctor import EndpointFacts, judge
from tests.integration.etcd.conftest import EtcdServer
from tests.integration.test_cli import SCRIPT, FakeTerminal, Run
from tests.support.servers import RedisServer, free_port

TASK = "tasks.settle"


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """main() in-process, as the Redis CLI tests run it, with no URL from the environment:
    returns (exit status, stdout, stderr)."""
    monkeypatch.delenv("TASKLOCK_URL", raising=False)
    monkeypatch.delenv("TASKLOCK_URLS", raising=False)

    def call(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return call


@pytest.fixture
def url(etcd: EtcdServer) -> str:
    return "etcd://" + etcd.url.removeprefix("http://")


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own: the etcd is shared by the module."""
    return f"cli-{uuid.uuid4().hex[:8]}:"


def _post(etcd: EtcdServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = httpx.post(etcd.url + path, json=body, timeout=5)
    reply.raise_for_status()
    answer: dict[str, Any] = reply.json()
    return answer


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _put_on_lease(etcd: EtcdServer, key: str, value: bytes, ttl: int = 30) -> tuple[int, int]:
    """``key`` created with ``value`` on a lease of its own: (lease, create revision)."""
    lease = int(_post(etcd, "/v3/lease/grant", {"TTL": str(ttl)})["ID"])
    k = _b64(key.encode())
    txn = {
        "compare": [{"target": "CREATE", "key": k, "result": "EQUAL", "create_revision": "0"}],
        "success": [{"request_put": {"key": k, "value": _b64(value), "lease": str(lease)}}],
    }
    reply = _post(etcd, "/v3/kv/txn", txn)
    assert reply.get("succeeded")
    return lease, int(reply["header"]["revision"])


def _lease_left(etcd: EtcdServer, lease: int) -> int:
    return int(_post(etcd, "/v3/lease/timetolive", {"ID": str(lease)}).get("TTL", 0))


def _exists(etcd: EtcdServer, key: str) -> bool:
    return bool(_post(etcd, "/v3/kv/range", {"key": _b64(key.encode())}).get("kvs"))


def _after_stamp(value: bytes | str) -> None:
    """Owner metadata stamps ``at`` in milliseconds: make the next stamp later (for ordering)."""
    at = parse_value(value).meta["at"]
    while time.time() < at + 0.002:
        time.sleep(0.001)


def _value(etcd: EtcdServer, key: str) -> bytes:
    [kv] = _post(etcd, "/v3/kv/range", {"key": _b64(key.encode())})["kvs"]
    return base64.b64decode(kv["value"])


def _held(etcd: EtcdServer, name: str, **kwargs: Any) -> Lock:
    lock = Lock(etcd.url, name, **kwargs)
    assert lock.acquire(blocking=False)
    _after_stamp(_value(etcd, name))
    return lock


def _permit(etcd: EtcdServer, semaphore: str, index: int, task: str) -> tuple[int, int]:
    value = new_token({"task": task, "name": TASK}).encode()
    held = _put_on_lease(etcd, f"{semaphore}:permit:{index}", value)
    _after_stamp(value)
    return held


def _marker(etcd: EtcdServer, prefix: str) -> str:
    """A dedupe_enqueue marker: a bare task id on a lease. Never a lock."""
    key = f"{prefix}tasklock:{{{TASK}}}:pending:" + "d" * 64
    _put_on_lease(etcd, key, b"8c1e5a52-1b2c-4d5e-9f00-123456789abc")
    return key


# --- ls -----------------------------------------------------------------------------------------


def test_ls_lists_locks_and_permits_newest_first_and_skips_markers(
    etcd: EtcdServer, url: str, prefix: str, run: Run
) -> None:
    _marker(etcd, prefix)
    core = _held(etcd, prefix + "core")
    task_key = f"{prefix}tasklock:{{{TASK}}}:lock:" + "d" * 64
    task = _held(etcd, task_key, owner_info={"task": "t-1", "name": TASK})
    semaphore = prefix + "sem"
    _, first_fence = _permit(etcd, semaphore, 0, "t-2")
    _, second_fence = _permit(etcd, semaphore, 1, "t-3")

    code, out, err = run("ls", "--url", url, "--match", prefix + "*")

    assert (code, err) == (0, "")
    lines = out.strip().splitlines()
    assert lines[0].split() == ["KEY", "HOST", "PID", "TASK", "AGE", "TTL", "FENCE", "KIND"]
    rows = [line.split() for line in lines[1:]]
    assert [row[0] for row in rows] == [semaphore, semaphore, task_key, prefix + "core"]
    assert [row[6] for row in rows] == [
        str(second_fence),
        str(first_fence),
        str(task.fence),
        str(core.fence),
    ]
    assert rows[2][3] == f"{TASK}[t-1]"
    assert rows[0][7:] == ["permit", "(2", "live)"]
    assert rows[2][7] == "lock"

    code, out, err = run("ls", "--url", url, "--match", prefix + "*", "--json")
    assert (code, err) == (0, "")
    listed = json.loads(out)
    assert [(row["key"], row["kind"], row["permits"]) for row in listed] == [
        (semaphore, "permit", 2),
        (semaphore, "permit", 2),
        (task_key, "lock", None),
        (prefix + "core", "lock", None),
    ]
    task_row = listed[2]
    assert (task_row["task"], task_row["task_name"], task_row["fence"]) == ("t-1", TASK, task.fence)
    assert task_row["token"] == _value(etcd, task_key).decode().split()[0]
    assert 0 < task_row["ttl_ms"] <= 30_000
    assert set(task_row) == {
        "key", "host", "pid", "task", "task_name", "acquired_at", "ttl_ms", "fence", "token",
        "meta", "value", "kind", "permits",
    }  # fmt: skip
    core.release()
    task.release()


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("*", ["a1", "a2", "b1", "[x]", "back\\slash"]),
        ("a*", ["a1", "a2"]),
        ("?1", ["a1", "b1"]),
        ("[ab]1", ["a1", "b1"]),
        ("[^a]1", ["b1"]),
        ("[a-b]2", ["a2"]),
        ("\\[x\\]", ["[x]"]),
        ("back\\\\slash", ["back\\slash"]),
        ("zz*", []),
    ],
)
def test_ls_match_is_a_redis_glob(
    etcd: EtcdServer,
    url: str,
    prefix: str,
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
    pattern: str,
    expected: list[str],
) -> None:
    monkeypatch.setattr(etcd_inspect, "PAGE", 2)  # several pages for five keys
    locks = [_held(etcd, prefix + name) for name in ("a1", "a2", "b1", "[x]", "back\\slash")]
    code, out, err = run("ls", "--url", url, "--match", prefix + pattern, "--json")
    assert (code, err) == (0, "")
    # keys come back as `ls` prints them (a backslash doubled)
    found = sorted(row["key"].removeprefix(prefix).replace("\\\\", "\\") for row in json.loads(out))
    assert found == sorted(expected)
    for lock in locks:
        lock.release()


def test_ls_with_nothing_held_and_from_the_environment(
    etcd: EtcdServer, url: str, prefix: str, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    _marker(etcd, prefix)
    monkeypatch.setenv("TASKLOCK_URL", url)
    code, out, err = run("ls", "--match", prefix + "*")
    assert (code, err) == (0, "")
    assert out.startswith(f"No tasklock locks held on {url} matching")


# --- show ---------------------------------------------------------------------------------------


def test_show_a_lock_says_its_fence_is_the_revision(
    etcd: EtcdServer, url: str, prefix: str, run: Run
) -> None:
    lock = _held(etcd, prefix + "job", owner_info={"task": "t-1", "name": TASK})

    code, out, err = run("show", prefix + "job", "--url", url)

    assert (code, err) == (0, "")
    assert re.search(rf"^key +{re.escape(prefix)}job$", out, re.M)
    assert re.search(rf"^fence +{lock.fence}$", out, re.M)
    assert "task id" in out
    assert "fence counter  none on etcd: the fence is the key's create revision" in out
    assert out.splitlines()[0].index(prefix) == out.splitlines()[-1].index("none")  # aligned

    code, out, err = run("show", prefix + "job", "--url", url, "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert (data["fence"], data["task"], data["kind"]) == (lock.fence, "t-1", "lock")
    assert data["fence_counters"] == []
    lock.release()


def test_show_a_semaphore_lists_its_permits(
    etcd: EtcdServer, url: str, prefix: str, run: Run
) -> None:
    semaphore = prefix + "sem"
    _, first = _permit(etcd, semaphore, 0, "t-1")
    _, second = _permit(etcd, semaphore, 1, "t-2")

    code, out, err = run("show", semaphore, "--url", url)

    assert (code, err) == (0, "")
    assert "2 live permits" in out
    assert "fence counter  none on etcd" in out
    assert out.index("fence counter") < out.index("permits, first to free first:")
    fences = [line.split()[0] for line in out.split("first to free first:")[1].splitlines()[2:]]
    assert sorted(fences) == [str(first), str(second)]

    code, out, _ = run("show", semaphore, "--url", url, "--json")
    data = json.loads(out)
    assert (data["kind"], data["permits"], data["fence_counters"]) == ("semaphore", 2, [])
    assert {h["task"] for h in data["holders"]} == {"t-1", "t-2"}


def test_show_of_a_marker_or_a_missing_key_fails(
    etcd: EtcdServer, url: str, prefix: str, run: Run
) -> None:
    marker = _marker(etcd, prefix)
    code, out, err = run("show", marker, "--url", url)
    assert (code, out) == (1, "")
    assert "does not hold a tasklock lock value" in err
    assert "8c1e5a52" in err
    code, out, err = run("show", prefix + "missing", "--url", url)
    assert (code, out) == (1, "")
    assert f"is not held on {url} (no such key" in err


# --- release ------------------------------------------------------------------------------------


def test_release_confirmed_revokes_the_hold_and_its_holder_learns_it_lost(
    etcd: EtcdServer, url: str, prefix: str, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = prefix + "stuck"
    lock = _held(etcd, name, timeout=3, watchdog=True, owner_info={"task": "t-1", "name": TASK})
    monkeypatch.setattr(sys, "stdin", FakeTerminal("yes\n"))

    code, out, err = run("release", name, "--force", "--url", url)

    assert (code, err.count("[y/N]")) == (0, 1)
    assert f"fence {lock.fence}," in out  # the holder was shown
    assert f"Released {name}" in out
    assert lock.lost.wait(15), "the holder's watchdog did not report the lock lost"
    waiter = Lock(url, name)
    assert waiter.acquire(blocking=False)
    assert (waiter.fence or 0) > (lock.fence or 0)
    waiter.release()


def test_release_refuses_a_hold_that_changed_meanwhile(
    etcd: EtcdServer, url: str, prefix: str, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = prefix + "stuck"
    first = _held(etcd, name)
    shown_fence = first.fence
    second = Lock(url, name)

    def holder_changes() -> None:  # while the operator reads the prompt
        first.release()
        assert second.acquire(blocking=False)

    monkeypatch.setattr(sys, "stdin", FakeTerminal("y\n", holder_changes))
    code, out, err = run("release", name, "--force", "--url", url)

    assert code == 1
    assert f"fence {shown_fence}," in out
    assert "changed since it was shown" in err
    assert f"fence {second.fence}," in err  # who holds it now
    assert second.owned()
    assert not second.lost
    second.release()


def test_release_refuses_a_hold_moved_to_another_lease_meanwhile(
    etcd: EtcdServer, url: str, prefix: str, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``extend`` moves the key to a new lease (same create revision, same fence): deleting it
    and revoking the old lease would leave the holder renewing the new one, believing it holds."""
    name = prefix + "stuck"
    lock = _held(etcd, name)

    def holder_extends() -> None:  # while the operator reads the prompt
        assert lock.extend(10)

    monkeypatch.setattr(sys, "stdin", FakeTerminal("y\n", holder_extends))
    code, _, err = run("release", name, "--force", "--url", url)
    assert code == 1
    assert "changed since it was shown" in err
    assert f"fence {lock.fence}," in err  # the same hold, on its new lease
    assert lock.owned()
    lock.release()


@pytest.mark.parametrize(
    ("argv", "stdin", "code"),
    [
        (["--yes"], None, 2),  # no --force
        (["--force"], io.StringIO("y\n"), 1),  # piped input is not a person confirming
        (["--force"], FakeTerminal("n\n"), 1),
        (["--force", "--yes", "--fence", "1"], None, 1),  # a fence that is not this hold's
    ],
    ids=["no-force", "not-a-tty", "no", "other-fence"],
)
def test_release_refused_keeps_the_lock(
    etcd: EtcdServer,
    url: str,
    prefix: str,
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    stdin: io.StringIO | None,
    code: int,
) -> None:
    lock = _held(etcd, prefix + "stuck")
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", stdin)
    assert run("release", prefix + "stuck", *argv, "--url", url)[0] == code
    assert lock.owned()
    lock.release()


def test_release_of_a_marker_leaves_it_alone(
    etcd: EtcdServer, url: str, prefix: str, run: Run
) -> None:
    marker = _marker(etcd, prefix)
    code, _, err = run("release", marker, "--force", "--yes", "--url", url)
    assert code == 1
    assert "tasklock leaves it alone" in err
    assert _exists(etcd, marker)


def test_release_one_permit_by_fence_revokes_only_its_lease(
    etcd: EtcdServer, url: str, prefix: str, run: Run
) -> None:
    semaphore = prefix + "sem"
    first_lease, first = _permit(etcd, semaphore, 0, "t-1")
    second_lease, second = _permit(etcd, semaphore, 1, "t-2")

    code, out, err = run("release", semaphore, "--force", "--yes", "--url", url)
    assert code == 2
    assert "name the one to release" in err
    assert f"--fence {first}" in err or f"--fence {second}" in err

    code, out, err = run(
        "release", semaphore, "--force", "--yes", "--fence", str(first), "--url", url
    )
    assert (code, err) == (0, "")
    assert f"Released the permit with fence {first} of {semaphore}" in out
    assert not _exists(etcd, f"{semaphore}:permit:0")
    assert _lease_left(etcd, first_lease) == -1  # revoked: its holder's keep-alive fails
    assert _exists(etcd, f"{semaphore}:permit:1")
    assert _lease_left(etcd, second_lease) > 0


def test_a_real_semaphores_permits_are_listed_and_one_is_released(
    etcd: EtcdServer, url: str, prefix: str, run: Run
) -> None:
    """The same on permits taken by tasklock.etcd.Semaphore."""
    semaphore_class = tasklock.etcd.Semaphore
    name = prefix + "sem"
    holders = []
    for task in ("t-1", "t-2"):
        holder = semaphore_class(
            etcd.url, name, 3, timeout=3, watchdog=True, owner_info={"task": task, "name": TASK}
        )
        assert holder.acquire(blocking=False)
        holders.append(holder)

    code, out, _ = run("ls", "--url", url, "--match", name, "--json")
    listed = json.loads(out)
    assert code == 0
    assert {(row["key"], row["kind"], row["permits"]) for row in listed} == {(name, "permit", 2)}
    assert {row["fence"] for row in listed} == {h.fence for h in holders}

    released, kept = holders
    code, out, err = run(
        "release", name, "--force", "--yes", "--fence", str(released.fence), "--url", url
    )
    assert (code, err) == (0, "")
    assert released.lost.wait(15), "the released permit's holder did not learn it lost it"
    assert kept.owned()
    assert not kept.lost
    kept.release()


# --- doctor -------------------------------------------------------------------------------------


def _verdicts(report: dict[str, Any]) -> dict[tuple[str | None, str], str]:
    return {(c["node"], c["name"]): c["status"] for c in report["checks"]}


def test_doctor_on_a_healthy_single_node(etcd: EtcdServer, url: str, run: Run) -> None:
    code, out, err = run("doctor", "--url", url)
    assert (code, err) == (0, "")
    assert out.startswith("tasklock doctor (etcd, 1 endpoint(s))")
    for name in ("reachable", "version", "health", "leader", "lock probe"):
        assert f"ok    {name}" in out
    assert "WARN  members" in out
    assert "a 3-member cluster tolerates 1 failure, a 5-member cluster 2" in out

    code, out, _ = run("doctor", "--url", url, "--json")
    report = json.loads(out)
    assert (code, report["ok"], report["warnings"], report["failures"]) == (0, True, 1, 0)
    assert report["urls"] == [etcd.url]
    verdicts = _verdicts(report)
    assert verdicts[(None, "members")] == "warn"
    assert verdicts[(None, "endpoints")] == "ok"
    assert verdicts[(None, "one cluster")] == "ok"
    for name in ("reachable", "version", "health", "leader", "lock probe", "latency"):
        assert verdicts[(etcd.url, name)] == "ok", name

    code, out, _ = run("doctor", "--url", url, "--json", "--strict")
    assert (code, json.loads(out)["ok"]) == (1, False)


def test_doctor_with_an_unreachable_endpoint_fails_it(
    etcd: EtcdServer, url: str, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("TASKLOCK_URLS", f"{url},{dead}")  # one cluster's hosts: not split
    code, out, _ = run("doctor", "--json")
    report = json.loads(out)
    verdicts = _verdicts(report)
    assert code == 1
    assert verdicts[(f"http://{dead}", "reachable")] == "fail"
    assert verdicts[(etcd.url, "lock probe")] == "ok"
    assert verdicts[(None, "one cluster")] == "ok"

    code, out, _ = run("doctor", "--url", f"etcd://{dead}")
    assert code == 1
    assert f"FAIL  reachable  etcd at http://{dead} did not answer" in out


def _facts(url: str, cluster: str = "7", members: int = 3) -> EndpointFacts:
    names = [f"m{i}" for i in range(members)]
    return EndpointFacts(url, version="3.5.1", health="true", cluster_id=cluster, members=names)


@pytest.mark.parametrize(
    ("members", "status", "words"),
    [
        (1, "warn", "tolerates 0 failed member(s): while it is down"),
        (2, "warn", "tolerates 0 failed member(s), no more than 1 members would"),
        (3, "ok", "quorum 2: tolerates 1 failed member(s)"),
        (4, "warn", "tolerates 1 failed member(s), no more than 3 members would"),
        (5, "ok", "quorum 3: tolerates 2 failed member(s)"),
    ],
)
def test_doctor_judges_the_member_count(members: int, status: str, words: str) -> None:
    given = [_facts(f"http://m{i}:2379", members=members) for i in range(members)]
    (check,) = [c for c in judge(given) if c.name == "members"]
    assert (check.status, check.node) == (status, None)
    assert words in check.message
    assert (check.fix is None) == (status == "ok")


def test_doctor_judges_endpoints_and_clusters() -> None:
    verdicts = {c.name: c for c in judge([_facts("http://a:2379")])}
    assert verdicts["endpoints"].status == "warn"
    assert "1 endpoint(s) given for 3 members" in verdicts["endpoints"].message

    down = EndpointFacts("http://c:2379", error="etcd at http://c:2379 did not answer (refused)")
    verdicts = {c.name: c for c in judge([_facts("http://a:2379"), _facts("http://b:2379"), down])}
    assert (verdicts["endpoints"].status, verdicts["one cluster"].status) == ("ok", "ok")

    mixed = [_facts("http://a:2379", cluster="10"), _facts("http://b:2379", cluster="11")]
    check = {c.name: c for c in judge(mixed)}["one cluster"]
    assert check.status == "fail"
    assert "cluster a: http://a:2379; cluster b: http://b:2379" in check.message


@pytest.fixture
def http_server() -> Iterator[str]:
    """A plain HTTP server that is not etcd, on a port of its own: its ``host:port``."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_is_not_etcd_is_named(http_server: str, run: Run) -> None:
    code, out, err = run("ls", "--url", f"etcd://{http_server}")
    assert (code, out) == (2, "")
    assert "not as etcd's v3 JSON gateway" in err
    assert f"--url='etcd://{http_server}'" in err
    assert len(err.strip().splitlines()) == 1

    code, out, _ = run("doctor", "--url", f"etcd://{http_server}")
    assert code == 1
    assert f"FAIL  reachable  http://{http_server} is not etcd" in out
    assert "fix: point the URL at etcd's client port" in out


def test_a_redis_port_is_not_etcd(redis_server: RedisServer, run: Run) -> None:
    where = f"127.0.0.1:{redis_server.port}"
    code, out, err = run("show", "k", "--url", f"etcd://{where}")
    assert (code, out) == (1, "")
    assert "is it etcd's client port" in err
    assert "Traceback" not in err

    code, out, _ = run("doctor", "--url", f"etcd://{where}")
    assert code == 1
    assert f"FAIL  reachable  http://{where} is not etcd" in out


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [["ls"], ["show", "k"], ["release", "k", "--force"], ["doctor"]]
)
@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("etcd://h:99999", "invalid port"),
        ("etcd://", "empty host"),
        ("etcds://a:1,", "empty host"),
        ("etcd://root:s3cret@h:2379", "etcd://root:***@h:2379"),
    ],
)
def test_bad_etcd_urls_are_usage_errors(
    run: Run, command: list[str], bad: str, needle: str
) -> None:
    code, out, err = run(*command, "--url", bad)
    assert (code, out) == (2, "")
    assert err.startswith("tasklock: error: --url: etcd URL")
    assert needle in err
    assert "s3cret" not in err
    assert len(err.strip().splitlines()) == 1


def test_bad_etcd_urls_from_the_environment_and_mixed_backends(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKLOCK_URL", "etcd://h:0")
    code, _, err = run("ls")
    assert code == 2
    assert "TASKLOCK_URL: etcd URL 'etcd://h:0'" in err
    code, _, err = run("doctor", "--urls", "etcd://a:1", "redis://b:2/0")
    assert code == 2
    assert "--urls mixes etcd and Redis URLs" in err


@pytest.mark.parametrize("command", [["ls"], ["show", "k"], ["release", "k", "--force", "--yes"]])
def test_an_unreachable_etcd_exits_1_naming_the_url(run: Run, command: list[str]) -> None:
    where = f"127.0.0.1:{free_port()}"
    code, out, err = run(*command, "--url", f"etcd://{where}")
    assert (code, out) == (1, "")
    assert err.startswith(f"tasklock: error: --url='etcd://{where}': etcd unreachable")
    assert len(err.strip().splitlines()) == 1


def test_console_script_ls_json(etcd: EtcdServer, url: str, prefix: str) -> None:
    lock = _held(etcd, prefix + "job", owner_info={"task": "t-1", "name": TASK})
    done = subprocess.run(
        [str(SCRIPT), "ls", "--url", url, "--match", prefix + "*", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, "")
    [row] = json.loads(done.stdout)
    assert (row["key"], row["fence"], row["task"]) == (prefix + "job", lock.fence, "t-1")
    lock.release()


def test_the_command_imports_no_httpx_until_an_etcd_url_is_given() -> None:
    """A Redis-only installation runs `tasklock` without the etcd extra."""
    code = (
        "import sys, tasklock.cli\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'httpx'"
        " or m.startswith(('tasklock.etcd', 'tasklock.ops.etcd'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "[]", "")
