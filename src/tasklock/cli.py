"""The ``tasklock`` command: see who holds which lock, release a stuck one, check a server.

Semaphores too: ``ls`` lists each live permit as a row of its own, ``show`` of a semaphore's name
lists its permits, and ``release`` of one takes ``--fence`` or ``--token`` to name the permit (a
semaphore has several holders, so "release it" would be ambiguous); it never deletes the set.

Redis, etcd or ZooKeeper: the URL's scheme chooses the backend in the registry
(:mod:`tasklock.backends`): ``etcd://h1:2379,h2:2379`` (``etcds://``) selects etcd,
``zookeeper://h1:2181,h2:2181/chroot`` ZooKeeper, any other a Redis. The commands are written
once against :class:`tasklock.ops.stores.Store`, so their text, ``--json``, confirmations and
exit codes are the same on each, and scripts work on any (on etcd the fence is the key's create
revision, on ZooKeeper the holder node's czxid; ``show`` says there is no counter).

Several Redis nodes: ``ls`` on a ``redis+cluster://`` URL lists every master's keys. With
``--urls`` (Redlock's masters) ``ls`` reads every master and shows each holder of a key once, with
the masters holding it (NODES ``3/5``; JSON ``nodes``), and ``stats`` sums every master's counts
(:mod:`tasklock.ops.masters`, :mod:`tasklock.ops.fleet_view`). A master that does not answer is
named on stderr, the others are still shown, and the exit status is 1.

This module is the argument layer only: it resolves URLs, calls :mod:`tasklock.ops` and prints.
Exit status: 0 success, 1 failure (server unreachable, lock not found, doctor found a problem),
2 usage error (bad option, bad URL, a URL naming a server that is not etcd, ``release`` without
``--force``, or of a semaphore without ``--fence``/``--token``, ``stats`` or ``exporter`` of an
etcd URL, ``exporter`` without prometheus_client). Expected errors are one line on stderr saying
what is wrong and what to do; no tracebacks.

URLs: ``--url`` or ``--urls`` (``ls``, ``stats``, ``doctor``, ``exporter``), else
``$TASKLOCK_URLS`` (comma-separated; an etcd or ZooKeeper URL there is one cluster, its hosts
comma-separated)
for those commands, else ``$TASKLOCK_URL``, else ``redis://localhost:6379/0``.

Keys: ``ls`` prints each key as one line of printable text (backslash escapes for bytes that are
not UTF-8, newlines and other characters that do not print: see
:func:`tasklock.ops.inspect.key_text`), and ``show`` and ``release`` read a KEY in that same form,
so whatever ``ls`` printed can be pasted back. A KEY passed as raw bytes (``$'bin-\\xff'`` in
bash) is found too: the bytes of argv are recovered with ``os.fsencode``. No value a server can
hold makes the command print a traceback: output that the terminal's encoding cannot take is
escaped (``\\uNNNN``), which ``show`` reads back as the same key.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from typing import Any

import redis.exceptions as redis_errors

from tasklock.core.urls import validate_url
from tasklock.errors import BackendUnavailable, ConfigurationError
from tasklock.ops import arguments
from tasklock.ops.arguments import Handler
from tasklock.ops.exporter import serve_exporter
from tasklock.ops.fleet_view import read_fleet, stats_text
from tasklock.ops.inspect import KeyState, LockInfo, key_from_text, key_text, printable
from tasklock.ops.masters import list_across, masters_text
from tasklock.ops.options import argv_bytes
from tasklock.ops.permits import find_permit
from tasklock.ops.render import (
    holder_line,
    lock_details,
    lock_table,
    permit_list,
    semaphore_details,
    with_fence_note,
)
from tasklock.ops.stores import (
    DEFAULT_URL,
    Store,
    backend_of,
    doctor_for,
    open_store,
    resolve_url,
    resolve_urls,
)

__all__ = ["DEFAULT_URL", "build_parser", "main"]


class CommandFailed(Exception):
    """An expected failure: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# --- keys ---------------------------------------------------------------------------------------


