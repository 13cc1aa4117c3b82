"""What only the garbage collector frees: objects left in reference cycles."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["cyclic_garbage"]


@contextmanager
def cyclic_garbage() -> Iterator[list[str]]:
    """Names of tasklock's objects made inside the block that only the garbage collector freed
    (older ones, such as an earlier test's client and its connections, are not the block's)."""
    found: list[str] = []
    gc.collect()
    older = {id(thing) for thing in gc.get_objects() if _ours(thing)}
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found.extend(
            type(thing).__qualname__
            for thing in gc.garbage
            if _ours(thing) and id(thing) not in older
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _ours(thing: object) -> bool:
    module = getattr(type(thing), "__module__", None)  # (a metaclass's may be a descriptor)
    return isinstance(module, str) and module.startswith("tasklock")
