"""Every Lua script tasklock runs, in one place.

Each script has a header naming its KEYS, ARGV and return value. Scripts are sent by SHA1
(EVALSHA); a server that answers NOSCRIPT (new server, restart, SCRIPT FLUSH) gets ``SCRIPT LOAD``
once and the call is repeated. Nothing is cached globally per client: the SHA is a pure function of
the source, and which server has loaded what is the server's business, so one Lock class works with
any number of clients (redis-py caches its Script objects on the class, bound to the first client).

Lock values have the form ``<owner token>#<fence>``: the owner token is random (see
:mod:`tasklock.core.owner`) and the fence is the token issued with this hold, so a single GET tells
an operator who holds a lock and with which fence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions as redis_errors
from redis.exceptions import NoScriptError

from tasklock.core.lanes import lane_for

__all__ = [
    "ACL_RULES",
    "ACQUIRE",
    "CLAIM",
    "DELETE_IF",
    "EXTEND",
    "REDLOCK_ACQUIRE",
    "REDLOCK_EXTEND",
    "REDLOCK_FENCE",
    "REDLOCK_RELEASE",
    "RELEASE",
    "RQ_ATTACH_DEPENDENTS",
    "BoundScript",
    "Script",
]


#: What an ACL user needs for tasklock: the commands its scripts and waiters run (every command a
#: script calls is checked against the user's ACL too), on the lock keys and the wake channels.
#: (+ping: redis-py health-checks idle connections; a URL naming a database other than 0 also
#: needs +select.)
ACL_RULES = (
    "+evalsha +script|load +get +set +del +exists +pttl +pexpire +incr +time +publish +subscribe "
    "+unsubscribe +ping ~tasklock:* ~<your lock names> ~{<your lock names>}:fence resetchannels "
    "&tasklock:wake:*"
)


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)
    #: ``EVALSHA <sha>`` as RESP bulk strings, the start of every packed call (see BoundScript).
    packed_head: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        sha = hashlib.sha1(self.source.encode()).hexdigest()
        object.__setattr__(self, "sha", sha)
        object.__setattr__(self, "packed_head", _bulk([b"EVALSHA", sha.encode()]))

    def __call__(self, client: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run on ``client`` (a redis-py client): one EVALSHA, and a load + retry on NOSCRIPT.

        Sent on the thread's own connection when the client has a lane (see BoundScript),
        else (and after any failure there) through the client itself."""
        lane = lane_for(client)
        connection = lane.connection() if lane is not None else None
        if lane is not None and connection is not None:
            encode = lane.encode
            parts = [b"%d" % len(keys), *map(encode, keys), *map(encode, args)]
            packed = b"*%d\r\n%s%s" % (2 + len(parts), self.packed_head, _bulk(parts))
            answer = _send(connection, packed)
            if answer is not _MISSED:
                return answer
        return self.ordinary(client, keys, args)

    def ordinary(self, client: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """The call through the client's own ``execute_command`` (its retry policy applies)."""
        try:
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.execute_command("SCRIPT", "LOAD", self.source)
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)

    def queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Queue on a pipeline; the caller handles NOSCRIPT results (see :func:`run_batch`)."""
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)

    def bind(self, client: Any, keys: Sequence[Any], tail: Sequence[Any] = ()) -> BoundScript:
        """This script with fixed ``keys`` and fixed trailing arguments on one client."""
        return BoundScript(self, client, keys, tail)


def _bulk(parts: Iterable[bytes]) -> bytes:
    return b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)


_MISSED: Any = object()


def _send(connection: Any, packed: bytes) -> Any:
    """Send one packed call on a lane's connection; its answer, or _MISSED when it must be sent
    again the ordinary way (a connection error, a timeout, NOSCRIPT)."""
    # A connect failure is raised as the client would raise it: its connect() has already been
    # through the retry policy, and the ordinary path would not retry it.
    connection.connect()
    try:
        connection.send_packed_command([packed])
        return connection.read_response()
    except (NoScriptError, redis_errors.ConnectionError, redis_errors.TimeoutError):
        return _MISSED  # (redis-py has already disconnected a connection that failed)


class BoundScript:
    """A script with fixed keys (and fixed trailing arguments) on one client: the lock's hot path.

    The EVALSHA is encoded once, with the client's own encoder, except for the per-call
    arguments, and sent on this thread's own connection to the client's server once it has one
    (see :mod:`tasklock.core.lanes`; until then, the ordinary way). That skips redis-py's
    per-command layer and its pool, and nothing else: the answer and the errors are the same as
    :meth:`Script.__call__`'s. A connection-level error on that connection, or NOSCRIPT, sends
    the call again the ordinary way, through the client's own retry policy and the script load,
    exactly as if the fast attempt had been the first try of that policy; a connection that
    cannot be made at all is an error at once, as it is for the client. Clients it cannot vouch
    for always take the ordinary way.
    """

    __slots__ = ("_argc", "_head", "_lane", "_tail", "client", "keys", "script", "tail")

    def __init__(
        self, script: Script, client: Any, keys: Sequence[Any], tail: Sequence[Any] = ()
    ) -> None:
        self.script = script
        self.client = client
        self.keys = tuple(keys)
        self.tail = tuple(tail)
        self._lane = lane = lane_for(client)
        if lane is not None:
            encode = lane.encode
            self._head = script.packed_head + _bulk([b"%d" % len(self.keys), *map(encode, keys)])
            self._tail = _bulk(map(encode, self.tail))
            self._argc = 3 + len(self.keys) + len(self.tail)

    def __call__(self, *args: Any) -> Any:
        lane = self._lane
        connection = lane.connection() if lane is not None else None
        if lane is not None and connection is not None:
            encode = lane.encode
            packed = b"*%d\r\n%s%s%s" % (
                self._argc + len(args),
                self._head,
                _bulk(map(encode, args)),
                self._tail,
            )
            answer = _send(connection, packed)
            if answer is not _MISSED:
                return answer
        return self.script.ordinary(self.client, self.keys, (*args, *self.tail))


def run_batch(
    client: Any, calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]
) -> list[Any]:
    """Run many script calls in one pipelined round trip (no MULTI).

    Results come back in order; an error for one call is returned in its place (not raised) so one
    bad key cannot hide the others' results. NOSCRIPT results are retried once after loading.
    A connection error is raised: the whole batch did not get an answer.
    """
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        script.queue(pipe, keys, args)
    results: list[Any] = list(pipe.execute(raise_on_error=False))
    missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
    if missing:
        for script in {calls[i][0] for i in missing}:
            client.execute_command("SCRIPT", "LOAD", script.source)
        retry = client.pipeline(transaction=False)
        for i in missing:
            script, keys, args = calls[i]
            script.queue(retry, keys, args)
        for i, result in zip(missing, retry.execute(raise_on_error=False), strict=True):
            results[i] = result
    return results


# KEYS[1] lock key, KEYS[2] fence counter
# ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] the fence counter's TTL in ms
# Returns {1, fence} when acquired (the value stored is "<token>#<fence>"), or {0, pttl} when the
# lock is held (pttl of the holder's key, -1 if it has no TTL).
# Idempotent per token: redis-py retries a call whose answer was lost (connection dropped after the
# server ran it); the retry finds the lock already ours and returns its fence, instead of reporting
# it held and orphaning our own lock until its TTL runs out.
# Fences never go back, even when the counter is lost or rolled back (restart without
# persistence, eviction, expiry, a failover to a replica that missed the last increments, an old
# snapshot): a fence is the server's clock in microseconds, or one more than the counter's last
# token when that is higher (the same microsecond, or a clock stepped back while the counter
# lives). Every earlier token was at most the clock when it was issued, so it is below the next.
# The counter expires after ARGV[3] ms without an acquisition, so idle names leave nothing
# behind. Numbers are written with string.format('%d'): Lua prints 15+ digit numbers in exponent
# form.
ACQUIRE = Script(
    "acquire",
    """
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  local current = redis.pcall('GET', KEYS[1])
  local mine = ARGV[1] .. '#'
  if type(current) == 'string' and string.sub(current, 1, #mine) == mine then
    return {1, tonumber(string.sub(current, #mine + 1))}
  end
  return {0, pttl}
end
local now = redis.call('TIME')
local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('GET', KEYS[2]))
if last and last >= fence then
  fence = last + 1
end
local text = string.format('%d', fence)
redis.call('SET', KEYS[2], text, 'PX', ARGV[3])
redis.call('SET', KEYS[1], ARGV[1] .. '#' .. text, 'PX', ARGV[2])
return {1, fence}
""",
)

# KEYS[1] lock key
# ARGV[1] the value this owner stored, ARGV[2] channel to publish the release on
# Returns 1 when released (and waiters were told), 2 when released but the PUBLISH was refused (an
# ACL user without +publish on the channel: waiters fall back to polling), 0 when the value did not
# match (not owned). The PUBLISH is a pcall so that a refused wake-up can never fail a release that
# has already deleted the key.
# Also used by `tasklock release --force` with the value the operator was shown, so a lock that was
# re-acquired in between is not broken by mistake.
RELEASE = Script(
    "release",
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if type(redis.pcall('PUBLISH', ARGV[2], KEYS[1])) == 'table' then
    return 2
  end
  return 1
end
return 0
""",
)

# KEYS[1] lock key
# ARGV[1] the value this owner stored, ARGV[2] milliseconds, ARGV[3] "1" = set the TTL to ARGV[2],
# "0" = add ARGV[2] to the remaining TTL
# Returns the new TTL in ms when the lock is still this owner's, 0 when it is not.
EXTEND = Script(
    "extend",
    """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local ttl = tonumber(ARGV[2])
if ARGV[3] == '0' then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then
    return 0
  end
  ttl = ttl + pttl
end
redis.call('PEXPIRE', KEYS[1], ttl)
return ttl
""",
)

# Enqueue-time marker (dedupe_enqueue): claim it for a task id unless another is pending.
# KEYS[1] marker key; ARGV[1] task id, ARGV[2] TTL in ms
# Returns false (nil) when claimed (also when it was already ours: a retried call), else the id of
# the task already pending.
CLAIM = Script(
    "claim",
    """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  return false
end
return current
""",
)

# Clear an enqueue-time marker only if it is still ours.
# KEYS[1] marker key; ARGV[1] task id. Returns 1 when deleted, 0 otherwise.
DELETE_IF = Script(
    "delete_if",
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
""",
)

# Redlock round 1, on every node.
# KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] owner token, ARGV[2] TTL in ms
# Returns {1, counter} when SET NX succeeded, {0, pttl} when the key is held. The counter is the
# higher of this node's fence counter and its clock in microseconds: above every token issued
# before even where the counter was lost or rolled back, as for the single-instance ACQUIRE.
REDLOCK_ACQUIRE = Script(
    "redlock_acquire",
    """
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  return {0, pttl}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local now = redis.call('TIME')
local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
local counter = tonumber(redis.call('GET', KEYS[2]))
if counter and counter > clock then
  return {1, counter}
end
return {1, clock}
""",
)

# Redlock round 2, on the nodes acquired in round 1.
# KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] owner token, ARGV[2] fence t (decimal string),
# ARGV[3] the fence counter's TTL in ms
# If this node still holds our token: counter = max(counter, t) (its TTL renewed), and the stored
# value becomes "<token>#<t>" keeping its TTL. Returns 1, or 0 when the token is no longer ours.
# The counter is written from ARGV[2], not from the Lua number: Lua prints large numbers in
# exponent form ("1e+15"), which would no longer read back as an integer.
REDLOCK_FENCE = Script(
    "redlock_fence",
    """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local t = tonumber(ARGV[2])
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if t > current then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl <= 0 then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1] .. '#' .. ARGV[2], 'PX', pttl)
return 1
""",
)

# Redlock release, on every node. A node may hold our value as round 1 stored it (round 2 never
# reached it, or its round-1 answer came late) or as round 2 rewrote it, so both are accepted.
# KEYS[1] lock key; ARGV[1] owner token, ARGV[2] "<owner token>#<fence>", ARGV[3] wake channel
# Returns 1 when released (and waiters were told), 2 when released but the PUBLISH was refused
# (see RELEASE), 0 when the value was not ours.
REDLOCK_RELEASE = Script(
    "redlock_release",
    """
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] or value == ARGV[2] then
  redis.call('DEL', KEYS[1])
  if type(redis.pcall('PUBLISH', ARGV[3], KEYS[1])) == 'table' then
    return 2
  end
  return 1
