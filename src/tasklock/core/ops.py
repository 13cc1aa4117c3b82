"""What the fan-out sends and what it answers with: one command for one server (:class:`Op`), and
the stand-ins for replies that did not come (:data:`PENDING`, :class:`NoReply`,
:class:`NotAwaited`). Shared by the fan-out (:mod:`tasklock.core.fanout`), its reaper
(:mod:`tasklock.core.reaper`) and both Redlocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from redis.exceptions import TimeoutError as RedisTimeoutError

from tasklock.core.scripts import Script

__all__ = [
    "PENDING",
    "REAP_AFTER",
    "Awaited",
    "LateHook",
    "NoReply",
    "NotAwaited",
    "Op",
    "script_op",
]

#: Seconds the reaper waits for a straggler's replies before closing its connection.
REAP_AFTER = 5.0


class _Pending:
    def __repr__(self) -> str:
        return "PENDING"


#: The result of a node that has not answered yet (only seen by ``decided`` callbacks).
PENDING: Final = _Pending()


class NoReply(RedisTimeoutError):
    """A server did not answer (or could not be connected to) within the deadline."""


class NotAwaited(NoReply):
    """The outcome was decided before this server answered; its reply was not waited for."""


@dataclass(frozen=True, slots=True)
class Op:
    """One command for one server. ``script`` is set for EVALSHA, to reload it on NOSCRIPT."""

    args: tuple[Any, ...]
    script: Script | None = None

    def self_contained(self) -> tuple[Any, ...]:
        """The command as EVAL with the script's text: for follow-ups queued behind a command
        that got no answer, whose NOSCRIPT error nobody would be there to see and retry."""
        if self.script is None:
            return self.args
        return ("EVAL", self.script.source, *self.args[2:])


def script_op(script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Op:
    """An EVALSHA of ``script``; a server that answers NOSCRIPT gets SCRIPT LOAD and a retry."""
    return Op(("EVALSHA", script.sha, len(keys), *keys, *args), script)


#: Called with a reply that came after its caller left; may answer with a follow-up op.
LateHook = Callable[[Any], Op | None]
#: A reply the reaper still has to read: the op it answers (None: a SCRIPT LOAD or a follow-up,
#: which cannot answer NOSCRIPT) and the hook to call with it.
Awaited = tuple[Op | None, LateHook | None]
