"""Option types of the ``tasklock`` command: each checks one value as argparse reads it.

Kept apart from :mod:`tasklock.cli` so that module stays the commands; argparse turns the
``ArgumentTypeError`` each raises into a usage error (exit status 2) naming the option, so a bad
value is refused before anything connects to a server.
"""

from __future__ import annotations

import argparse
import math
import os

__all__ = ["argv_bytes", "fence_number", "non_empty", "port_number", "positive_seconds"]


def fence_number(text: str) -> int:
    """A fence token (``release --fence``): a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a fence token (a number), got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a fence token (>= 0), got {text!r}")
    return value


def non_empty(text: str) -> str:
    """A pattern or prefix: an empty one would match nothing, silently."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty (use * for every key)")
    return text


def positive_seconds(text: str) -> float:
    """A duration in seconds, finite and above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return value


def port_number(text: str) -> int:
    """A TCP port to listen on, 1 to 65535 (0, "any free port", would leave Prometheus nothing
    to be told)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, got {text!r}")
    return value


def argv_bytes(text: str) -> bytes:
    """The bytes an argument was typed as. Python decodes argv with the locale's encoding and
    ``surrogateescape``; ``os.fsencode`` undoes exactly that, whatever the locale. A string that
    did not come from argv (``main([...])`` from Python) and does not fit the locale's encoding
    is taken as UTF-8."""
    try:
        return os.fsencode(text)
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")
