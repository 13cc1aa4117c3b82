"""``tasklock exporter``: checks what it is given, then hands over to
:func:`tasklock.prometheus.serve`.

Why the import happens here, at run time: prometheus_client is an optional extra, and every
other command must work without it; when it is missing, the command says what to install
(a usage error) rather than printing an ImportError traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

from tasklock.backends import backend_for
from tasklock.errors import ConfigurationError

__all__ = ["serve_exporter"]

INSTALL = "pip install 'tasklock[prometheus]'"


def _is_missing_prometheus_client(exc: ImportError) -> bool:
    """Whether ``exc`` means prometheus_client is not installed: raised directly, or as the
    cause of the ImportError :mod:`tasklock.prometheus` raises in its place."""
    for error in (exc, exc.__cause__):
        if isinstance(error, ImportError) and (error.name or "").startswith("prometheus_client"):
            return True
    return "prometheus_client" in str(exc)


def serve_exporter(urls: Sequence[str], option: str, port: int, addr: str, prefix: str) -> None:
    """Serve ``/metrics`` for ``urls`` (one Redis, a cluster, or Redlock's masters) until
    Ctrl-C. An etcd URL, or a missing prometheus_client, is a :class:`ConfigurationError`;
    an address that cannot be listened on is the OSError of the server."""
    for url in urls:
        backend = backend_for(url)
        if not backend.keeps_counts:
            raise ConfigurationError(
                f"{option} names {backend.name}, and the exporter reads fleet counts and locks "
                f"from Redis: tasks on {backend.name} keep their counts in process (export them "
                "from each worker with tasklock.prometheus.instrument())"
            )
    try:
        prometheus: Any = importlib.import_module("tasklock.prometheus")

        def listening() -> None:  # said once the address is bound, not before it may fail
            print(
                f"tasklock exporter: serving http://{addr}:{port}/metrics for {len(urls)} Redis "
                "URL(s) (Ctrl-C stops)",
                file=sys.stderr,
            )

        prometheus.serve(list(urls), port, addr, prefix, on_listening=listening)
    except ImportError as exc:
        if exc.name == "tasklock.prometheus":
            raise ConfigurationError(
                "`tasklock exporter` is not available in this installation (module "
                "tasklock.prometheus is missing); reinstall tasklock from a release that ships it"
            ) from exc
        if not _is_missing_prometheus_client(exc):
            raise
        raise ConfigurationError(
            f"`tasklock exporter` needs prometheus_client, which is not installed: {INSTALL}"
        ) from exc
