"""What only the garbage collector frees: objects left in reference cycles."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["cyclic_garbage"]


@contextmanager
def cyclic_garbage() -> Iterator[list[str]]:
    """Names of tasklock's objects that only the garbage collector freed inside the block."""
    found: list[str] = []
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found.extend(
            type(thing).__qualname__
            for thing in gc.garbage
            if type(thing).__module__.startswith("tasklock")
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
