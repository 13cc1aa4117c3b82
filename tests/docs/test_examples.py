"""Every Python example of the docs site and the README, run against the suite's redis-server.

Our own collector, not a plugin: it reads each ```` ```python ```` block of ``docs/**/*.md`` and
``README.md`` and runs it, after rewriting the one address the examples use
(``localhost:6379``, and a bare ``Redis()``) to the module's server. A name an example uses but
does not define (``ledger``, ``write_report``, ``call_stripe``: the reader's own code) is given a
stand-in that accepts any call and attribute, so the example's tasklock calls really run. An
HTML comment right before a block says how to run it (docs/contributing.md):

* no comment: ``run``, the whole block (top-level ``await`` allowed: it runs in ``asyncio.run``);
* ``<!-- example: continue -->``: run in the namespace of the page's previous block;
* ``<!-- example: define -->``: the block needs what the suite does not start for it (a Celery or
  RQ worker, etcd, three Redlock masters, a SQL database): its imports, functions, classes and
  assignments run (so every name and option is checked when the task is decorated), its other
  statements are only compiled;
* ``<!-- example: compile -->``: one file of a project the suite does not build here (a Django
  settings or tasks module under django-rq's ``@job``): compiled only (the examples/ projects
  run the same code in their smoke tests).

Some names an example does not define are the reader's, but need to be real for tasklock's calls
to run: ``redis`` (a client), ``app`` (a Celery app on the suite's server), ``queue`` and
``other_queue`` (RQ queues), ``singleton_task``, ``singleton_job``, ``tasklock``, ``time``,
``asyncio``.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import re
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import tasklock
from tasklock.celery import singleton_task
from tasklock.rq import singleton_job
from tests.support.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MODES = {"run", "continue", "define", "compile"}
_FENCE = re.compile(r"^```python\s*$")
_MARK = re.compile(r"^<!--\s*example:\s*(\w+)\s*-->\s*$")


class Example:
    def __init__(self, page: Path, line: int, source: str, mode: str) -> None:
        self.page, self.line, self.source, self.mode = page, line, source, mode

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def collect() -> list[Example]:
    examples = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        if "_build" in page.parts:
            continue
        lines = page.read_text().split("\n")
        index = 0
        while index < len(lines):
            if _FENCE.match(lines[index]):
                mark = _MARK.match(lines[index - 1]) if index else None
                mode = mark.group(1) if mark else "run"
                start = index + 1
                end = start
                while not lines[end].startswith("```"):
                    end += 1
                examples.append(Example(page, start, "\n".join(lines[start:end]) + "\n", mode))
                index = end
            index += 1
    return examples


EXAMPLES = collect()


class EnoughRounds(BaseException):
    """Ends an example's endless loop (``while election.is_leader: run_one_round()``): raised by
    the reader's code once it has been called ``ROUNDS`` times, it passes through the example's
    ``with`` blocks, which release what they hold, and the test counts it as a success."""


ROUNDS = 25


class StandIn:
    """The reader's own code in an example: any call, attribute or context works."""

    calls = 0

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> StandIn:
        StandIn.calls += 1
        if StandIn.calls > ROUNDS:
            raise EnoughRounds(self._name)
        return self

    def __getattr__(self, name: str) -> StandIn:
        return StandIn(f"{self._name}.{name}")

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __await__(self) -> Iterator[None]:
        yield from ()

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __bool__(self) -> bool:
        return False  # `while not lock.lost` style loops end at once on a stand-in

    def __repr__(self) -> str:
        return f"<stand-in for {self._name}>"


def free_names(tree: ast.Module) -> set[str]:
    bound: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
            args = node.args if not isinstance(node, ast.ClassDef) else None
            if args is not None:
                every = args.posonlyargs + args.args + args.kwonlyargs
                bound.update(a.arg for a in every)
                bound.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return used - bound - set(dir(builtins))


def definitions_only(tree: ast.Module) -> ast.Module:
    kept = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    body = [
        node
        for node in tree.body
        if isinstance(node, kept)
        or (isinstance(node, ast.Assign | ast.AnnAssign) and not _awaits(node))
    ]
    return ast.Module(body=body, type_ignores=[])


def _awaits(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Await) for n in ast.walk(node))


def point_at(source: str, url: str, port: int) -> str:
    """The examples' one address, ``localhost:6379``, made the suite's server."""
    source = source.replace("redis://localhost:6379", url.rsplit("/", 1)[0])
    return re.sub(r"\bRedis\(\)", f"Redis(port={port})", source)


@pytest.fixture(scope="module")
def namespaces() -> dict[Path, dict[str, Any]]:
    return {}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example(
    example: Example,
    r: redis.Redis,
    redis_server: RedisServer,
    namespaces: dict[Path, dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert example.mode in MODES, f"{example.id}: unknown mode {example.mode!r}"
    monkeypatch.setenv("TASKLOCK_URL", redis_server.url)
    source = point_at(example.source, redis_server.url, redis_server.port)
    tree = ast.parse(source, filename=example.id)
    if example.mode == "continue":
        namespace = namespaces[example.page]
    else:
        # A module of its own, importable by name (RQ imports a job's function by its path).
        name = f"docs_example_{abs(hash(example.id))}"
        module = types.ModuleType(name)
        sys.modules[name] = module
        namespace = module.__dict__
        namespace.update({"r": r, "redis_client": r})
        namespaces[example.page] = namespace
    known: dict[str, Any] = {
        # An example's `redis` that it did not import is the reader's client.
        "redis": r,
        "tasklock": tasklock,
        "singleton_task": singleton_task,
        "singleton_job": singleton_job,
        "time": time,
        "asyncio": asyncio,
    }
    free = free_names(tree) - set(namespace)
    if "app" in free:
        from celery import Celery

        known["app"] = Celery("docs", broker=redis_server.url, backend=redis_server.url)
    if free & {"queue", "other_queue"}:
        from rq import Queue

        known["queue"] = Queue("docs", connection=r)
        known["other_queue"] = Queue("docs-other", connection=r)
    for missing in free:
        namespace[missing] = known.get(missing, StandIn(missing))
    StandIn.calls = 0
    if example.mode == "compile":
        compile(tree, example.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        return
    if example.mode == "define":
        compile(tree, example.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        tree = definitions_only(tree)
    code = compile(tree, example.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    try:
        result = eval(code, namespace)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    except EnoughRounds:
        pass


def test_every_page_was_read() -> None:
    """The collector sees the site (a moved docs directory would otherwise pass with none)."""
    assert len(EXAMPLES) >= 20
