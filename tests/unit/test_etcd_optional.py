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


def test_import_tasklock_asyncio_imports_no_httpx() -> None:
    code = (
        "import sys, tasklock.asyncio\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'httpx'"
        " or m.startswith(('tasklock.etcd', 'tasklock.asyncio.etcd'))))\n"
        "from tasklock.asyncio import etcd\n"
        "print(etcd.Lock.__module__, 'httpx' in sys.modules)"
    )
    assert fresh_python(code) == ["[]", "tasklock.asyncio.etcd True"]
