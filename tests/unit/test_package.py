"""What ``import tasklock`` gives a program that imports nothing else: the public names, sorted
and all present, ``tasklock.stats`` as the README uses it, and no framework imported.

Each check runs in a fresh interpreter: in the test process an adapter or the guard has long
since imported ``tasklock.stats``, which hides a package that forgot to.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tasklock

ROOT = Path(__file__).resolve().parents[2]


def fresh_python(code: str) -> list[str]:
    """Run ``code`` in a new interpreter without framework settings; its stdout lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TASKLOCK_"))}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_stats_snapshot_works_after_a_plain_import_tasklock() -> None:
    # The README: "counted (`tasklock.stats.snapshot()`)", with nothing but `import tasklock`.
    assert fresh_python("import tasklock\nprint(tasklock.stats.snapshot())") == ["{}"]


def test_import_tasklock_imports_no_framework() -> None:
    code = (
        "import sys, tasklock, tasklock.fencing\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('celery', 'rq', 'django', 'sqlalchemy')))"
    )
    assert fresh_python(code) == ["[]"]


def test_every_public_name_is_there_and_the_list_is_sorted() -> None:
    assert tasklock.__all__ == sorted(tasklock.__all__)
    assert "stats" in tasklock.__all__
    for name in tasklock.__all__:
        assert getattr(tasklock, name) is not None, name
    exported = fresh_python("from tasklock import *\nprint(stats.snapshot(), Lock.__name__)")
    assert exported == ["{} Lock"]
