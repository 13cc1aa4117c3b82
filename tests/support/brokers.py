"""A RabbitMQ of the suite's own for the tests with an AMQP broker: Debian's ``rabbitmq-server``
(which ``.ci/run`` installs), started as a node of its own with its own data directory, on free
loopback ports, never the machine's RabbitMQ on :5672. Where RabbitMQ is not installed those
tests skip, naming the install line; where it is installed and does not start, they fail."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["RABBITMQ_INSTALL", "start_rabbitmq"]

RABBITMQ_INSTALL = "RabbitMQ is not installed: apt-get install rabbitmq-server (.ci/run does)"
#: An Erlang node's start-up: a few seconds here, more on a loaded machine.
STARTUP_DEADLINE = 120.0


def _binary() -> str | None:
    return shutil.which("rabbitmq-server") or shutil.which(
        "rabbitmq-server", path="/usr/sbin:/usr/lib/rabbitmq/bin"
    )


@contextlib.contextmanager
def start_rabbitmq() -> Iterator[str]:
    """An AMQP URL (guest/guest) of a fresh RabbitMQ node, stopped and removed afterwards."""
    import pytest

    from tests.support.servers import free_port

    binary = _binary()
    if binary is None:
        pytest.skip(RABBITMQ_INSTALL)
    base = Path(tempfile.mkdtemp(prefix="tasklock-rabbitmq-"))
    (base / "enabled_plugins").write_text("[].\n")
    if os.geteuid() == 0:
        # Debian's script runs the node as the rabbitmq user when started by root.
        with contextlib.suppress(KeyError):
            user = pwd.getpwnam("rabbitmq")
            for path in (base, base / "enabled_plugins"):
                os.chown(path, user.pw_uid, user.pw_gid)
    port = free_port()
    node = f"tasklock-{secrets.token_hex(4)}@localhost"
    env = {
        **os.environ,
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(free_port()),
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(base / "node.pid"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),  # none: the defaults
    }
    log = (base / "out.log").open("wb")
    process = subprocess.Popen(
        [binary], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"amqp://guest:guest@127.0.0.1:{port}//"
    try:
        deadline = time.monotonic() + STARTUP_DEADLINE
        while not _answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (base / "out.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"RabbitMQ did not start on 127.0.0.1:{port}: {tail}")
            time.sleep(0.2)  # polling a starting node: there is no event to wait on
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        # The node runs under su as the rabbitmq user, in a session of its own, and its command
        # line names neither the node nor its directory (the pkill -f this did found nothing,
        # and every run left a node behind): find its processes by their environment.
        _stop_node(node)
        log.close()
        shutil.rmtree(base, ignore_errors=True)


def _stop_node(node: str) -> None:
    """SIGTERM, then SIGKILL after a grace, every process started with ``RABBITMQ_NODENAME``
    ``node`` (the Erlang VM, epmd's child, the shell around them)."""
    import psutil

    def of_node() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if process.environ().get("RABBITMQ_NODENAME") == node:
                    found.append(process)
        return found

    processes = of_node()
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=30)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=10)


def _answers(url: str) -> bool:
    import kombu

    try:
        with kombu.Connection(url, connect_timeout=1) as connection:
            connection.connect()
    except Exception:
        return False
    return True