def key_argument(text: str) -> str:
    """The key a KEY argument names (``surrogateescape`` form): the form ``ls`` prints, or raw
    bytes. A malformed escape is a usage error saying how keys are written."""
    typed = argv_bytes(text).decode("utf-8", "surrogateescape")  # keys are UTF-8 + bytes
    try:
        return key_from_text(typed)
    except ValueError as exc:
        raise CommandFailed(f"KEY {exc}", code=2) from None


def _quoted(key: str) -> str:
    return f"'{key_text(key)}'"


# --- commands -----------------------------------------------------------------------------------


def _store(args: argparse.Namespace) -> Store:
    url, origin = resolve_url(args.url)
    return open_store(url, origin)


def _warn(message: str) -> None:
    print(f"tasklock: warning: {_LINE_BREAKS.sub(' ', message.strip())}", file=sys.stderr)


def _masters_down(errors: dict[str, str], what: str) -> int:
    """Name each master that did not answer on stderr; the exit status then is 1 (the output
    shown is the other masters' only)."""
    for url, why in errors.items():
        _warn(f"master {url} did not answer; {what}. {why}")
    return 1 if errors else 0


def cmd_ls(args: argparse.Namespace) -> int:
    urls, origin = resolve_urls(args.url, args.urls)
    # The pattern is a SCAN glob (its backslashes escape * ? [), sent as the bytes typed.
    match = argv_bytes(args.match)
    if len(urls) > 1:  # Redlock: every master read, one row per lock value and its masters
        view = list_across(urls, origin, match)
        if args.json:
            print(json.dumps([entry.to_json() for entry in view.held], indent=2))
        else:
            print(masters_text(view, args.match))
        return _masters_down(view.errors, "listing the other masters")
    store = open_store(urls[0], origin)
    locks = store.list_locks(match)
    if args.json:
        print(json.dumps([info.to_json() for info in locks], indent=2))
    elif not locks:
        print(
            f"No tasklock locks held on {store.where} matching {args.match!r} "
            "(and no semaphore permits)."
        )
    else:
        print(lock_table(locks))
    return 0


def _held_lock(state: KeyState, store: Store, typed: str) -> LockInfo:
    """The lock ``state`` holds; a CommandFailed saying what it is when it is no tasklock lock.
    ``typed`` is the KEY argument as given, for the hint on how keys are read."""
    where = store.where
    if not state.exists:
        hint = ""
        if "\\" in typed:
            hint = (
                ". KEY is read as `tasklock ls` prints keys, where \\\\ is one backslash and "
                "\\n, \\t, \\xNN are escapes; `tasklock ls` shows the key to give"
            )
        raise CommandFailed(
            f"{_quoted(state.key)} is not held on {where} (no such key: released or expired)" + hint
        )
    if state.type != "string":
        raise CommandFailed(
            f"{_quoted(state.key)} on {where} is a Redis {state.type}, not a tasklock lock "
            "(`tasklock ls` lists the locks)"
        )
    if state.lock is None:
        shown = (state.raw_value or b"")[:80].decode("utf-8", "backslashreplace")
        raise CommandFailed(
            f"{_quoted(state.key)} on {where} does not hold a tasklock lock value (it holds "
            f"{shown!r}: a fence counter, an enqueue marker or another library's key); tasklock "
            "leaves it alone"
        )
    return state.lock


def _live_permits(store: Store, key: str) -> list[LockInfo]:
    """The live permits of the semaphore at ``key``; a CommandFailed when it has none."""
    permits = store.permits(key)
    if not permits:
        raise CommandFailed(
            f"{_quoted(key)} on {store.where} is a Redis zset with no live tasklock permit "
            "(a semaphore whose permits all expired or were released, or another library's "
            "sorted set); tasklock leaves it alone"
        )
    return permits


def cmd_show(args: argparse.Namespace) -> int:
    key = key_argument(args.key)
    store = _store(args)
    state = store.read(key)
    if store.is_semaphore(state):  # a Semaphore: its permits, first to free first
        permits = _live_permits(store, key)
        counters, labels, counters_json = store.fence_counters(key)
        if args.json:
            semaphore = {"key": key_text(key), "kind": "semaphore", "permits": len(permits)}
            semaphore["holders"] = [permit.to_json() for permit in permits]
            semaphore["fence_counters"] = counters_json
            print(json.dumps(semaphore, indent=2))
        else:
            details = semaphore_details(key, permits, counters, labels, backend=backend_of(store))
            print(with_fence_note(details, key, store.fence_note))
        return 0
    lock = _held_lock(state, store, args.key)
    counters, labels, counters_json = store.fence_counters(key)
    if args.json:
        data = lock.to_json()
        data["fence_counters"] = counters_json
        print(json.dumps(data, indent=2))
    else:
        details = lock_details(lock, counters, labels)
        print(with_fence_note(details, key, store.fence_note))
    return 0


