"""Smoke test: the process-pause scenario with real processes and real signals. The frozen holder's
write is rejected, the newer holder's write stands."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.servers import RedisServer

from examples.conftest import PYTHON, Processes
from examples.fenced_write import store

HERE = Path(__file__).resolve().parent


def number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return int(found.group(1))


def test_the_paused_holders_stale_write_is_rejected(
    redis_server: RedisServer, processes: Processes, tmp_path: Path
) -> None:
    db = str(tmp_path / "store.sqlite3")
    env = {"REDIS_URL": redis_server.url, "STORE_DB": db}

    result = processes.run([PYTHON, "pause.py"], HERE, env)

    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    fence_a = number(r"A: holds 'invoice:42' with fence token (\d+)", out)
    fence_b = number(r"when A's TTL ran out: fence token (\d+)", out)
    assert fence_b > fence_a
    assert f"B: writes 'paid by B' with token {fence_b}: accepted" in out
    assert f"A: write with token {fence_a}: REJECTED (the store has seen {fence_b})" in out
    assert "A: release(): LockNotOwnedError" in out
    assert store.read(db, "invoice:42") == ("paid by B", fence_b)
    assert not redis_server.client().exists("invoice:42"), "B released the lock"