end
return 0
""",
)

# Redlock extend and watchdog renewal, on every node; accepts both forms of our value (above).
# KEYS[1] lock key; ARGV[1] owner token, ARGV[2] "<owner token>#<fence>", ARGV[3] milliseconds,
# ARGV[4] "1" = set the TTL to ARGV[3], "0" = add ARGV[3] to the remaining TTL
# Returns the new TTL in ms when the value is ours, 0 when it is not.
REDLOCK_EXTEND = Script(
    "redlock_extend",
    """
local value = redis.call('GET', KEYS[1])
if value ~= ARGV[1] and value ~= ARGV[2] then
  return 0
end
local ttl = tonumber(ARGV[3])
if ARGV[4] == '0' then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then
    return 0
  end
  ttl = ttl + pttl
end
redis.call('PEXPIRE', KEYS[1], ttl)
return ttl
""",
)


# RQ (tasklock.rq): make each dependent of a duplicate depend on its twin as well, so that RQ
# releases it only once both have ended. The dependent ends up exactly as RQ leaves a job enqueued
# with depends_on=[duplicate, twin]: in both dependents sets, both ids in its dependencies set and
# in its dependency_ids field (the ids RQ WATCHes while it decides). That is what makes every order
# safe without a lock of our own: whichever of the two ends last finds the other ended and releases
# the dependent (RQ's transaction retries when the other ends meanwhile), and a twin that has
# already ended counts as RQ counts it (finished: met; failed: not met unless the dependent allows
# failures). One script, so RQ never sees a dependent half attached.
# KEYS[1] twin's job hash, KEYS[2] twin's dependents set, then for dependent i (1-based):
#   KEYS[2i+1] its job hash, KEYS[2i+2] its dependencies set
# ARGV[1] twin id, ARGV[2] RQ's "finished" status, ARGV[2+i] dependent i's id
# Returns -1 when the twin is no job here (nothing attached), else how many were attached.
RQ_ATTACH_DEPENDENTS = Script(
    "rq_attach_dependents",
    """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local twin = ARGV[1]
local attached = 0
for i = 1, #ARGV - 2 do
  local id, hash, deps = ARGV[2 + i], KEYS[2 * i + 1], KEYS[2 * i + 2]
  if id ~= twin and redis.call('EXISTS', hash) == 1 then
    redis.call('SADD', KEYS[2], id)
    redis.call('SADD', deps, twin)
    local encoded = redis.call('HGET', hash, 'dependency_ids')
    local ids = {}
    if encoded then
      ids = cjson.decode(encoded)
    else
      local first = redis.call('HGET', hash, 'dependency_id')
      if first then ids = {first} end
    end
    local known = false
    for _, dependency in ipairs(ids) do
      if dependency == twin then known = true end
    end
    if not known then
      table.insert(ids, twin)
      redis.call('HSET', hash, 'dependency_ids', cjson.encode(ids), 'dependency_id', ids[1])
    end
    attached = attached + 1
  end
end
-- A finished twin has had its dependents handled already, and RQ gave its set the hash's expiry:
-- a set made again here expires with the hash instead of staying for ever.
if attached > 0 and redis.call('HGET', KEYS[1], 'status') == ARGV[2]
    and redis.call('PTTL', KEYS[2]) == -1 then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
return attached
""",
)
