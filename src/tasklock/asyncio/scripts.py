"""Running tasklock's scripts on a ``redis.asyncio`` client: EVALSHA, and SCRIPT LOAD on NOSCRIPT.

The scripts themselves (one copy of each, with their KEYS/ARGV/return headers) are in
:mod:`tasklock.core.scripts`; only the awaiting is here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from tasklock.core.scripts import Script

__all__ = ["run_batch", "run_script"]


async def run_script(client: Any, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """One EVALSHA; on NOSCRIPT (a new or restarted server, SCRIPT FLUSH) load it and repeat."""
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await client.script_load(script.source)
        return await client.evalsha(script.sha, len(keys), *keys, *args)


async def run_batch(
    client: Any, calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]
) -> list[Any]:
    """Many script calls in one pipelined round trip (no MULTI); each call's error in its place,
    NOSCRIPT retried once after loading; a connection error is raised (no answer at all)."""
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    results: list[Any] = list(await pipe.execute(raise_on_error=False))
    missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
    if missing:
        for script in {calls[i][0] for i in missing}:
            await client.script_load(script.source)
        retry = client.pipeline(transaction=False)
        for i in missing:
            script, keys, args = calls[i]
            retry.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        for i, result in zip(missing, await retry.execute(raise_on_error=False), strict=True):
            results[i] = result
    return results
