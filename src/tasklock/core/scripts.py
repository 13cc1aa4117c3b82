"""Every Lua script tasklock runs, in one place.

Each script has a header naming its KEYS, ARGV and return value. How they are sent (EVALSHA, a
load on NOSCRIPT, the packed hot path, batches) is :mod:`tasklock.core.scripting`.

Lock values have the form ``<owner token>#<fence>``: the owner token is random (see
:mod:`tasklock.core.owner`) and the fence is the token issued with this hold, so a single GET tells
an operator who holds a lock and with which fence.
"""

from __future__ import annotations

from tasklock.core.scripting import BoundScript, Script, run_batch

__all__ = [
    "ACL_RULES",
    "ACQUIRE",
    "CLAIM",
    "DELETE_IF",
    "EXTEND",
    "LEASE_FUNCTIONS",
    "PERMIT_ACQUIRE",
    "PERMIT_EXTEND",
    "PERMIT_RELEASE",
    "PERMIT_STATE",
    "REDLOCK_ACQUIRE",
    "REDLOCK_EXTEND",
    "REDLOCK_FENCE",
    "REDLOCK_RELEASE",
    "RELEASE",
    "RQ_ATTACH_DEPENDENTS",
    "BoundScript",
    "Script",
    "run_batch",
]


#: What an ACL user needs for tasklock: the commands its scripts and waiters run (every command a
#: script calls is checked against the user's ACL too), on the lock keys and the wake channels.
#: (+ping: redis-py health-checks idle connections; a URL naming a database other than 0 also
#: needs +select.)
ACL_RULES = (
    "+evalsha +script|load +get +set +del +exists +pttl +pexpire +incr +time +publish +subscribe "
    "+unsubscribe +ping +type +zadd +zrem +zscore +zrange +zcard +zcount +zrangebyscore "
    "+zremrangebyscore +rpush +lpop +lrem +lindex +lrange +hmget +hset +hincrby +hgetall +expire "
    "~tasklock:* "
    "~<your lock names> ~{<your lock names>}:* resetchannels &tasklock:wake:*"
)


#: Lua every acquire script starts with: one copy of how a fence is issued, how a retried acquire
#: finds its own hold, and how a permit is added.
LEASE_FUNCTIONS = """
-- The fence of a value stored by `owner` ("<owner>#<fence>"), or nil when it is not theirs.
local function fence_of(value, owner)
  local mine = owner .. '#'
  if type(value) == 'string' and string.sub(value, 1, #mine) == mine then
    return tonumber(string.sub(value, #mine + 1))
  end
  return nil
end
-- The next fence (see ACQUIRE): the server's clock in microseconds (`time`: TIME's answer), or
-- one more than the counter's last token where that is higher; the counter keeps it for
-- `counter_ttl` ms. Returns it as a number and as text (string.format: Lua prints 15+ digit
-- numbers in exponent form). One SET ... GET writes the clock's value and reads the last token
-- (Redis 6.2+): in the common case, a clock ahead of the counter, that is the whole update;
-- otherwise the counter is written again, with the last token + 1, before anything else runs.
local function issue_fence(counter, time, counter_ttl)
  local fence = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local text = string.format('%d', fence)
  local last = tonumber(redis.call('SET', counter, text, 'PX', counter_ttl, 'GET'))
  if last and last >= fence then
    fence = last + 1
    text = string.format('%d', fence)
    redis.call('SET', counter, text, 'PX', counter_ttl)
  end
  return fence, text
end
-- A semaphore's live permits at `ms`: expired ones dropped, then `owner`'s fence when one of
-- them is theirs (a retried acquire), and how many there are.
local function live_permits(key, ms, owner)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', ms))
  local members = redis.call('ZRANGE', key, 0, -1)
  for i = 1, #members do
    local fence = fence_of(members[i], owner)
    if fence then
      return fence, #members
    end
  end
  return nil, #members
end
-- Add a permit expiring `ttl` ms after `ms`; the set lives at least as long as its longest.
local function add_permit(key, ms, ttl, value)
  redis.call('ZADD', key, string.format('%d', ms + ttl), value)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
"""


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
    LEASE_FUNCTIONS
    + """
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  local own = fence_of(redis.pcall('GET', KEYS[1]), ARGV[1])
  if own then
    return {1, own}
  end
  return {0, pttl}
end
local fence, text = issue_fence(KEYS[2], redis.call('TIME'), ARGV[3])
redis.call('SET', KEYS[1], ARGV[1] .. '#' .. text, 'PX', ARGV[2])
return {1, fence}
""",
)

