"""tasklock's Django admin page (``tasklock.django.admin``) through Django's test client, against
real redis-servers: who may see it and release from it, what it lists for real held locks and
guarded runs, the force-release that refuses a lock taken again since the page was read, and the
error box when there is nothing to read.

Django is configured once for the pytest process from ``tests/django_project`` (which installs the
admin), which also migrates its in-memory ``default`` database and so creates the page's
``tasklock.view_locks`` and ``tasklock.release_locks`` permissions. Each test sets ``TASKLOCK``
with ``override_settings``.
"""

from __future__ import annotations

import base64
import html
import os
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import Client, override_settings

import tasklock
from tasklock import fleet
from tasklock.guard import Guard
from tests.support.guarding import run_call
from tests.support.servers import RedisServer, free_port

PAGE = "/admin/tasklock/heldlock/"
RELEASE = "/admin/tasklock/heldlock/release/"
PREFIX = "adm"


@pytest.fixture(scope="module", autouse=True)
def django_project() -> None:
    from tests.django_project import setup

    setup()  # and migrates the in-memory default database: users, sessions, permissions


@pytest.fixture(autouse=True)
def no_tasklock_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TASKLOCK_URL", "TASKLOCK_URLS", "TASKLOCK_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def configured(r: redis.Redis, redis_server: RedisServer) -> Iterator[RedisServer]:
    """``TASKLOCK`` naming the module's (emptied) server, as a project sets it."""
    fleet.flush()  # counts earlier tests left behind go to their own servers
    with override_settings(TASKLOCK={"URL": redis_server.url, "KEY_PREFIX": PREFIX}):
        yield redis_server


def make_user(
    name: str, *, staff: bool = True, superuser: bool = False, perms: tuple[str, ...] = ()
) -> Any:
    from django.contrib.auth.models import Permission, User

    User.objects.filter(username=name).delete()
    user = User.objects.create_user(name, password="pw", is_staff=staff, is_superuser=superuser)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="tasklock", codename=codename)
        )
    return user


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin_client() -> Client:
    return client_for(make_user("root", superuser=True))


def hold(r: redis.Redis, name: str, task: str = "t-1", task_name: str = "app.settle") -> Any:
    lock = tasklock.Lock(
        r, name, owner_info={"task": task, "name": task_name}, raise_on_release_error=False
    )
    assert lock.acquire(blocking=False)
    return lock


def rows(page: str) -> dict[str, dict[str, str]]:
    """The held-locks table: key -> {column: text}, plus the release form's fields."""
    found: dict[str, dict[str, str]] = {}
    for body in re.findall(r'<tr class="tasklock-lock">(.*?)</tr>', page, re.S):
        cells = {
            name: html.unescape(re.sub(r"<[^>]+>", "", text)).strip()
            for name, text in re.findall(
                r'<td class="tasklock-([\w-]+)[^"]*">(.*?)</td>', body, re.S
            )
        }
        for field in ("key", "value"):
            match = re.search(rf'name="{field}" value="([^"]*)"', body)
            if match:
                cells[f"post_{field}"] = match.group(1)
        found[cells["key"]] = cells
    return found


def stats_rows(page: str) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for body in re.findall(r'<tr class="tasklock-stat">(.*?)</tr>', page, re.S):
        task = html.unescape(re.search(r'<td class="tasklock-stat-task">(.*?)</td>', body).group(1))
        found[task] = [int(n) for n in re.findall(r'<td class="num">(\d+)</td>', body)]
    return found


def messages_of(response: Any) -> list[str]:
    """The admin's messages on a page (``<ul class="messagelist">``), as text."""
    listed = re.search(r'<ul class="messagelist">(.*?)</ul>', response.content.decode(), re.S)
    items = re.findall(r"<li[^>]*>(.*?)</li>", listed.group(1), re.S) if listed else []
    return [html.unescape(item).strip() for item in items]


def settle(account_id: int) -> str:
    return f"settled {account_id}"


def run(guard: Guard, args: tuple[Any, ...], body: Any = None, task_id: str = "t1") -> Any:
    return run_call(guard, args, body or (lambda extra: settle(*args)), task_id)


# -- who may see it ------------------------------------------------------------------------------


def test_anonymous_and_non_staff_are_sent_to_the_admin_login(configured: RedisServer) -> None:
    anonymous = Client().get(PAGE)
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/admin/login/?next=")
    outsider = client_for(make_user("outsider", staff=False, perms=("view_locks", "release_locks")))
    assert outsider.get(PAGE).status_code == 302
    assert outsider.post(RELEASE, {"key": "a2V5", "value": "dg=="}).status_code == 302


