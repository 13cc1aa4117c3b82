"""The process-pause problem, for real: a lock holder frozen past its TTL, and what fencing does.

Run it with ``python pause.py`` (``REDIS_URL`` names the Redis, default redis://localhost:6379/0).

1. Process A takes the lock and gets fence token N. Its watchdog renews the lock's 2 s TTL.
2. A freezes (SIGSTOP, as in a long GC pause or a VM migration). Its watchdog freezes with it, so
   the lock expires, and process B, which was waiting, takes it with token N+1 and writes.
3. A wakes up (SIGCONT) still believing it holds the lock, and writes with token N. The store
   (``store.py``: ``tasklock.fencing.sqlalchemy.fence()`` on SQLite) has seen N+1 and raises
   ``tasklock.StaleFence``. Without the token, A would have overwritten B's newer write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import store
from redis import Redis

import tasklock

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
DB = os.environ.get("STORE_DB", "store.sqlite3")
LOCK = "invoice:42"
TTL = 2.0


def holder(name: str) -> None:
    """One lock holder (runs as its own process): lock, report, write when told, release."""
    lock = tasklock.Lock(Redis.from_url(REDIS_URL), LOCK, timeout=TTL, watchdog=True)
    lock.acquire()
    print(f"acquired {lock.fence}", flush=True)
    sys.stdin.readline()  # working... until the orchestrator says "write now"
    try:
        store.write(DB, LOCK, f"paid by {name}", lock.fence)
        print(f"accepted {lock.fence}", flush=True)
    except tasklock.StaleFence as stale:  # a newer token has written: nothing was changed
        print(f"rejected {stale.newer}", flush=True)
    try:
        lock.release()
        print("released", flush=True)
    except tasklock.LockNotOwnedError:
        print("not-owned", flush=True)


class Holder:
    """The orchestrator's handle on one holder process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, __file__, "holder", name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def expect(self, *words: str) -> list[str]:
        line = self.process.stdout.readline().split() if self.process.stdout else []
        if not line or line[0] not in words:
            raise SystemExit(f"{self.name}: expected {' or '.join(words)}, got {line}")
        return line

    def write_now(self) -> list[str]:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        return self.expect("accepted", "rejected")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGCONT)  # never leave a frozen process behind
        self.process.kill()
        self.process.wait()


def main() -> None:
    a = Holder("A")
    b = None
    try:
        fence_a = a.expect("acquired")[1]
        print(
            f"A: holds {LOCK!r} with fence token {fence_a} (TTL {TTL:g} s, renewed by its watchdog)"
        )
        os.kill(a.process.pid, signal.SIGSTOP)
        print("A: frozen (SIGSTOP): a GC pause, a VM migration... its watchdog is frozen too")

        started = time.monotonic()
        b = Holder("B")  # blocks in lock.acquire() until A's lock expires
        fence_b = b.expect("acquired")[1]
        waited = time.monotonic() - started
        print(f"B: took the lock after {waited:.1f} s, when A's TTL ran out: fence token {fence_b}")
        print(f"B: writes 'paid by B' with token {fence_b}: {b.write_now()[0]}")
        b.expect("released")

        os.kill(a.process.pid, signal.SIGCONT)
        print("A: resumes (SIGCONT), unaware that its lock expired, and writes 'paid by A'")
        verdict, highest = a.write_now()
        print(f"A: write with token {fence_a}: {verdict.upper()} (the store has seen {highest})")
        released = a.expect("released", "not-owned")[0]
        print(f"A: release(): {'ok' if released == 'released' else 'LockNotOwnedError'}")
        value, fence = store.read(DB, LOCK) or ("?", 0)
        print(f"store: {LOCK} = {value!r} (token {fence})")
    finally:
        for holder_process in (a, b):
            if holder_process is not None:
                holder_process.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["holder"]:
        holder(sys.argv[2])
    else:
        main()
