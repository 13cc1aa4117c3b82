"""The ``tasklock`` command run in-process, for the CLI tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tasklock.cli import main

__all__ = ["Run", "cli_runner", "without_url_environment"]

#: ``run("ls", "--url", url)`` -> (exit status, stdout, stderr)
Run = Callable[..., tuple[int, str, str]]


def cli_runner(capsys: pytest.CaptureFixture[str]) -> Run:
    """Call main() in-process; each call returns (exit status, stdout, stderr)."""

    def call(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return call


def without_url_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TASKLOCK_URL / TASKLOCK_URLS from the machine: each test names its servers."""
    monkeypatch.delenv("TASKLOCK_URL", raising=False)
    monkeypatch.delenv("TASKLOCK_URLS", raising=False)
