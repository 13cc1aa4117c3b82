"""The ``tasklock`` command's arguments: every subcommand, its options and their help.

Kept apart from :mod:`tasklock.cli` (which runs the commands) so that each file has one job;
the option types that check values as they are parsed are in :mod:`tasklock.ops.options`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TypeAlias

from tasklock.core.base import DEFAULT_TTL
from tasklock.ops.fleet_view import WINDOWS
from tasklock.ops.options import fence_number, non_empty, port_number, positive_seconds
from tasklock.ops.stores import DEFAULT_URL, URL_ENV, URLS_ENV

__all__ = ["Handler", "build_parser"]

#: A command: takes the parsed arguments, returns the exit status.
Handler = Callable[[argparse.Namespace], int]
#: What ``add_subparsers`` returns: each command group adds its commands to it. (A string: the
#: class is generic only in the type stubs.)
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        metavar="URL",
        help=f"Redis, etcd:// or zookeeper:// URL (default: ${URL_ENV}, else {DEFAULT_URL})",
    )


def _add_nodes(parser: argparse.ArgumentParser, *, etcd: bool = True) -> None:
    """``--url``, or ``--urls`` for Redlock's masters (which these commands read all of);
    ``etcd``: the command reads etcd too (the exporter does not)."""
    nodes = parser.add_mutually_exclusive_group()
    etcd_form = " or etcd://h1,h2 or zookeeper://h1,h2/chroot" if etcd else ""
    nodes.add_argument(
        "--url",
        metavar="URL",
        help=f"one Redis (redis+cluster://h1,h2 for a cluster){etcd_form} (default: "
        f"${URLS_ENV} or ${URL_ENV}, else {DEFAULT_URL})",
    )
    nodes.add_argument(
        "--urls",
        nargs="+",
        metavar="URL",
        help="Redlock's masters, space- or comma-separated: every one is read",
    )


def _add_prefix(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prefix",
        default="tasklock",
        type=non_empty,
        metavar="PREFIX",
        help="the tasks' key prefix (their key_prefix option; default: tasklock)",
    )


def build_parser(handlers: Mapping[str, Handler]) -> argparse.ArgumentParser:
    """The parser of every command; ``handlers`` maps each command's name to the function
    that runs it (set as the parsed arguments' ``handler``)."""
    parser = argparse.ArgumentParser(
        prog="tasklock",
        description="Inspect, release and check tasklock's locks on Redis, etcd or ZooKeeper; read "
        "and export "
        "the fleet's counts.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_lock_commands(sub, handlers)
    _add_doctor(sub, handlers)
    _add_count_commands(sub, handlers)
    _add_demo(sub, handlers)
    return parser


def _add_lock_commands(sub: Subcommands, handlers: Mapping[str, Handler]) -> None:
    """``ls``, ``show`` and ``release``: the held locks themselves."""
    ls = sub.add_parser(
        "ls",
        help="list held locks, newest first",
        description="Every held lock and semaphore permit: of one Redis, of every master of a "
        "Redis Cluster, or (--urls) of Redlock's masters, merged, with the masters holding each.",
    )
    _add_nodes(ls)
    ls.add_argument(
        "--match",
        default="*",
        type=non_empty,
        metavar="PATTERN",
        help="only keys matching this glob (SCAN MATCH syntax; default: *)",
    )
    ls.add_argument("--json", action="store_true", help="print a JSON list for scripts")
    ls.set_defaults(handler=handlers["ls"])

    show = sub.add_parser("show", help="one lock in detail")
    show.add_argument("key", metavar="KEY", help="the lock key (as printed by `tasklock ls`)")
    _add_url(show)
    show.add_argument("--json", action="store_true", help="print JSON for scripts")
    show.set_defaults(handler=handlers["show"])

    _add_release(sub, handlers)


def _add_release(sub: Subcommands, handlers: Mapping[str, Handler]) -> None:
    """``release``: the one command that writes, so it asks for --force and names one permit."""
    release = sub.add_parser(
        "release",
        help="force-release a stuck lock or semaphore permit (owner-aware; needs --force)",
        description="Delete a held lock whose holder is gone. Shows the holder first and deletes "
        "only if the lock still has the value shown. Waiting for the TTL is safer. For a "
        "semaphore, name the permit with --fence or --token; only that permit is released.",
    )
    release.add_argument("key", metavar="KEY", help="the lock key (as printed by `tasklock ls`)")
    release.add_argument(
        "--force", action="store_true", help="required: you accept breaking mutual exclusion"
    )
    permit = release.add_mutually_exclusive_group()
    permit.add_argument(
        "--fence",
        type=fence_number,
        metavar="N",
        help="the permit (of a semaphore) or lock holding this fence token, as `ls` shows it",
    )
    permit.add_argument(
        "--token",
        metavar="TOKEN",
        help="the permit or lock of this owner token (32 hex digits, as `show` lists them)",
    )
    release.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _add_url(release)
    release.set_defaults(handler=handlers["release"])


def _add_doctor(sub: Subcommands, handlers: Mapping[str, Handler]) -> None:
    """``doctor``: checks of the setup, not of any one lock."""
    doctor = sub.add_parser(
        "doctor",
        help="check a Redis, etcd or ZooKeeper setup for what can break locks",
        description="Redis: eviction policy, persistence, replicas, version, latency and (for "
        "several nodes) clocks and duplicates. etcd: version, health, leader, members, a probe "
        "lock and that every endpoint is one cluster. ZooKeeper: a session (its timeout within "
        "the servers' bounds, the chroot there), the version and a probe lock. Exit status 1 when "
        "a check fails.",
    )
    _add_nodes(doctor)
    doctor.add_argument(
        "--ttl",
        type=positive_seconds,
        default=DEFAULT_TTL,
        metavar="SECONDS",
        help=f"lock TTL for the clock drift allowance (default: {DEFAULT_TTL:g})",
    )
    doctor.add_argument("--strict", action="store_true", help="warnings also exit 1")
    doctor.add_argument("--json", action="store_true", help="print JSON for scripts")
    doctor.set_defaults(handler=handlers["doctor"])


def _add_count_commands(sub: Subcommands, handlers: Mapping[str, Handler]) -> None:
    """``stats`` and ``exporter``: the fleet's counts, read once or served to Prometheus."""
    stats = sub.add_parser(
        "stats",
        help="the fleet's counts per task: ran, duplicates, waits, retries, lost, errors",
        description="Counts every worker's task layer writes to Redis (within a second of each "
        "decision). With --urls, every Redlock master is read and the counts summed.",
    )
    _add_nodes(stats)
    stats.add_argument(
        "--window",
        choices=WINDOWS,
        default="total",
        help="total (default: since the counts began), or the last hour or day",
    )
    _add_prefix(stats)
    stats.add_argument(
        "--json",
        action="store_true",
        help="print a JSON object keyed by task name, each an object of integer counts",
    )
    stats.set_defaults(handler=handlers["stats"])

    exporter = sub.add_parser(
        "exporter",
        help="serve the fleet's counts and held locks to Prometheus",
        description="An HTTP /metrics endpoint for Prometheus, read from Redis at each scrape "
        "(needs pip install 'tasklock[prometheus]'). Runs until Ctrl-C.",
    )
    _add_nodes(exporter, etcd=False)
    exporter.add_argument(
        "--port", type=port_number, required=True, metavar="N", help="the port to listen on"
    )
    exporter.add_argument(
        "--addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address to listen on (default: 127.0.0.1; 0.0.0.0 for every interface)",
    )
    _add_prefix(exporter)
    exporter.set_defaults(handler=handlers["exporter"])


def _add_demo(sub: Subcommands, handlers: Mapping[str, Handler]) -> None:
    """``demo``: the only command that starts servers and workers of its own."""
    demo = sub.add_parser(
        "demo",
        help="run the demo: real workers, duplicate work, fence tokens",
        description="Starts an embedded redis-server unless --url is given.",
    )
    demo.add_argument("--url", metavar="URL", help="use this Redis instead of an embedded one")
    demo.set_defaults(handler=handlers["demo"])
