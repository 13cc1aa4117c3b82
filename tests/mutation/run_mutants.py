"""Hand-made mutants of the safety-critical code, each run against the lock and task tests.

    python tests/mutation/run_mutants.py [--list] [NAME ...]

Each mutant breaks one safety rule the way a careless change would (an owner check dropped from
a release or extend script, a fence that does not step, a quorum of half, a release not in
``finally``, a watchdog that reports a lost hold renewed, a lease that never runs out by the
clock). The source tree is copied, the mutant applied to the copy, and the tests named for it run
against the copy (``PYTHONPATH``; worker subprocesses inherit it). A mutant is *killed* when
those tests fail. Every one must be killed by the lock and task tests themselves: the CLI's are
never among the tests run, so a rule covered only there shows up as a survivor.

Why a script of our own rather than mutmut: the rules live as much in Lua inside Python strings
as in Python, and a mutant per rule, named and explained, is what a reviewer needs to see; a
generic mutator would spend its time on log messages and never touch the Lua.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutant:
    name: str
    why: str
    path: str  # under src/tasklock
    old: str
    new: str
    tests: tuple[str, ...]


BASICS = "tests/integration/test_lock_basics.py"
REDLOCK = "tests/integration/test_redlock.py"

MUTANTS = (
    Mutant(
        "release-no-owner-check",
        "the plain RELEASE deletes whoever holds the key",
        "core/scripts.py",
        "if redis.pcall('GET', KEYS[1]) == ARGV[1] then\n  redis.call('DEL', KEYS[1])\n  if type("
        "redis.pcall('PUBLISH', ARGV[2], KEYS[1])) == 'table' then",
        "if redis.pcall('GET', KEYS[1]) then\n  redis.call('DEL', KEYS[1])\n  if type("
        "redis.pcall('PUBLISH', ARGV[2], KEYS[1])) == 'table' then",
        (BASICS,),
    ),
    Mutant(
        "extend-no-owner-check",
        "EXTEND (and the watchdog's renewal) extends whoever holds the key",
        "core/scripts.py",
        "if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then\n  return 0\nend\nlocal ttl",
        "if not redis.pcall('GET', KEYS[1]) then\n  return 0\nend\nlocal ttl",
        (BASICS,),
    ),
    Mutant(
        "fair-release-no-owner-check",
        "the fair lock's release deletes whoever holds the key",
        "core/queue_scripts.py",
        "if redis.pcall('GET', KEYS[1]) == ARGV[1] then",
        "if redis.pcall('GET', KEYS[1]) then",
        (BASICS,),
    ),
    Mutant(
        "permit-release-takes-any",
        "a semaphore's release removes the oldest permit, whoever's",
        "core/scripts.py",
        "local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])\nif not expires then\n  return 0\n"
        "end\nredis.call('ZREM', KEYS[1], ARGV[1])\nlocal now = redis.call('TIME')",
        "local expires = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]\n"
        "redis.call('ZPOPMIN', KEYS[1])\nlocal now = redis.call('TIME')",
        (BASICS,),
    ),
    Mutant(
        "fair-permit-release-takes-any",
        "the fair semaphore's release removes the oldest permit, whoever's",
        "core/queue_scripts.py",
        "local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])\nif not expires then\n  return 0\n"
        "end\nredis.call('ZREM', KEYS[1], ARGV[1])\nlocal now = now_ms()",
        "local expires = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]\n"
        "redis.call('ZPOPMIN', KEYS[1])\nlocal now = now_ms()",
        (BASICS,),
    ),
    Mutant(
        "permit-extend-any",
        "a semaphore's extend renews a permit it does not have",
        "core/scripts.py",
        "local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])\nif not expires then\n  return 0\n"
        "end\nlocal now = redis.call('TIME')\nlocal ms",
        "local expires = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]\n"
        "local now = redis.call('TIME')\nlocal ms",
        (BASICS,),
    ),
    Mutant(
        "redlock-release-no-owner-check",
        "Redlock's release deletes whoever holds the key on each master",
        "core/scripts.py",
        "if value == ARGV[1] or value == ARGV[2] then\n  redis.call('DEL', KEYS[1])",
        "if value then\n  redis.call('DEL', KEYS[1])",
        (REDLOCK,),
    ),
    Mutant(
        "redlock-extend-no-owner-check",
        "Redlock's extend and renewal extend whoever holds the key",
        "core/scripts.py",
        "if value ~= ARGV[1] and value ~= ARGV[2] then\n  return 0\nend\n"
        "local ttl = tonumber(ARGV[3])",
        "if not value then\n  return 0\nend\nlocal ttl = tonumber(ARGV[3])",
        (REDLOCK,),
    ),
    Mutant(
        "fence-does-not-step",
        "a fence equal to the last one issued (fences must strictly increase)",
        "core/scripts.py",
        "if last and last >= fence then\n    fence = last + 1",
        "if last and last >= fence then\n    fence = last",
        ("tests/integration/test_fences.py",),
    ),
    Mutant(
        "quorum-of-half",
        "Redlock takes the lock on half of the masters",
        "core/quorum.py",
        "    return n // 2 + 1",
        "    return max(1, n // 2)",
        (REDLOCK, "tests/unit/test_redlock_math.py"),
    ),
    Mutant(
        "task-release-not-in-finally",
        "a task whose body raises keeps its lock until the TTL",
        "guard.py",
        "        finally:\n            self._release(lock)",
        "        except BaseException:\n            raise\n"
        "        else:\n            self._release(lock)",
        ("tests/integration/test_guard.py",),
    ),
    Mutant(
        "renewal-always-renewed",
        "the watchdog takes a renewal that found the key gone for a renewal",
        "core/renewal.py",
        "    return Outcome.RENEWED if answer else Outcome.LOST",
        "    return Outcome.RENEWED",
        ("tests/integration/test_watchdog.py",),
    ),
    Mutant(
        "renewal-too-late",
        "the watchdog renews after the TTL instead of at a third of it",
        "core/renewal.py",
        "entry.due = max(flight.started + entry.ttl / 3, now)",
        "entry.due = max(flight.started + entry.ttl * 3, now)",
        ("tests/integration/test_watchdog.py",),
    ),
    Mutant(
        "lease-never-runs-out-by-the-clock",
        "lost ignores this process's clock: a paused holder acts once more on its old fence",
        "core/hold.py",
        "        return at is not None and now >= at",
        "        return False",
        ("tests/integration/test_lost_by_clock.py",),
    ),
)


def run(mutant: Mutant, workdir: Path) -> tuple[bool, float, str]:
    """Apply ``mutant`` to a fresh copy of the source; (killed, seconds, last line of pytest)."""
    src = workdir / "src"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
    target = src / "tasklock" / mutant.path
    text = target.read_text()
    if text.count(mutant.old) != 1:
        raise SystemExit(f"mutant {mutant.name}: its code is not in {mutant.path} once: update it")
    target.write_text(text.replace(mutant.old, mutant.new))
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return result.returncode != 0, time.monotonic() - started, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="run only these mutants (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    if args.list or not chosen:
        for mutant in MUTANTS:
            print(f"{mutant.name:<36} {mutant.why}")
        return 0 if chosen or args.list else 2
    survivors = []
    with tempfile.TemporaryDirectory(prefix="tasklock-mutants-") as tmp:
        for mutant in chosen:
            killed, seconds, last = run(mutant, Path(tmp))
            verdict = "killed  " if killed else "SURVIVED"
            print(f"{verdict} {mutant.name:<36} {seconds:5.1f} s  {last}", flush=True)
            if not killed:
                survivors.append(mutant.name)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