def test_staff_without_view_locks_get_403_and_cannot_release(
    configured: RedisServer, r: redis.Redis
) -> None:
    hold(r, "report:1")
    staff = client_for(make_user("staff"))
    assert staff.get(PAGE).status_code == 403
    # release_locks alone is not enough either: the page's permission comes first
    releaser = client_for(make_user("releaser", perms=("release_locks",)))
    assert releaser.get(PAGE).status_code == 403
    value = r.get("report:1")
    assert value is not None
    form = {
        "key": base64.urlsafe_b64encode(b"report:1").decode(),
        "value": base64.urlsafe_b64encode(value).decode(),
    }
    assert staff.post(RELEASE, form).status_code == 403
    assert releaser.post(RELEASE, form).status_code == 403
    assert r.get("report:1") == value
    assert "Held locks" not in staff.get("/admin/").content.decode()


def test_view_locks_shows_the_page_without_release(configured: RedisServer, r: redis.Redis) -> None:
    hold(r, "report:1")
    viewer = client_for(make_user("viewer", perms=("view_locks",)))
    assert "Held locks" in viewer.get("/admin/").content.decode()
    page = viewer.get(PAGE)
    assert page.status_code == 200
    found = rows(page.content.decode())
    assert set(found) == {"report:1"}
    assert "post_value" not in found["report:1"]
    assert 'value="Force-release"' not in page.content.decode()
    value = r.get("report:1")
    assert value is not None
    form = {
        "key": base64.urlsafe_b64encode(b"report:1").decode(),
        "value": base64.urlsafe_b64encode(value).decode(),
    }
    assert viewer.post(RELEASE, form).status_code == 403
    assert r.get("report:1") == value


# -- what it lists -------------------------------------------------------------------------------


def test_lists_each_held_lock_with_its_holder(
    configured: RedisServer, r: redis.Redis, admin_client: Client
) -> None:
    first = hold(r, "report:1", task="job-41", task_name="app.report")
    second = hold(r, "settle:7", task="job-42", task_name="app.settle")
    taken_before = second.fence
    second.release()
    second = hold(r, "settle:7", task="job-43", task_name="app.settle")  # the next fence
    response = admin_client.get(PAGE)
    assert response.status_code == 200
    found = rows(response.content.decode())
    assert set(found) == {"report:1", "settle:7"}
    settle_row, report_row = found["settle:7"], found["report:1"]
    assert settle_row["host"] == socket.gethostname()
    assert settle_row["pid"] == str(os.getpid())
    assert (settle_row["task-name"], settle_row["task"]) == ("app.settle", "job-43")
    assert (report_row["task-name"], report_row["task"]) == ("app.report", "job-41")
    assert settle_row["fence"] == str(second.fence)
    assert report_row["fence"] == str(first.fence)
    assert second.fence > taken_before
    assert settle_row["kind"] == "lock"
    assert re.fullmatch(r"\d+ms|\d+\.\ds", settle_row["age"]), settle_row["age"]
    ttl = re.fullmatch(r"(\d+\.\d)s", settle_row["ttl"])  # the default TTL, 30 s, less a moment
    assert ttl is not None, settle_row["ttl"]
    assert 20 < float(ttl.group(1)) <= 30
    # newest first: the lock taken last is the first row
    assert list(found) == ["settle:7", "report:1"]
    assert f"<code>{configured.url}</code>" in response.content.decode()


def test_keys_and_holder_metadata_are_escaped(
    configured: RedisServer, r: redis.Redis, admin_client: Client
) -> None:
    hold(
        r, "<script>alert(1)</script>", task="<b>x</b>", task_name='"><img src=x onerror=alert(2)>'
    )
    page = admin_client.get(PAGE).content.decode()
    assert "<script>alert(1)" not in page
    assert "<b>x</b>" not in page
    assert "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    found = rows(page)
    assert found["<script>alert(1)</script>"]["task"] == "<b>x</b>"


def test_match_filters_the_keys(
    configured: RedisServer, r: redis.Redis, admin_client: Client
) -> None:
    hold(r, "report:1")
    hold(r, "settle:1")
    page = admin_client.get(PAGE, {"match": "settle:*"}).content.decode()
    assert set(rows(page)) == {"settle:1"}
    empty = admin_client.get(PAGE, {"match": "nothing:*"}).content.decode()
    assert "No tasklock locks are held matching" in empty


