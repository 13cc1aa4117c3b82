"""Run every benchmark, one after another, each in its own process (``tox -e bench``).

Each benchmark starts its own redis-server processes and workers and prints its table with
ratios; this driver only runs them in turn and fails if one fails. ``--quick`` uses small counts
(a smoke run that the figures should not be quoted from).

    python tests/benchmarks/run_all.py [--quick] [lock redlock celery rq asyncio semaphore
        contention rate enqueue task_instructions fencing etcd zookeeper]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

QUICK = {
    "lock": ["--cycles", "100", "--rounds", "5", "--handoffs", "50", "--held", "200"],
    "redlock": ["--cycles", "50", "--rounds", "3"],
    "celery": ["--n", "200", "--rounds", "2"],
    "rq": ["--n", "200", "--fork-n", "30", "--rounds", "2"],
    "asyncio": [
        "--cycles",
        "100",
        "--rounds",
        "5",
        "--handoffs",
        "50",
        "--redlock-cycles",
        "50",
        "--idle-repeats",
        "1",
    ],
    "semaphore": ["--cycles", "50", "--rounds", "3", "--seconds", "0.3"],
    "contention": ["--quick"],
    "rate": ["--calls", "30", "--rounds", "3", "--cost-calls", "100", "--seconds", "0.5"],
    "enqueue": ["--n", "100", "--rounds", "3"],
    "task_instructions": ["--calls", "200"],
    "fencing": ["--calls", "10", "--rounds", "3"],
    "etcd": ["--rounds", "3", "--round-ms", "30", "--warmup", "0.1"],
    "zookeeper": ["--rounds", "3", "--round-ms", "30", "--warmup", "0.1"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"some of: {' '.join(QUICK)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in QUICK]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(QUICK)}")
    failed = []
    for name in args.names or list(QUICK):
        command = [
            sys.executable,
            str(HERE / f"bench_{name}.py"),
            *(QUICK[name] if args.quick else []),
        ]
        print(f"\n=== bench_{name} ({time.strftime('%Y-%m-%d %H:%M')})", flush=True)
        if subprocess.run(command, cwd=ROOT).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
