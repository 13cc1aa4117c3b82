"""tasklock's Django admin page once in a real browser: headless Chromium (the OS package, driven
by Playwright) against Django's live server, a superuser who logs in through the admin's form,
sees a held lock and force-releases it with the page's button (and its confirmation dialog).

Skipped, saying why, where Playwright or a Chromium is missing. To run it::

    apt-get install chromium       # Debian/Ubuntu: /usr/bin/chromium
    pytest tests/integration/test_django_admin_browser.py

Playwright's own browsers (``playwright install chromium``) are not needed: the test launches the
system's Chromium (``TASKLOCK_TEST_CHROMIUM`` names another binary).

The live server is Django's ``LiveServerThread`` on a free port, sharing the main thread's
in-memory SQLite connection (as ``LiveServerTestCase`` does), so the user created here can log in
there. Every wait is Playwright's: on a navigation, or for an element or text to appear.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator

import pytest
import redis
from django.test import override_settings

import tasklock
from tests.support.servers import RedisServer


def chromium_or_skip_reason() -> tuple[str | None, str]:
    """The Chromium binary to drive, or None and why the test cannot run here."""
    if importlib.util.find_spec("playwright") is None:
        return None, "Playwright is not installed (pip install playwright)"
    given = os.environ.get("TASKLOCK_TEST_CHROMIUM")
    found = given or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        return None, (
            "no Chromium on PATH: install the OS package (apt-get install chromium) or set "
            "TASKLOCK_TEST_CHROMIUM to a Chromium binary"
        )
    return found, ""


CHROMIUM, SKIP_REASON = chromium_or_skip_reason()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)


@pytest.fixture(scope="module", autouse=True)
def django_project() -> None:
    from tests.django_project import setup

    setup()  # and migrates the in-memory default database: users, sessions, permissions


@pytest.fixture
def live_server() -> Iterator[str]:
    """The project served over HTTP on a free port, in a thread, with the admin's static files."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.db import connections
    from django.test.testcases import LiveServerThread

    connection = connections["default"]
    connection.inc_thread_sharing()
    thread = LiveServerThread(
        "localhost", StaticFilesHandler, connections_override={"default": connection}, port=0
    )
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    try:
        if thread.error:
            raise thread.error
        yield f"http://localhost:{thread.port}"
    finally:
        thread.terminate()
        connection.dec_thread_sharing()


def test_a_superuser_force_releases_a_held_lock_in_the_browser(
    live_server: str, r: redis.Redis, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.contrib.auth.models import User
    from playwright.sync_api import expect, sync_playwright

    for name in ("TASKLOCK_URL", "TASKLOCK_URLS", "TASKLOCK_KEY_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    User.objects.filter(username="browser-root").delete()
    User.objects.create_superuser("browser-root", password="correct horse")
    lock = tasklock.Lock(
        r,
        "invoice:42",
        owner_info={"task": "job-7", "name": "billing.settle"},
        raise_on_release_error=False,
    )
    assert lock.acquire(blocking=False)
    bystander = tasklock.Lock(r, "invoice:43", raise_on_release_error=False)
    assert bystander.acquire(blocking=False)

    with (
        override_settings(TASKLOCK={"URL": redis_server.url}),
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page()
            page.goto(f"{live_server}/admin/tasklock/heldlock/")
            # Not logged in: the admin's login form, which comes back to the page.
            page.fill("#id_username", "browser-root")
            page.fill("#id_password", "correct horse")
            with page.expect_navigation():
                page.click("input[type=submit]")
            assert page.url.endswith("/admin/tasklock/heldlock/")
            expect(page.locator("h1")).to_have_text("Held locks")

            row = page.locator("tr.tasklock-lock", has_text="invoice:42")
            expect(row).to_have_count(1)
            expect(row.locator(".tasklock-task-name")).to_have_text("billing.settle")
            expect(row.locator(".tasklock-task")).to_have_text("job-7")
            expect(row.locator(".tasklock-fence")).to_have_text(str(lock.fence))
            expect(page.locator("tr.tasklock-lock")).to_have_count(2)

            page.on("dialog", lambda dialog: dialog.accept())  # "Force-release this lock?"
            with page.expect_navigation():
                row.locator("input[value=Force-release]").click()
            expect(page.locator(".messagelist .success")).to_contain_text("Released 'invoice:42'")
            expect(page.locator("tr.tasklock-lock", has_text="invoice:42")).to_have_count(0)
            expect(page.locator("tr.tasklock-lock", has_text="invoice:43")).to_have_count(1)
        finally:
            browser.close()
    assert not r.exists("invoice:42")
    assert r.exists("invoice:43")
    assert not lock.owned()