def test_stats_table_counts_guarded_runs(
    configured: RedisServer, r: redis.Redis, admin_client: Client
) -> None:
    guard = Guard(settle, "admin.settle", {"url": configured.url, "key_prefix": PREFIX})
    for n in range(3):
        assert run(guard, (n,)) == f"settled {n}"
    entered, finish = threading.Event(), threading.Event()

    def body(extra: dict[str, Any]) -> str:
        entered.set()
        assert finish.wait(30)
        return "held"

    holder = threading.Thread(target=run, args=(guard, (9,), body, "holder"))
    holder.start()
    try:
        assert entered.wait(10)
        assert run(guard, (9,)) == "skipped"
        page = admin_client.get(PAGE).content.decode()
        held = rows(page)
        (key,) = held
        assert held[key]["task-name"] == "admin.settle"
    finally:
        finish.set()
        holder.join(10)
    fleet.flush()
    page = admin_client.get(PAGE).content.decode()
    header = re.findall(r'<th scope="col" class="num">(\w+)</th>', page)
    assert header == [
        "ran",
        "duplicates",
        "waited",
        "retries",
        "lost",
        "backend_errors",
        "rate_limited",
    ]
    counts = dict(zip(header, stats_rows(page)["admin.settle"], strict=True))
    assert counts == {
        "ran": 4,
        "duplicates": 1,
        "waited": 0,
        "retries": 0,
        "lost": 0,
        "backend_errors": 0,
        "rate_limited": 0,
    }
    hour = admin_client.get(PAGE, {"window": "hour"}).content.decode()
    assert "Counts per task (the last hour)" in hour
    assert stats_rows(hour)["admin.settle"][:2] == [4, 1]
    assert rows(page) == {}  # the holder finished: nothing held


# -- force-release -------------------------------------------------------------------------------


def test_force_release_deletes_the_lock_shown(
    configured: RedisServer, r: redis.Redis, admin_client: Client
) -> None:
    lock = hold(r, "report:1")
    other = hold(r, "report:2")
    row = rows(admin_client.get(PAGE).content.decode())["report:1"]
    response = admin_client.post(
        RELEASE, {"key": row["post_key"], "value": row["post_value"]}, follow=True
    )
    assert response.redirect_chain == [(PAGE, 302)]
    (message,) = messages_of(response)
    assert message.startswith("Released 'report:1' (host ")
    assert f"fence {lock.fence}" in message
    assert not r.exists("report:1")
    assert not lock.owned()
    assert other.owned()
    assert set(rows(response.content.decode())) == {"report:2"}


def test_force_release_refuses_a_lock_taken_again_since_the_page(
    configured: RedisServer, r: redis.Redis, admin_client: Client
) -> None:
    first = hold(r, "report:1", task="job-1")
    row = rows(admin_client.get(PAGE).content.decode())["report:1"]
    # Between the page and the click: the holder finishes and someone else takes the lock.
    first.release()
    second = hold(r, "report:1", task="job-2")
    taken = r.get("report:1")
    response = admin_client.post(
        RELEASE, {"key": row["post_key"], "value": row["post_value"]}, follow=True
    )
    (message,) = messages_of(response)
    assert message == (
        "'report:1' changed since you looked (released, expired or taken again by someone "
        "else): not released."
    )
    assert r.get("report:1") == taken
    assert second.owned()
    shown = rows(response.content.decode())["report:1"]
    assert (shown["task"], shown["fence"]) == ("job-2", str(second.fence))


def test_force_release_of_a_key_that_is_not_utf8(
    configured: RedisServer, r: redis.Redis, admin_client: Client
) -> None:
    # A lock's value under a key of bytes that are not UTF-8 (Lock names are str, keys any bytes).
    source = hold(r, "source")
    value = r.get("source")
    assert value is not None
    r.set(b"bin-\xff", value, px=30_000)
    source.release()
    found = rows(admin_client.get(PAGE).content.decode())
    assert set(found) == {"bin-\\xff"}  # as `tasklock ls` prints it
    row = found["bin-\\xff"]
    response = admin_client.post(
        RELEASE, {"key": row["post_key"], "value": row["post_value"]}, follow=True
    )
    assert messages_of(response)[0].startswith("Released 'bin-\\xff'")
    assert not r.exists(b"bin-\xff")


