"""httpx stays optional: ``import tasklock`` does not import it (nor tasklock.etcd)."""

from __future__ import annotations

from tests.unit.test_package import fresh_python


def test_import_tasklock_imports_no_httpx() -> None:
    code = (
        "import sys, tasklock, tasklock.fencing\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('httpx', 'tasklock.etcd')"
        " or m.startswith('tasklock.etcd')))"
    )
    assert fresh_python(code) == ["[]"]
