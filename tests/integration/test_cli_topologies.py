"""`tasklock ls` and `tasklock stats` on more than one Redis: a real 3-master Redis Cluster, and 3
real Redlock masters (one of them stopped in some tests: it is named, the others still read).

A cluster keeps each key on one master, so ``ls`` must scan every master; Redlock keeps one hold
on a majority of masters, so ``ls --urls`` merges the masters' values and says which hold each,
and ``stats --urls`` sums the counts each master got from the processes that write to it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import tasklock
from tasklock import fleet
from tasklock.core.owner import parse_value
from tasklock.core.redlock import Redlock
from tasklock.guard import Guard
from tasklock.ops.inspect import list_locks
from tests.integration.test_cli_stats import run_task, settle
from tests.support.cli import Run, cli_runner, without_url_environment
from tests.support.servers import RedisClusterServers, RedisServer


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    return cli_runner(capsys)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    without_url_environment(monkeypatch)
    fleet.flush()  # counts other tests left pending go to their servers, not to these


@pytest.fixture
def cluster(redis_cluster: RedisClusterServers) -> Iterator[RedisClusterServers]:
    redis_cluster.flushall()
    return redis_cluster


@pytest.fixture
def masters(nodes: list[RedisServer]) -> list[RedisServer]:
    """Three Redlock masters (of the module's five), empty and running."""
    return nodes[:3]


def urls_of(masters: list[RedisServer]) -> list[str]:
    return [master.url for master in masters]


# --- Redis Cluster ------------------------------------------------------------------------------


def test_ls_on_a_cluster_lists_the_locks_of_every_master(
    cluster: RedisClusterServers, run: Run
) -> None:
    client = cluster.client()
    names = cluster.names_on_every_node("job")
    locks = [tasklock.Lock(client, name) for name in names]
    for lock in locks:
        assert lock.acquire(blocking=False)
    [permit_name] = cluster.names_on_every_node("pool")[1:2]
    permit = tasklock.Semaphore(client, permit_name, 2)
    assert permit.acquire(blocking=False)

    code, out, err = run("ls", "--url", cluster.url)

    assert (code, err) == (0, "")
    rows = out.strip().splitlines()[1:]
    assert sorted(row.split()[0] for row in rows) == sorted([*names, permit_name])
    code, out, _ = run("ls", "--url", cluster.url, "--json")
    assert code == 0
    listed = json.loads(out)
    assert isinstance(listed, list)
    assert {entry["key"]: entry["kind"] for entry in listed} == {
        **dict.fromkeys(names, "lock"),
        permit_name: "permit",
    }
    for lock in [*locks, permit]:
        lock.release()
    client.close()


def test_listing_through_a_cluster_client_scans_every_master(
    cluster: RedisClusterServers,
) -> None:
    # What the exporter and the Django admin call with the cluster client they were given.
    client = cluster.client()
    names = cluster.names_on_every_node("job")
    locks = [tasklock.Lock(client, name) for name in names]
    for lock in locks:
        assert lock.acquire(blocking=False)

    assert sorted(info.key for info in list_locks(client)) == sorted(names)
    for lock in locks:
        lock.release()
    client.close()


def test_stats_on_a_cluster_reads_every_tasks_counts(
    cluster: RedisClusterServers, run: Run
) -> None:
    tasks = cluster.names_on_every_node("task")  # their counts live on different masters
    for task in tasks:
        run_task(Guard(settle, task, {"url": cluster.url}), (1,))
    fleet.flush()

    code, out, err = run("stats", "--url", cluster.url, "--json")

    assert (code, err) == (0, "")
    assert {task: counts["ran"] for task, counts in json.loads(out).items()} == dict.fromkeys(
        tasks, 1
    )


# --- Redlock masters: ls ------------------------------------------------------------------------


def masters_holding(masters: list[RedisServer], lock: Redlock) -> list[str]:
    """The URLs of the masters whose value of ``lock`` has its owner token (the token of the
    value that carries its fence)."""
    values = {}
    for master in masters:
        client = master.client()
        value = client.get(lock.name)
        client.close()
        if value is not None:
            values[master.url] = parse_value(value)
    [token] = {held.token for held in values.values() if held.fence == lock.fence}
    return [url for url, held in values.items() if held.token == token]


HOLD = b'0123456789abcdef0123456789abcdef {"host":"web-1","pid":42,"at":1700000000.0}#12'


def hold_on(masters: list[RedisServer], key: str = "settle-42") -> None:
    """A Redlock hold as the masters keep it: one fenced value on each."""
    for master in masters:
        put_value(master, key, HOLD)


def put_value(master: RedisServer, key: str, value: bytes) -> None:
    client = master.client()
    client.set(key, value, px=30_000)
    client.close()


def test_ls_across_masters_merges_a_hold_and_names_its_masters(
    masters: list[RedisServer], run: Run
) -> None:
    urls = urls_of(masters)
    held = Redlock(urls, "settle-42")
    assert held.acquire(blocking=False)
    before = masters_holding(masters, held)  # a late answer of round one may still add one
    assert len(before) >= 2
    # What a master kept of an acquire that did not reach a majority: listed, marked not held.
    other = tasklock.Lock(masters[0].client(), "stale")
    assert other.acquire(blocking=False)

    code, out, err = run("ls", "--urls", ",".join(urls))

    assert (code, err) == (0, "")
    lines = out.strip().splitlines()
    assert lines[0].split()[-1] == "NODES"
    rows = {line.split()[0]: line for line in lines[1:] if line.strip()}
    assert rows["settle-42"].split()[-1] in {f"{len(before)}/3", "3/3"}
    assert rows["stale"].endswith("1/3 not held")
    assert any(line.startswith("not held: on fewer than 2 of 3 masters") for line in lines)

    code, out, _ = run("ls", "--urls", *urls, "--json")
    assert code == 0
    listed = {entry["key"]: entry for entry in json.loads(out)}
    after = masters_holding(masters, held)
    assert set(before) <= set(listed["settle-42"]["nodes"]) <= set(after)
    assert listed["settle-42"]["fence"] == held.fence
    assert listed["stale"]["nodes"] == [urls[0]]
    held.release()
    other.release()


def test_values_that_differ_are_rows_of_their_own(masters: list[RedisServer], run: Run) -> None:
    # Two contenders' first rounds split the masters: neither value is a hold.
    first = b'0123456789abcdef0123456789abcdef {"host":"a","pid":1}#7'
    second = b'fedcba9876543210fedcba9876543210 {"host":"b","pid":2}#8'
    put_value(masters[0], "split", first)
    put_value(masters[1], "split", second)
    put_value(masters[2], "split", first)

    code, out, _ = run("ls", "--urls", *urls_of(masters), "--json")

    assert code == 0
    found = sorted((entry["host"], entry["nodes"]) for entry in json.loads(out))
    urls = urls_of(masters)
    assert found == [("a", [urls[0], urls[2]]), ("b", [urls[1]])]
    assert parse_value(first).fence == 7


def test_a_master_between_the_two_rounds_holds_the_same_acquire(
    masters: list[RedisServer], run: Run
) -> None:
    # Round one stores the value without its fence; round two adds it. Same token: one holder.
    bare = b'0123456789abcdef0123456789abcdef {"host":"a","pid":1}'
    for master in masters[:2]:
        put_value(master, "settle-7", bare + b"#12")
    put_value(masters[2], "settle-7", bare)

    code, out, _ = run("ls", "--urls", *urls_of(masters), "--json")

    assert code == 0
    [entry] = json.loads(out)
    assert (entry["nodes"], entry["fence"]) == (urls_of(masters), 12)


def test_ls_with_a_master_down_names_it_and_lists_the_others(
    masters: list[RedisServer], run: Run
) -> None:
    urls = urls_of(masters)
    hold_on(masters)
    # On one master that answers: the stopped one may hold it too, so it is not marked.
    other = tasklock.Lock(masters[0].client(), "maybe")
    assert other.acquire(blocking=False)
    masters[2].stop()

    code, out, err = run("ls", "--urls", *urls)

    assert code == 1  # the listing is the other masters' only
    [warning] = err.strip().splitlines()
    assert warning.startswith(
        f"tasklock: warning: master {urls[2]} did not answer; listing the other masters. "
    )
    assert "Connection refused" in warning
    rows = {line.split()[0]: line.split() for line in out.strip().splitlines()[1:]}
    assert rows["settle-42"][-1] == "2/3"  # still a majority: held
    assert rows["maybe"][-1] == "1/3"
    assert "not held" not in out
    other.release()

    code, out, err = run("ls", "--urls", *urls, "--match", "settle-*", "--json")
    assert code == 1
    assert [entry["nodes"] for entry in json.loads(out)] == [urls[:2]]
    assert urls[2] in err


def test_ls_reads_the_masters_from_the_environment_and_hides_passwords(
    masters: list[RedisServer], run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default user has no password, so any password is accepted: this one must not show.
    urls = [url.replace("redis://", "redis://default:s3cret@") for url in urls_of(masters)]
    hold_on(masters)
    monkeypatch.setenv("TASKLOCK_URLS", ",".join(urls))

    code, out, err = run("ls", "--json")

    assert (code, err) == (0, "")
    [entry] = json.loads(out)
    assert entry["nodes"] == [url.replace("s3cret", "***") for url in urls]


def test_ls_when_no_master_answers(masters: list[RedisServer], run: Run) -> None:
    urls = urls_of(masters)
    for master in masters:
        master.stop()

    code, out, err = run("ls", "--urls", *urls)

    assert (code, out) == (1, "")
    assert err.startswith("tasklock: error: no Redlock master answered (")
    assert all(url in err for url in urls)


# --- Redlock masters: stats ---------------------------------------------------------------------


def counts_on(masters: list[RedisServer]) -> list[dict[str, dict[str, int]]]:
    found = []
    for master in masters:
        client = master.client()
        found.append(fleet.read_counts(client))
        client.close()
    return found


def spread_counts(masters: list[RedisServer]) -> None:
    """Counts of one task on two masters and of another on the third, as processes that reach
    different masters first leave them (each writes to the first master of its ``urls``)."""
    urls = urls_of(masters)

    def guard(name: str, order: list[int]) -> Guard:
        return Guard(settle, name, {"urls": [urls[i] for i in order]})

    run_task(guard("billing.settle", [0, 1, 2]), (1,))
    run_task(guard("billing.settle", [0, 1, 2]), (2,))
    fleet.flush()
    run_task(guard("billing.settle", [1, 0, 2]), (3,))
    fleet.flush()
    run_task(guard("mail.send", [2, 0, 1]), (1,))
    fleet.flush()


def test_stats_across_masters_sums_what_each_holds(masters: list[RedisServer], run: Run) -> None:
    spread_counts(masters)
    per_master = counts_on(masters)
    assert [sorted(counts) for counts in per_master] == [
        ["billing.settle"],
        ["billing.settle"],
        ["mail.send"],
    ]

    code, out, err = run("stats", "--urls", *urls_of(masters), "--json")

    assert (code, err) == (0, "")
    data = json.loads(out)
    assert data == fleet.merge(per_master)
    assert (data["billing.settle"]["ran"], data["mail.send"]["ran"]) == (3, 1)
    assert all(type(value) is int for counts in data.values() for value in counts.values())

    code, out, err = run("stats", "--urls", ",".join(urls_of(masters)))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("tasklock counts on 3 Redlock masters (window total")
    assert any(line.split()[:2] == ["billing.settle", "3"] for line in lines)
    per_node = lines[lines.index(next(x for x in lines if x.startswith("per master"))) + 1 :]
    urls = urls_of(masters)
    assert [line.split()[0] for line in per_node] == urls
    assert per_node[0].split(maxsplit=1)[1] == "1 task, ran 2, duplicates 0"
    assert per_node[1].split(maxsplit=1)[1] == "1 task, ran 1, duplicates 0"
    assert per_node[2].split(maxsplit=1)[1] == "1 task, ran 1, duplicates 0"


def test_stats_with_a_master_down_sums_the_others_and_says_so(
    masters: list[RedisServer], run: Run
) -> None:
    spread_counts(masters)
    urls = urls_of(masters)
    masters[1].stop()

    code, out, err = run("stats", "--urls", *urls)

    assert code == 1
    [warning] = err.strip().splitlines()
    assert warning.startswith(
        f"tasklock: warning: master {urls[1]} did not answer; its counts are missing from the sum. "
    )
    assert any(line.split()[:2] == ["billing.settle", "2"] for line in out.splitlines())
    assert out.strip().splitlines()[-2].split(maxsplit=1) == [
        urls[1],
        "did not answer (its share is missing above)",
    ]

    code, out, _ = run("stats", "--urls", *urls, "--json")
    assert code == 1
    data: dict[str, Any] = json.loads(out)
    assert (data["billing.settle"]["ran"], data["mail.send"]["ran"]) == (2, 1)


def test_stats_across_masters_with_no_counts(masters: list[RedisServer], run: Run) -> None:
    code, out, err = run("stats", "--urls", *urls_of(masters))

    assert (code, err) == (0, "")
    assert out.startswith("No tasklock counts on 3 Redlock masters (window total")
    assert out.strip().splitlines()[-1].endswith("no counts")