def test_a_semaphore_permit_is_a_row_released_alone(
    configured: RedisServer, r: redis.Redis, admin_client: Client
) -> None:
    permits = []
    for task in ("job-1", "job-2"):
        permit = tasklock.Semaphore(
            r, "exports", 3, owner_info={"task": task}, raise_on_release_error=False
        )
        assert permit.acquire(blocking=False)
        permits.append(permit)
    page = admin_client.get(PAGE).content.decode()
    listed = re.findall(r'<tr class="tasklock-lock">(.*?)</tr>', page, re.S)
    assert len(listed) == 2
    assert all("permit (2 live)" in row for row in listed)
    target = next(row for row in listed if "job-1" in row)
    form = {
        field: re.search(rf'name="{field}" value="([^"]*)"', target).group(1)  # type: ignore[union-attr]
        for field in ("key", "value")
    }
    response = admin_client.post(RELEASE, form, follow=True)
    assert messages_of(response)[0].startswith("Released 'exports'")
    left = re.findall(r'<tr class="tasklock-lock">(.*?)</tr>', response.content.decode(), re.S)
    assert len(left) == 1
    assert "job-2" in left[0]
    assert "permit (1 live)" in left[0]
    assert r.zcard("exports") == 1


def test_a_malformed_release_form_releases_nothing(
    configured: RedisServer, r: redis.Redis, admin_client: Client
) -> None:
    hold(r, "report:1")
    response = admin_client.post(RELEASE, {"key": "!!!", "value": "x"}, follow=True)
    assert messages_of(response) == ["The release form was incomplete: nothing released."]
    assert admin_client.get(RELEASE).status_code == 405
    assert r.exists("report:1")


def test_release_needs_the_csrf_token(configured: RedisServer, r: redis.Redis) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("root", superuser=True))
    hold(r, "report:1")
    row = rows(client.get(PAGE).content.decode())["report:1"]
    forged = client.post(RELEASE, {"key": row["post_key"], "value": row["post_value"]})
    assert forged.status_code == 403
    assert r.exists("report:1")


# -- Redlock: every master -----------------------------------------------------------------------


def test_redlock_masters_are_merged_and_released_on_each(
    nodes: list[RedisServer], admin_client: Client
) -> None:
    clients = [node.client() for node in nodes]
    lock = tasklock.Redlock(
        clients, "ledger", owner_info={"task": "job-9", "name": "app.ledger"}, node_timeout=2
    )
    assert lock.acquire(blocking=False)
    value = next(
        v for v in (c.get("ledger") for c in clients) if v and v.endswith(b"#%d" % lock.fence)
    )
    # The masters as a reader may find them: acquire returns at a quorum, and a master can be
    # between Redlock's two rounds (the same hold, no fence yet). Written out, so the page reads
    # a known state rather than whatever the stragglers had done by then.
    for c in clients[:4]:
        c.set("ledger", value, px=30_000)
    clients[4].set("ledger", value.rsplit(b"#", 1)[0], px=30_000)
    with override_settings(TASKLOCK={"URLS": [node.url for node in nodes]}):
        page = admin_client.get(PAGE).content.decode()
        assert "the Redlock masters" in page
        found = rows(page)
        assert set(found) == {"ledger"}
        row = found["ledger"]
        assert (row["nodes"], row["fence"], row["task"]) == ("5 of 5", str(lock.fence), "job-9")
        response = admin_client.post(
            RELEASE, {"key": row["post_key"], "value": row["post_value"]}, follow=True
        )
        assert messages_of(response)[0].startswith("Released 'ledger'")
    assert [c.exists("ledger") for c in clients] == [0] * 5
    for c in clients:
        c.close()


@pytest.fixture(scope="module")
def etcd_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A single-node etcd for the module, as an ``etcd://`` URL (skipped without the binary)."""
    from tests.support.etcd_cluster import EtcdServer

    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield "etcd://" + server.url.removeprefix("http://")
    finally:
        server.stop()


