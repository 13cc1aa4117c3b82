"""The operator tooling's pure parts: lock value parsing, doctor verdicts, durations, URL redaction.

The doctor's probing runs against real servers in tests/integration/test_cli.py; here its verdicts
are checked on facts no test server can produce (old versions, skewed clocks, slow links).
"""

from __future__ import annotations

import pytest

from tasklock.core.owner import new_token
from tasklock.ops.doctor import NodeFacts, Status, drift_allowance, judge, redact_url
from tasklock.ops.inspect import fence_counter_keys, parse_lock_value
from tasklock.ops.render import duration

TOKEN = "0123456789abcdef0123456789abcdef"


def _healthy(url: str = "redis://a:6379/0", **changes: object) -> NodeFacts:
    facts = NodeFacts(
        url=url,
        version="7.2.4",
        run_id=url,
        role="master",
        connected_replicas=0,
        maxmemory=0,
        maxmemory_policy="noeviction",
        aof_enabled=True,
        appendfsync="always",
        rdb_save="",
        round_trips=[0.0002] * 5,
        clock_offset=0.0,
        clock_uncertainty=0.0001,
    )
    for name, value in changes.items():
        setattr(facts, name, value)
    return facts


def _verdicts(*nodes: NodeFacts, ttl: float = 30.0) -> dict[tuple[str | None, str], Status]:
    return {(c.node, c.name): c.status for c in judge(nodes, ttl)}


# --- lock values --------------------------------------------------------------------------------


def test_values_written_by_tasklock_parse() -> None:
    token = new_token({"task": "t-1", "name": "app.tasks.settle"})
    holder = parse_lock_value(f"{token}#17".encode())
    assert holder is not None
    assert holder.fence == 17
    assert holder.meta["task"] == "t-1"
    assert holder.meta["name"] == "app.tasks.settle"
    redlock_round_one = parse_lock_value(new_token())
    assert redlock_round_one is not None
    assert redlock_round_one.fence is None


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"hello",
        b"17",  # a fence counter
        b"8c1e5a52-1b2c-4d5e-9f00-123456789abc",  # an enqueue marker (task id)
        TOKEN.encode(),  # redis-py's Lock: a bare token
        f"{TOKEN} #3".encode(),
        f'{TOKEN} {{"who":"x"}}#3'.encode(),  # JSON, but not owner metadata
        f'{TOKEN.upper()} {{"host":"h","pid":1}}#3'.encode(),
        f'{TOKEN[:-1]} {{"host":"h","pid":1}}#3'.encode(),
        b'\xff\xfe {"host":"h","pid":1}#3',
    ],
)
def test_other_values_are_not_locks(value: bytes) -> None:
    assert parse_lock_value(value) is None


def test_fence_counter_keys() -> None:
    assert fence_counter_keys("report") == [("default", "{report}:fence")]
    task_key = "tasklock:{app.settle}:lock:abc"
    assert fence_counter_keys(task_key) == [
        ("task layer", "tasklock:{app.settle}:fence"),
        ("default", f"{task_key}:fence"),
    ]


# --- doctor verdicts ----------------------------------------------------------------------------


def test_healthy_node_is_all_ok() -> None:
    verdicts = _verdicts(_healthy())
    assert set(verdicts.values()) == {Status.OK}
    assert {name for _, name in verdicts} == {
        "reachable",
        "version",
        "replication",
        "eviction",
        "persistence",
        "latency",
        "clock",
    }


@pytest.mark.parametrize(
    ("version", "status"),
    [
        ("2.6.11", Status.FAIL),
        ("2.6.12", Status.WARN),
        ("6.0.9", Status.WARN),
        ("6.2.0", Status.OK),
    ],
)
def test_version(version: str, status: Status) -> None:
    assert _verdicts(_healthy(version=version))[("redis://a:6379/0", "version")] is status


@pytest.mark.parametrize(
    ("changes", "status"),
    [
        ({"aof_enabled": True, "appendfsync": "everysec"}, Status.OK),
        ({"aof_enabled": True, "appendfsync": "no"}, Status.WARN),
        ({"aof_enabled": False, "rdb_save": "3600 1"}, Status.WARN),
        ({"aof_enabled": False, "rdb_save": ""}, Status.WARN),
        ({"aof_enabled": False, "rdb_save": None}, Status.WARN),
    ],
)
def test_persistence(changes: dict[str, object], status: Status) -> None:
    assert _verdicts(_healthy(**changes))[("redis://a:6379/0", "persistence")] is status