# KEYS[1] lock key
# ARGV[1] the value this owner stored, ARGV[2] channel to publish the release on
# Returns 1 when released (and waiters were told), 2 when released but the PUBLISH was refused (an
# ACL user without +publish on the channel: waiters fall back to polling), 0 when the value did not
# match (not owned; also when the name now holds a Semaphore's permits: the GET is a pcall for
# that). The PUBLISH is a pcall so that a refused wake-up can never fail a release that has
# already deleted the key.
# Also used by `tasklock release --force` with the value the operator was shown, so a lock that was
# re-acquired in between is not broken by mistake.
RELEASE = Script(
    "release",
    """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
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
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
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

# -- Semaphore permits -----------------------------------------------------------------------------
# A semaphore's permits are one sorted set at the semaphore's name: member "<owner token>#<fence>",
# score the permit's expiry in ms on the server's clock. Each permit has its own owner and TTL, so
# a crashed holder's permit frees itself; the key's own TTL is kept at least as long as its
# longest permit, so an abandoned semaphore leaves nothing behind. Expired members are dropped by
# the next acquire. The name may also hold a plain Lock's string (a task whose limit changed
# between 1 and N during a deployment): the permit scripts count it as one holder and never
# touch it, and the Lock scripts treat the sorted set as held, so the two kinds exclude each
# other instead of failing with WRONGTYPE.

# KEYS[1] permits, KEYS[2] fence counter
# ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] the fence counter's TTL in ms, ARGV[4] limit
# Returns {1, fence} when a permit was taken, or {0, ms until the first permit expires} when all
# `limit` are taken (-1: a Lock holds the name without a TTL). The fence is issued as ACQUIRE's.
# Idempotent per token, as ACQUIRE. The limit is an argument, so it may change between calls:
# holders above a lowered limit keep their permits until they release; nobody new gets in until
# the count is below the new limit.
PERMIT_ACQUIRE = Script(
    "permit_acquire",
    LEASE_FUNCTIONS
    + """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'zset' and kind ~= 'none' then
  return {0, redis.call('PTTL', KEYS[1])}
end
local time = redis.call('TIME')
local ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if kind == 'zset' then
  local own, taken = live_permits(KEYS[1], ms, ARGV[1])
  if own then
    return {1, own}
  end
  if taken >= tonumber(ARGV[4]) then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, tonumber(first[2]) - ms}
  end
end
local fence, text = issue_fence(KEYS[2], time, ARGV[3])
add_permit(KEYS[1], ms, tonumber(ARGV[2]), ARGV[1] .. '#' .. text)
return {1, fence}
""",
)

# KEYS[1] permits; ARGV[1] the value this owner stored, ARGV[2] channel to publish the release on
# Returns 1 when released (and waiters were told), 2 when released but the PUBLISH was refused
# (see RELEASE), 0 when the permit was not ours any more (gone, or expired: an expired member is
# dropped, but nobody is woken, as nothing was freed that the next acquire would not free).
PERMIT_RELEASE = Script(
    "permit_release",
    """
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
  return 0
end
local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expires then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
local now = redis.call('TIME')
if tonumber(expires) <= tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) then
  return 0
end
if type(redis.pcall('PUBLISH', ARGV[2], KEYS[1])) == 'table' then
  return 2
end
return 1
""",
)

# KEYS[1] permits; ARGV[1] the value this owner stored, ARGV[2] milliseconds, ARGV[3] "1" = set
# the permit's TTL to ARGV[2], "0" = add ARGV[2] to what it has left (as EXTEND)
# Returns the permit's new TTL in ms, or 0 when it is not ours any more (gone or expired).
PERMIT_EXTEND = Script(
    "permit_extend",
    """
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
  return 0
end
local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expires then
  return 0
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
expires = tonumber(expires)
if expires <= ms then
  return 0
end
local ttl = tonumber(ARGV[2])
if ARGV[3] == '0' then
  ttl = ttl + expires - ms
end
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', ms + ttl), ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return ttl
""",
)

# A read of a semaphore's permits (writes nothing: it also runs on a replica).
# KEYS[1] permits; ARGV[1] a value to look for ("" for none)
# Returns {mine, value1, ms left 1, value2, ms left 2, ...}: mine is 1 when ARGV[1] holds a live
# permit; then every live permit, the first to expire first. A Lock holding the name answers
# {2, its value, its PTTL}: no permit can be taken while it holds.
PERMIT_STATE = Script(
    "permit_state",
    """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  return {0}
end
if kind ~= 'zset' then
  local value = redis.pcall('GET', KEYS[1])
  if type(value) ~= 'string' then
    value = ''
  end
  return {2, value, redis.call('PTTL', KEYS[1])}
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%d', ms), '+inf', 'WITHSCORES')
local answer = {0}
for i = 1, #live, 2 do
  if live[i] == ARGV[1] then
    answer[1] = 1
  end
  table.insert(answer, live[i])
  table.insert(answer, tonumber(live[i + 1]) - ms)
end
return answer
""",
)

# Enqueue-time marker (dedupe_enqueue): claim it for a task id unless another is pending.
# KEYS[1] marker key; ARGV[1] task id, ARGV[2] TTL in ms
# Returns false (nil) when claimed, else the id of the task already pending. A marker that is
# already ours (a retried call, a renewal, a run claiming again for its retry) is ours for a full
# ARGV[2] ms from now: a renewal is one round trip, not a claim and a PEXPIRE.
CLAIM = Script(
    "claim",
    """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
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
