"""The backend registry (:mod:`tasklock.backends`): one lookup by URL scheme, and what each entry
says; the ZooKeeper URL parser. No server needed."""

from __future__ import annotations

import pytest

from tasklock import backends
from tasklock.backends import ETCD, REDIS, ZOOKEEPER, backend_for, cluster_url, is_redlock
from tasklock.errors import ConfigurationError


@pytest.mark.parametrize(
    ("url", "entry"),
    [
        ("redis://localhost:6379/0", REDIS),
        ("rediss://h:6380", REDIS),
        ("redis+cluster://h1:7000,h2:7001", REDIS),
        ("unix:///tmp/redis.sock", REDIS),
        ("etcd://h1:2379,h2:2379", ETCD),
        ("ETCDS://h1:2379", ETCD),
        ("  zookeeper://zk1:2181/tasklock", ZOOKEEPER),
        ("zk://zk1:2181", ZOOKEEPER),
        ("memcached://h:11211", REDIS),  # unknown: Redis's parser then says what is wrong
        (None, REDIS),
        (["redis://a", "redis://b"], REDIS),
    ],
)
def test_backend_for_looks_up_the_scheme(url: object, entry: backends.Backend) -> None:
    assert backend_for(url) is entry


def test_every_scheme_names_one_entry_and_only_redis_is_built_in() -> None:
    assert {entry.name for entry in backends.REGISTRY.values()} == {"Redis", "etcd", "ZooKeeper"}
    assert [entry.name for entry in (REDIS, ETCD, ZOOKEEPER) if not entry.external] == ["Redis"]
    assert not ETCD.keeps_counts
    assert not ZOOKEEPER.keeps_counts
    assert REDIS.keeps_counts


@pytest.mark.parametrize("entry", [REDIS, ETCD, ZOOKEEPER], ids=lambda e: e.name)
def test_every_backend_redis_included_serves_the_whole_seam(entry: backends.Backend) -> None:
    """Issue 31: Redis is behind the one interface too; the task layer, Leader and the markers
    ask every backend the same questions and never test which one it is."""
    hooks = entry.load_hooks()
    for member in ("url_problem", "option_problems", "lock", "lock_maker", "count_clients"):
        assert callable(getattr(hooks, member, None)), f"{entry.hooks} lacks {member}"
    assert callable(getattr(hooks, "markers", None))
    assert sorted(hooks.__all__) == list(hooks.__all__)  # type: ignore[attr-defined]


def test_urls_of_one_cluster_are_one_url_never_redlock() -> None:
    members = ["zookeeper://a:2181", "zookeeper://b:2181"]
    assert cluster_url(members) == "zookeeper://a:2181,zookeeper://b:2181"
    assert not is_redlock(members)
    assert cluster_url(["etcd://a:2379", "zookeeper://b:2181"]) is None
    assert cluster_url(["redis://a", "redis://b", "redis://c"]) is None
    assert is_redlock(["redis://a", "redis://b", "redis://c"])


def test_url_problems_name_the_backend_and_a_mix() -> None:
    problems = backends.url_problems(None, ["zookeeper://a:2181", "redis://b:6379/0"])
    assert [p[0] for p in problems] == ["urls"]
    assert "mixes ZooKeeper and Redis URLs" in problems[0][1]
    assert backends.url_problems("zookeeper://a:2181", None) == []
    ((option, message, hint, code),) = backends.url_problems("zookeeper://", None)
    assert (option, code) == ("url", "E006")
    assert "names no server" in message
    assert hint.startswith("e.g. zookeeper://")


def test_option_problems_come_from_the_backends_hooks() -> None:
    assert backends.option_problems({"url": "redis://h", "rate": "5/s"}) == []
    ((option, _, _, code),) = backends.option_problems({"url": "zk://h:1", "rate": "5/s"})
    assert (option, code) == ("rate", "E016")
    codes = {p[3] for p in backends.option_problems({"url": "etcd://h:1", "ttl": 0.5})}
    assert codes == {"E017"}


def test_the_zookeeper_url_parser() -> None:
    from tasklock.zookeeper.client import parse_url

    target = parse_url("zookeeper://zk1,zk2:2182/apps/tasklock/?session_timeout=4.5")
    assert target.hosts == ("zk1:2181", "zk2:2182")
    assert (target.chroot, target.session_timeout) == ("/apps/tasklock", 4.5)
    assert parse_url("zookeeper://zk1:2181,zookeeper://zk2:2181").hosts == ("zk1:2181", "zk2:2181")
    for bad, words in [
        ("zookeeper://h:0", "is not host:port"),
        ("zookeeper://h/a/../b", "not a ZooKeeper path"),
        ("zookeeper://h?session_timeout=0", "must be seconds"),
        ("redis://h", "must start with zookeeper://"),
    ]:
        with pytest.raises(ConfigurationError, match=words):
            parse_url(bad)


def test_kazoo_stays_optional() -> None:
    """``import tasklock`` (the registry, the CLI's stores, tasklock.asyncio) imports no kazoo;
    only a ZooKeeper URL's first use does."""
    from tests.unit.test_package import fresh_python

    code = (
        "import sys, tasklock, tasklock.asyncio, tasklock.backends, tasklock.ops.stores\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kazoo'"
        " or 'zookeeper' in m))\n"
        "tasklock.backends.backend_for('zookeeper://h:2181').load_hooks()\n"
        "print('kazoo' in sys.modules)"
    )
    assert fresh_python(code) == ["[]", "True"]