FORCE_REFUSAL = (
    "refusing to release {key} without --force: releasing a held lock breaks mutual exclusion "
    "(its holder keeps running and a second one can start). Prefer waiting for its TTL, which "
    "frees the lock of a dead holder on its own; use --force only when the holder is gone"
)


def confirm(prompt: str) -> bool:
    """Ask on the terminal; no terminal, end of input or anything but y/yes is a no."""
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        print(
            "tasklock: no terminal to confirm on: nothing released (pass --yes to release "
            "without asking)",
            file=sys.stderr,
        )
        return False
    sys.stderr.write(prompt)
    sys.stderr.flush()
    answer = stdin.readline()
    if not answer:
        sys.stderr.write("\n")
        return False
    return answer.strip().lower() in ("y", "yes")


def cmd_release(args: argparse.Namespace) -> int:
    key = key_argument(args.key)
    if not args.force:
        raise CommandFailed(FORCE_REFUSAL.format(key=_quoted(key)), code=2)
    store = _store(args)
    state = store.read(key)
    if store.is_semaphore(state):
        return _release_permit(store, key, args)
    lock = _held_lock(state, store, args.key)
    if _named(args) and find_permit([lock], args.fence, args.token) is None:
        raise CommandFailed(
            f"{_quoted(key)} is a lock held by {holder_line(lock)}, which {_named(args)} does "
            "not name: nothing released"
        )
    print(f"{key_text(key)} is held by {holder_line(lock)}")
    if not args.yes and not confirm(
        "Release it now? Its holder, if still running, will no longer be exclusive. [y/N] "
    ):
        print("Not released.")
        return 1
    if store.release(lock):
        print(f"Released {key_text(key)}; waiters were woken.")
        return 0
    now = store.read(key)
    if now.lock is not None:
        current = f"now held by {holder_line(now.lock)}"
    elif now.exists:
        current = f"now a {now.type} that is not a tasklock lock"
    else:
        current = "no longer held"
    raise CommandFailed(
        f"{_quoted(key)} changed since it was shown ({current}): nothing released; run the "
        "command again to see the current holder"
    )


def _named(args: argparse.Namespace) -> str:
    """The ``--fence N`` or ``--token TOKEN`` given, as typed; "" when neither was."""
    if args.fence is not None:
        return f"--fence {args.fence}"
    return "" if args.token is None else f"--token {printable(args.token)}"


def _release_permit(store: Store, key: str, args: argparse.Namespace) -> int:
    """``release`` of a Semaphore: the one permit named by --fence or --token, owner-checked
    (the other permits, and the semaphore itself, are never touched)."""
    permits = _live_permits(store, key)
    if not _named(args):
        count = f"{len(permits)} live permit" + ("" if len(permits) == 1 else "s")
        raise CommandFailed(
            f"{_quoted(key)} on {store.where} is a semaphore with {count}: name the one to "
            f"release, as in `tasklock release {_quoted(key)} --force --fence {permits[0].fence}` "
            "(or --token TOKEN; `tasklock show` lists both). Nothing released. Its permits: "
            f"{permit_list(permits)}",
            code=2,
        )
    permit = find_permit(permits, args.fence, args.token)
    if permit is None:
        raise CommandFailed(
            f"{_quoted(key)} has no live permit matching {_named(args)}: nothing released. Its "
            f"permits: {permit_list(permits)}"
        )
    print(f"{key_text(key)}: the permit is held by {holder_line(permit)}")
    if not args.yes and not confirm(
        "Release this permit now? Its holder, if still running, will no longer count against "
        "the limit. [y/N] "
    ):
        print("Not released.")
        return 1
    outcome = store.release_permit(key, permit)
    if outcome == 0:
        raise CommandFailed(
            f"the permit of {_quoted(key)} with fence {permit.fence} changed since it was shown "
            "(it expired or was released): nothing released, the other permits are untouched; "
            "run the command again to see the current permits"
        )
    woken = "waiters were woken" if outcome == 1 else "the server refused the wake-up PUBLISH"
    print(f"Released the permit with fence {permit.fence} of {key_text(key)}; {woken}.")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    urls, origin = resolve_urls(args.url, args.urls)
    report, render = doctor_for(urls, origin, args.ttl)
    if args.json:
        print(json.dumps(report.to_json(args.strict), indent=2))
    else:
        print(render(report, args.strict))
    return report.exit_code(args.strict)


