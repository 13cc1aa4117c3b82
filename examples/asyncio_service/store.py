"""A fenced ledger in Redis: account balances that a stale lock holder cannot overwrite.

Each account is a hash ``ledger:{id}`` with its ``balance`` (cents) and ``fence``, the highest
fencing token the ledger has seen for it, plus a list ``ledger:{id}:writes`` of every accepted
write (``"<fence> <balance> <job id>"``, oldest first). A credit is a read-modify-write in two
fenced steps, each one Lua script (so each check-and-act is atomic):

* :meth:`Ledger.read_for_update` returns the balance and raises the account's fence to the
  caller's token. From then on, writes with an older token are refused, even if the caller has not
  written yet: a holder whose lock expired cannot slip a write in between the new holder's read
  and write, where it would be lost.
* :meth:`Ledger.write` stores the new balance if no newer token has read or written meanwhile.

Either step raises :class:`StaleFence` when a newer token has been seen: nothing was changed, and
the job can run again under a new lock.
"""

from __future__ import annotations

from typing import Any

#: ``older(a, b)``: is token ``a`` below token ``b``? Compared as digit strings, which is exact
#: for any size (Lua's numbers are doubles).
OLDER = """
local function older(a, b)
  return #a < #b or (#a == #b and a < b)
end
"""

READ_FOR_UPDATE = (
    OLDER
    + """
local seen = redis.call('HGET', KEYS[1], 'fence') or '0'
if older(ARGV[1], seen) then
  return {0, seen}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1])
return {1, redis.call('HGET', KEYS[1], 'balance') or '0'}
"""
)

WRITE = (
    OLDER
    + """
local seen = redis.call('HGET', KEYS[1], 'fence') or '0'
if older(ARGV[1], seen) then
  return {0, seen}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'balance', ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
return {1, ARGV[1]}
"""
)


class StaleFence(Exception):
    """A newer lock holder has already read or written this account; nothing was changed."""

    def __init__(self, account: int, fence: int, seen: int) -> None:
        super().__init__(f"account {account}: token {fence} is older than {seen}, already seen")
        self.account = account
        self.fence = fence
        self.seen = seen


def ledger_key(account: int) -> str:
    # The braces are a hash tag: an account's two keys share a slot, should this run on a cluster.
    return f"ledger:{{{account}}}"


def writes_key(account: int) -> str:
    return f"{ledger_key(account)}:writes"


def parse_write(entry: bytes | str) -> tuple[int, int, str]:
    """``(fence, balance, job id)`` of one entry of the writes list."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    fence, balance, job_id = text.split(" ", 2)
    return int(fence), int(balance), job_id


class Ledger:
    """The ledger on a ``redis.asyncio`` client."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self._read_for_update = redis.register_script(READ_FOR_UPDATE)
        self._write = redis.register_script(WRITE)

    async def read_for_update(self, account: int, fence: int) -> int:
        """The balance; no write with a token older than ``fence`` is accepted after this."""
        ok, value = await self._read_for_update(keys=[ledger_key(account)], args=[fence])
        if not ok:
            raise StaleFence(account, fence, int(value))
        return int(value)

    async def write(self, account: int, fence: int, balance: int, job_id: str) -> None:
        """Store ``balance``; :class:`StaleFence` if a newer token has been seen."""
        keys = [ledger_key(account), writes_key(account)]
        ok, value = await self._write(keys=keys, args=[fence, balance, job_id])
        if not ok:
            raise StaleFence(account, fence, int(value))

    async def balance(self, account: int) -> int:
        """The balance, read without a fence (for reports)."""
        return int(await self.redis.hget(ledger_key(account), "balance") or 0)

    async def writes(self, account: int) -> list[tuple[int, int, str]]:
        """Every accepted write, oldest first: ``(fence, balance, job id)``."""
        return [parse_write(entry) for entry in await self.redis.lrange(writes_key(account), 0, -1)]
