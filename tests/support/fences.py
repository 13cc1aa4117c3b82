"""Fence-token facts the tests compare against."""

from __future__ import annotations

from typing import Any

__all__ = ["server_micros"]


def server_micros(client: Any) -> int:
    """The server's clock in microseconds (``TIME``): a fence counter made after this starts
    above it."""
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)