def cmd_stats(args: argparse.Namespace) -> int:
    urls, origin = resolve_urls(args.url, args.urls)
    result = read_fleet(urls, origin, args.prefix, args.window)
    if args.json:
        print(json.dumps(result.merged, indent=2, sort_keys=True))
    else:
        print(stats_text(result))
    errors = {node.url: node.error for node in result.failed if node.error is not None}
    return _masters_down(errors, "its counts are missing from the sum")


def cmd_exporter(args: argparse.Namespace) -> int:
    urls, origin = resolve_urls(args.url, args.urls)
    try:
        serve_exporter(urls, origin, args.port, args.addr, args.prefix)
    except OSError as exc:  # the address is taken or not this host's
        raise CommandFailed(f"cannot serve on {args.addr}:{args.port}: {exc}") from exc
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if args.url is not None:
        validate_url(args.url, "--url")
    try:
        demo: Any = importlib.import_module("tasklock.demo")
    except ModuleNotFoundError as exc:
        if exc.name == "tasklock.demo":
            raise CommandFailed(
                "`tasklock demo` is not available in this installation (module tasklock.demo is "
                "missing); reinstall tasklock from a release that ships it"
            ) from exc
        raise CommandFailed(
            f"`tasklock demo` needs {exc.name!r}, which is not installed: "
            "pip install 'tasklock[demo]'"
        ) from exc
    return int(demo.main(args))


# --- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (its arguments are in :mod:`tasklock.ops.arguments`)."""
    return arguments.build_parser(
        {
            "ls": cmd_ls,
            "show": cmd_show,
            "release": cmd_release,
            "doctor": cmd_doctor,
            "stats": cmd_stats,
            "exporter": cmd_exporter,
            "demo": cmd_demo,
        }
    )


# --- entry point --------------------------------------------------------------------------------


_LINE_BREAKS = re.compile(r"\s*[\r\n]+\s*")


def _error(message: str) -> None:
    # One line: a message from redis-py or the server may span several. Only line breaks are
    # joined; runs of spaces stay, since they can be part of a key.
    print(f"tasklock: error: {_LINE_BREAKS.sub(' ', message.strip())}", file=sys.stderr)


def _escape_what_the_terminal_cannot_print() -> None:
    """Print characters the output encoding lacks as ``\\uNNNN`` instead of raising
    UnicodeEncodeError (a key in Cyrillic on a Latin-1 terminal); ``show`` reads the escape back
    as the same character."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (the console script exits with it)."""
    _escape_what_the_terminal_cannot_print()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 for --help
        return exc.code if isinstance(exc.code, int) else 2
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        _error(
            "a command is required: ls, show, release, stats, doctor, exporter or demo (see "
            "tasklock --help)"
        )
        return 2
    try:
        return handler(args)
    except CommandFailed as exc:
        _error(str(exc))
        return exc.code
    except ConfigurationError as exc:
        _error(str(exc))
        return 2
    except BackendUnavailable as exc:
        _error(str(exc))
        return 1
    except redis_errors.RedisError as exc:
        _error(f"Redis refused the request: {exc}. Check the URL's user and permissions (ACL).")
        return 1
    except UnicodeDecodeError as exc:
        # Only a client that decodes replies (decode_responses in the URL's query) meets a key
        # or value that is not UTF-8 this way; tasklock's own reads take bytes.
        _error(
            f"Redis sent a key or value that is not UTF-8 ({exc.reason}), and the URL asks "
            "redis-py to decode replies: remove decode_responses from the URL's query"
        )
        return 2
    except BrokenPipeError:
        # The reader (`| head`) went away: stop quietly, and keep Python's exit-time flush quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