def test_etcd_locks_are_listed_and_released_the_same_way(
    etcd_url: str, admin_client: Client
) -> None:
    from tasklock.etcd import Lock as EtcdLock

    endpoint = "http://" + etcd_url.removeprefix("etcd://")
    first = EtcdLock(endpoint, "etcd-report", owner_info={"task": "job-5", "name": "app.report"})
    assert first.acquire(blocking=False)
    with override_settings(TASKLOCK={"URL": etcd_url}):
        page = admin_client.get(PAGE).content.decode()
        assert "etcd keeps no fleet counts" in page
        row = rows(page)["etcd-report"]
        assert (row["task"], row["fence"]) == ("job-5", str(first.fence))
        # Taken again between the page and the click: refused.
        first.release()
        second = EtcdLock(endpoint, "etcd-report", owner_info={"task": "job-6"})
        assert second.acquire(blocking=False)
        form = {"key": row["post_key"], "value": row["post_value"]}
        refused = admin_client.post(RELEASE, form, follow=True)
        assert "changed since you looked" in messages_of(refused)[0]
        assert rows(refused.content.decode())["etcd-report"]["task"] == "job-6"
        row = rows(refused.content.decode())["etcd-report"]
        released = admin_client.post(
            RELEASE, {"key": row["post_key"], "value": row["post_value"]}, follow=True
        )
        assert messages_of(released)[0].startswith("Released 'etcd-report'")
        assert rows(released.content.decode()) == {}
    assert not second.locked()


@pytest.fixture(scope="module")
def zookeeper_url() -> Iterator[str]:
    """A standalone ZooKeeper for the module (skipped, naming the install command, without it)."""
    pytest.importorskip("kazoo")
    from tests.support.zookeeper import ZooKeeperServer

    server = ZooKeeperServer()
    server.start()
    try:
        yield server.url() + "?session_timeout=1"
    finally:
        server.close()


def test_zookeeper_locks_are_listed_and_released_the_same_way(
    zookeeper_url: str, admin_client: Client
) -> None:
    from tasklock.zookeeper import Lock as ZooKeeperLock

    first = ZooKeeperLock(zookeeper_url, "zk-report", owner_info={"task": "job-7"})
    assert first.acquire(blocking=False)
    with override_settings(TASKLOCK={"URL": zookeeper_url}):
        page = admin_client.get(PAGE).content.decode()
        assert "ZooKeeper keeps no fleet counts" in page
        row = rows(page)["zk-report"]
        assert (row["task"], row["fence"]) == ("job-7", str(first.fence))
        first.release()  # taken again between the page and the click: refused
        second = ZooKeeperLock(zookeeper_url, "zk-report", owner_info={"task": "job-8"})
        assert second.acquire(blocking=False)
        form = {"key": row["post_key"], "value": row["post_value"]}
        refused = admin_client.post(RELEASE, form, follow=True)
        assert "changed since you looked" in messages_of(refused)[0]
        row = rows(refused.content.decode())["zk-report"]
        assert row["task"] == "job-8"
        released = admin_client.post(
            RELEASE, {"key": row["post_key"], "value": row["post_value"]}, follow=True
        )
        assert messages_of(released)[0].startswith("Released 'zk-report'")
        assert rows(released.content.decode()) == {}
    assert not second.locked()


# -- nothing to read: an error box, not a 500 ----------------------------------------------------


def test_unreachable_redis_is_an_error_box(admin_client: Client) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(TASKLOCK={"URL": url}):
        response = admin_client.get(PAGE)
        assert response.status_code == 200
        page = response.content.decode()
        errors = re.search(r'<div class="errornote" id="tasklock-errors".*?</div>', page, re.S)
        assert errors is not None
        assert f"Could not read the locks on {url}" in html.unescape(errors.group(0))
        assert rows(page) == {}
        # Releasing against it is an error message too.
        released = admin_client.post(RELEASE, {"key": "a2V5", "value": "dg=="}, follow=True)
        assert released.status_code == 200
        assert messages_of(released)[0].startswith(f"Could not release 'key' on {url}")


def test_no_url_configured_is_an_error_box(admin_client: Client) -> None:
    response = admin_client.get(PAGE)
    assert response.status_code == 200
    assert (
        "No lock server is configured: set TASKLOCK[&#x27;URL&#x27;]" in response.content.decode()
    )


def test_an_invalid_setting_is_an_error_box(admin_client: Client) -> None:
    with override_settings(TASKLOCK={"URL": "redis://localhost:6379/0", "TTL": 0}):
        response = admin_client.get(PAGE)
    assert response.status_code == 200
    assert "The tasklock setting cannot be used" in response.content.decode()


def test_the_environment_url_is_read_without_a_setting(
    r: redis.Redis, redis_server: RedisServer, admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKLOCK_URL", redis_server.url)
    hold(r, "from-env")
    assert set(rows(admin_client.get(PAGE).content.decode())) == {"from-env"}
