"""Sphinx extension of tasklock's docs.

* ``{tasklock-cli}``: the ``tasklock`` command's reference, rendered from its argparse parser
  at build time (``tasklock.cli.build_parser``), so the page cannot drift from the command.
* ``{tasklock-options}``: every task option with its type, default, and the error a bad value
  gets, the last computed by ``tasklock.config.check_options`` at build time (a bad
  value that stops being refused fails the build).
* The public-API check: every name in the ``__all__`` of every public module (``PUBLIC_MODULES``)
  must have its entry in the API reference; a missing one is a warning, which the strict build
  (``-W``) turns into a failure.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

# The modules whose __all__ is tasklock's public API; each has a page in docs/reference/api/.
PUBLIC_MODULES = [
    "tasklock",
    "tasklock.asyncio",
    "tasklock.asyncio.etcd",
    "tasklock.etcd",
    "tasklock.zookeeper",
    "tasklock.asyncio.zookeeper",
    "tasklock.celery",
    "tasklock.rq",
    "tasklock.fencing",
    "tasklock.fencing.sqlalchemy",
    "tasklock.fencing.redis",
    "tasklock.django.fencing",
    "tasklock.django.models",
    "tasklock.django.admin",
    "tasklock.prometheus",
    "tasklock.opentelemetry",
    "tasklock.fleet",
    "tasklock.stats",
    "tasklock.compat.celery_once",
    "tasklock.compat.celery_singleton",
]


# The type of each option, as the reader writes it (the defaults come from tasklock.config).
OPTION_TYPES = {
    "ttl": "float (seconds)",
    "key": "None | list[str] | callable",
    "on_duplicate": '"skip" | "raise" | "retry" | "wait"',
    "wait_timeout": "float | None (seconds)",
    "on_wait_timeout": '"skip" | "raise" | "retry"',
    "fencing": "bool | str (a keyword name)",
    "dedupe_enqueue": 'bool | "until_start"',
    "limit": "int >= 1 | None",
    "rate": 'str | list[str] ("20/m", "30/5m")',
    "burst": "int >= 1 | list[int]",
    "rate_key": "None | list[str] | callable",
    "rate_group": "str | None",
    "on_rate_limit": '"retry" | "wait" | "skip" | "raise"',
    "pending_ttl": "float (seconds)",
    "watchdog": "bool",
    "on_backend_error": '"raise" | "run"',
    "url": "str | None (Redis, Cluster, Sentinel or etcd URL)",
    "urls": "list[str] | None (Redlock masters)",
    "key_prefix": "str",
}
# A value each option refuses; the error shown is the one tasklock gives it.
BAD_VALUES: dict[str, Any] = {
    "ttl": 0,
    "key": 42,
    "on_duplicate": "drop",
    "wait_timeout": -1,
    "on_wait_timeout": "wait",
    "fencing": 3,
    "dedupe_enqueue": "yes",
    "limit": 0,
    "rate": "10 per second",
    "burst": 0,
    "rate_key": 42,
    "rate_group": "",
    "on_rate_limit": "later",
    "pending_ttl": -5,
    "watchdog": "yes",
    "on_backend_error": "ignore",
    "url": "redis://localhost:99999/0",
    "urls": ["redis://a:6379/0", "redis://b:6379/0"],
    "key_prefix": "",
}


Cell = list[tuple[str, bool]]  # (text, literal) parts of one table cell


def _cell(parts: Cell) -> nodes.entry:
    entry = nodes.entry()
    paragraph = nodes.paragraph()
    for text, literal in parts:
        paragraph += nodes.literal(text=text) if literal else nodes.Text(text)
    entry += paragraph
    return entry


def _table(headers: list[str], rows: list[list[Cell]]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=len(headers))
    table += group
    for _ in headers:
        group += nodes.colspec(colwidth=1)
    head = nodes.thead()
    row = nodes.row()
    for header in headers:
        row += _cell([(header, False)])
    head += row
    group += head
    body = nodes.tbody()
    for cells in rows:
        row = nodes.row()
        for cell in cells:
            row += _cell(cell)
        body += row
    group += body
    return table


class OptionsDirective(SphinxDirective):
    """Every task option: its type, its default, and the error a bad value gets."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from tasklock.config import DEFAULTS, check_options

        rows = []
        for name in DEFAULTS:
            if name not in OPTION_TYPES or name not in BAD_VALUES:
                logger.warning("option %s has no type or bad value in tasklock_docs", name)
                continue
            bad = BAD_VALUES[name]
            problems = [p for p in check_options({name: bad}) if not p.warning]
            if not problems:
                logger.warning("option %s=%r is no longer refused: pick a bad value", name, bad)
                continue
            problem = problems[0]
            rows.append(
                [
                    [(name, True)],
                    [(OPTION_TYPES[name], True)],
                    [(repr(DEFAULTS[name]), True)],
                    [
                        (f"{name}={bad!r}", True),
                        (" raises ", False),
                        ("ConfigurationError", True),
                        (f" (Django: tasklock.{problem.code}): {problem.message}", False),
                    ],
                ]
            )
        headers = ["option", "type", "default", "a bad value, and the error it gets"]
        return [_table(headers, rows)]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


class CliDirective(SphinxDirective):
    """The ``tasklock`` command's help and each subcommand's, as the parser prints them."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from tasklock.cli import build_parser

        parser = build_parser()
        parser.prog = "tasklock"
        out: list[nodes.Node] = [nodes.literal_block(text=parser.format_help(), language="text")]
        for name, sub in _subcommands(parser).items():
            section = nodes.section(ids=[f"tasklock-{name}"], names=[f"tasklock {name}"])
            section += nodes.title(text=f"tasklock {name}")
            section += nodes.literal_block(text=sub.format_help(), language="text")
            out.append(section)
        return out


def check_public_api(app: Sphinx, env: BuildEnvironment) -> None:
    domain: Any = env.get_domain("py")
    documented = set(domain.objects) | set(domain.modules)
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        if module_name not in documented:
            logger.warning("public module %s has no page in the API reference", module_name)
        for name in getattr(module, "__all__", ()):
            if f"{module_name}.{name}" not in documented:
                logger.warning(
                    "public name %s.%s (in its __all__) is not in the API reference: give it"
                    " a docstring, or document it in docs/reference/api/",
                    module_name,
                    name,
                )


def _resolves(target: str) -> bool:
    """Whether ``target`` names something that exists in tasklock (a module, or an attribute
    of one)."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def internal_reference(app: Sphinx, domain: Any, node: Any) -> bool | None:
    """Let a docstring name tasklock's internals (``tasklock.core.lease``, a base class in
    ``tasklock.core``) as plain text: they exist but are no part of the API reference. A
    reference to a tasklock name that does not exist still fails the build."""
    target = node.get("reftarget", "")
    if node.get("refdomain") == "py" and target.startswith("tasklock.") and _resolves(target):
        return True
    return None


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("tasklock-cli", CliDirective)
    app.add_directive("tasklock-options", OptionsDirective)
    app.connect("warn-missing-reference", internal_reference)
    app.connect("env-check-consistency", check_public_api)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