@pytest.mark.parametrize(
    ("policy", "maxmemory", "status"),
    [
        ("noeviction", 10**8, Status.OK),
        ("allkeys-lru", 10**8, Status.FAIL),
        ("volatile-lfu", 10**8, Status.FAIL),
        ("allkeys-random", 0, Status.WARN),
        (None, 10**8, Status.WARN),  # CONFIG denied and not in INFO
    ],
)
def test_eviction(policy: str | None, maxmemory: int, status: Status) -> None:
    node = _healthy(maxmemory_policy=policy, maxmemory=maxmemory)
    assert _verdicts(node)[("redis://a:6379/0", "eviction")] is status


def test_replication_and_latency() -> None:
    url = "redis://a:6379/0"
    assert _verdicts(_healthy(role="slave"))[(url, "replication")] is Status.FAIL
    assert _verdicts(_healthy(connected_replicas=2))[(url, "replication")] is Status.WARN
    assert _verdicts(_healthy(round_trips=[0.08] * 5))[(url, "latency")] is Status.WARN
    assert _verdicts(_healthy(round_trips=[1.5] * 5))[(url, "latency")] is Status.FAIL
    assert _verdicts(_healthy(round_trips=[0.001, 0.001, 2.0]))[(url, "latency")] is Status.OK


def test_unreachable_node_gets_one_failure() -> None:
    checks = judge([NodeFacts(url="redis://gone:6379/0", error="Redis at ... did not answer")])
    assert [(c.name, c.status) for c in checks] == [("reachable", Status.FAIL)]
    assert checks[0].fix


def test_drift_allowance() -> None:
    assert drift_allowance() == pytest.approx(0.302)
    assert drift_allowance(5) == pytest.approx(0.052)


@pytest.mark.parametrize(
    ("skew", "ttl", "status"),
    [
        (0.010, 30.0, Status.OK),
        (0.100, 30.0, Status.WARN),
        (0.400, 30.0, Status.FAIL),
        (0.100, 5.0, Status.FAIL),  # 52 ms allowed for a 5 s TTL
    ],
)
def test_clock_difference_against_drift_allowance(skew: float, ttl: float, status: Status) -> None:
    nodes = [
        _healthy("redis://a:1/0"),
        _healthy("redis://b:1/0", clock_offset=skew),
        _healthy("redis://c:1/0", clock_offset=skew / 2),
    ]
    assert _verdicts(*nodes, ttl=ttl)[(None, "clock")] is status


def test_redlock_node_count_and_duplicates() -> None:
    three = [_healthy(f"redis://n{i}:1/0") for i in range(3)]
    verdicts = _verdicts(*three)
    assert verdicts[(None, "quorum")] is Status.OK
    assert verdicts[(None, "distinct nodes")] is Status.OK
    assert _verdicts(*three[:2])[(None, "quorum")] is Status.WARN
    four = [*three, _healthy("redis://n3:1/0")]
    assert _verdicts(*four)[(None, "quorum")] is Status.WARN
    alias = _healthy("redis://alias:1/0", run_id=three[0].run_id)
    assert _verdicts(*three, alias)[(None, "distinct nodes")] is Status.FAIL


def test_replicas_on_redlock_masters_warn() -> None:
    nodes = [_healthy(f"redis://n{i}:1/0") for i in range(3)]
    nodes[1].connected_replicas = 1
    verdicts = _verdicts(*nodes)
    assert verdicts[("redis://n1:1/0", "replication")] is Status.WARN
    assert verdicts[("redis://n0:1/0", "replication")] is Status.OK


# --- small helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-1, "0ms"), (0.25, "250ms"), (29.54, "29.5s"), (723, "12m03s"), (18420, "5h07m")],
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_redact_url() -> None:
    assert redact_url("redis://:secret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("rediss://user:secret@h/2") == "rediss://user:***@h/2"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
