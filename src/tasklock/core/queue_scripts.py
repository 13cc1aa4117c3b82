"""The Lua of fair waiting: a FIFO queue of waiters per lock; a release wakes only the next.

Without it, every release wakes every waiter and all of them try (a herd: with 64 waiters, about
195 Redis commands per acquisition, and some waiters starve). With it (``fair=True``, the default
for :class:`tasklock.Lock` and :class:`tasklock.Semaphore`), each name has a queue in its own
cluster slot (see :func:`tasklock.core.keys.queue_keys_for`):

* ``{name}:queue``, a list of waiter tokens in arrival order, and
* ``{name}:waiters``, a sorted set of the same tokens scored by their liveness deadline (ms, on the
  server's clock).

A queued waiter is ``<wake id> <token id>`` (the wake id names its process: eight hex digits, new
in every process, see :func:`tasklock.core.keys.wake_id`; the token id is the owner token's random
part, the same across a waiter's retries, see :func:`tasklock.core.owner.token_id`). A waiter joins
at the tail with the attempt it makes once its listener is subscribed to the lock's wake channel
(so it cannot miss the release that makes it first), and renews its deadline with every later
attempt; a free lock (or permit) may be taken only by the waiters at the head of the queue, or by
anyone when the queue is empty. A release publishes ``tasklock:next <waiter>`` on the waiter's
process channel (the lock's wake channel, ``@`` and the wake id), to which only that process's
listener is subscribed: it wakes just the waiter named, and no other process hears of it (with 32
processes waiting, a message on the lock's channel woke 32 listeners per release on a 2-core
machine, and slowed the hand-off for everyone). A waiter that gives up leaves the queue at once
(and passes the wake-up on when the lock is free); one that died (SIGKILL, lost connection) stops
renewing and is dropped when its deadline passes, by whichever attempt next finds it first. The
queue keys expire with their last waiter.

One copy of the queue's rules: every script below starts with :data:`QUEUE_FUNCTIONS`.
"""

from __future__ import annotations

from tasklock.core.scripting import Script
from tasklock.core.scripts import LEASE_FUNCTIONS

__all__ = [
    "FAIR_ACQUIRE",
    "FAIR_PERMIT_ACQUIRE",
    "FAIR_PERMIT_RELEASE",
    "FAIR_RELEASE",
    "LEAVE_QUEUE",
    "NEXT_PREFIX",
    "QUEUE_FUNCTIONS",
]

#: A wake-up message for one waiter: this prefix, then its token. Any other message on a wake
#: channel (a lock name: an unfair lock's release, or an older tasklock's) wakes every waiter.
NEXT_PREFIX = b"tasklock:next "

QUEUE_FUNCTIONS = (
    LEASE_FUNCTIONS
    + """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
-- Join at the tail, or stay in place, with a deadline `liveness` ms from now. The keys live at
-- least as long as the latest deadline: topped up to twice the liveness whenever less than one
-- is left (every live waiter renews within its liveness), so most renewals cost no PEXPIRE.
local function queue_join(q, w, member, now, liveness)
  if redis.call('ZADD', w, string.format('%d', now + liveness), member) == 1 then
    redis.call('RPUSH', q, member)
  end
  if redis.call('PTTL', w) < liveness then
    redis.call('PEXPIRE', q, 2 * liveness)
    redis.call('PEXPIRE', w, 2 * liveness)
  end
end
-- Take `member` out of the queue (`at_head`: it is first, so LPOP finds it at once).
local function queue_leave(q, w, member, at_head)
  if at_head then
    redis.call('LPOP', q)
  else
    redis.call('LREM', q, 1, member)
  end
  redis.call('ZREM', w, member)
end
-- May `member` take one of `free` free places? Dead waiters at the head are dropped first.
-- Returns allowed, where it is queued ('head', 'inside' or nil), and the first live waiter's
-- deadline (when it is someone else).
local function may_take(q, w, member, now, free)
  local head = redis.call('LINDEX', q, 0)
  local deadline
  while head do
    if head == member then
      return true, 'head', nil
    end
    deadline = tonumber(redis.call('ZSCORE', w, head))
    if deadline and deadline > now then
      break
    end
    redis.call('LPOP', q)
    redis.call('ZREM', w, head)
    head = redis.call('LINDEX', q, 0)
  end
  if not head then
    return true, nil, nil
  end
  if free > 1 then
    local first = redis.call('LRANGE', q, 0, free - 1)
    for i = 1, #first do
      if first[i] == member then
        return true, 'inside', deadline
      end
    end
    if #first < free and not redis.call('ZSCORE', w, member) then
      return true, nil, deadline
    end
  end
  return false, nil, deadline
end
-- Wake the first `count` queued waiters by name, each on its own process's channel
-- (`<channel>@<wake id>`: only that process's listener hears it); with nobody queued, wake
-- everyone on the lock's channel (unfair waiters, and older tasklocks, take any other message
-- there as a wake-up). A dead
-- waiter named here is dropped by the next try that finds it first past its deadline. Returns
-- what the last PUBLISH returned (a table when it was refused).
local function wake_next(q, channel, fallback, count)
  local waiting
  if count == 1 then
    waiting = {redis.call('LINDEX', q, 0)}
  else
    waiting = redis.call('LRANGE', q, 0, count - 1)
  end
  if not waiting[1] then
    return redis.pcall('PUBLISH', channel, fallback)
  end
  local answer
  for i = 1, #waiting do
    local process = string.match(waiting[i], '^[^ ]*')
    answer = redis.pcall('PUBLISH', channel .. '@' .. process, 'tasklock:next ' .. waiting[i])
  end
  return answer
end
"""
)

# KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] waiters' deadlines
# ARGV[1] owner token, ARGV[2] "1" = this attempt waits (join or stay queued), ARGV[3] how it
# stands in the queue ("<wake id> <token id>", tasklock.core.layouts.Layout.member), ARGV[4] TTL
# in ms, ARGV[5] the fence counter's TTL in ms, ARGV[6] a waiter's liveness in ms
# Returns {1, fence} when acquired, or {0, ms}: ms until the holder's key expires (-1: no TTL),
# or, when the lock is free but others are queued first, until the first one's deadline. The
# fence and the idempotent retry are ACQUIRE's (see tasklock.core.scripts).
FAIR_ACQUIRE = Script(
    "fair_acquire",
    QUEUE_FUNCTIONS
    + """
local member = ARGV[3]
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  local own = fence_of(redis.pcall('GET', KEYS[1]), ARGV[1])
  if own then
    return {1, own}
  end
  if ARGV[2] == '1' then
    queue_join(KEYS[3], KEYS[4], member, now_ms(), tonumber(ARGV[6]))
  end
  return {0, pttl}
end
local now, time = now_ms()
local allowed, queued, deadline = may_take(KEYS[3], KEYS[4], member, now, 1)
if not allowed then
  if ARGV[2] == '1' then
    queue_join(KEYS[3], KEYS[4], member, now, tonumber(ARGV[6]))
  end
  return {0, deadline - now}
end
if queued then
  queue_leave(KEYS[3], KEYS[4], member, queued == 'head')
end
local fence, text = issue_fence(KEYS[2], time, ARGV[5])
redis.call('SET', KEYS[1], ARGV[1] .. '#' .. text, 'PX', ARGV[4])
return {1, fence}
""",
)

# KEYS[1] lock key, KEYS[2] queue, KEYS[3] waiters' deadlines
# ARGV[1] the value this owner stored, ARGV[2] wake channel
# Returns RELEASE's answers: 1 released (the next waiter told), 2 released but the PUBLISH was
# refused, 0 not owned.
FAIR_RELEASE = Script(
    "fair_release",
    QUEUE_FUNCTIONS
    + """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if type(wake_next(KEYS[2], ARGV[2], KEYS[1], 1)) == 'table' then
    return 2
  end
  return 1
end
return 0
""",
)

# A waiter that gives up (its blocking_timeout passed, it was cancelled, an error) leaves the
# queue at once; when the lock (or a permit) is free, the waiters now first are woken, in case
# the wake-up had gone to the one leaving.
# KEYS[1] lock key (or permits), KEYS[2] queue, KEYS[3] waiters' deadlines
# ARGV[1] the waiter ("<wake id> <token id>"), ARGV[2] wake channel, ARGV[3] limit (1: a lock)
# Returns 1.
LEAVE_QUEUE = Script(
    "leave_queue",
    QUEUE_FUNCTIONS
    + """
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
  redis.call('LREM', KEYS[2], 1, ARGV[1])
  local kind = redis.call('TYPE', KEYS[1]).ok
  local free = 0
  if kind == 'none' then
    free = tonumber(ARGV[3])
  elseif kind == 'zset' then
    local live = redis.call('ZCOUNT', KEYS[1], string.format('(%d', now_ms()), '+inf')
    free = tonumber(ARGV[3]) - live
  end
  if free > 0 then
    wake_next(KEYS[2], ARGV[2], KEYS[1], free)
  end
end
return 1
""",
)

# A semaphore's acquire with the queue (see PERMIT_ACQUIRE for the permits themselves).
# KEYS[1] permits, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] waiters' deadlines
# ARGV[1] owner token, ARGV[2] "1" = this attempt waits (join or stay queued), ARGV[3] how it
# stands in the queue ("<wake id> <token id>", tasklock.core.layouts.Layout.member), ARGV[4] TTL
# in ms, ARGV[5] the fence counter's TTL in ms, ARGV[6] limit, ARGV[7] a waiter's liveness in ms
# Returns {1, fence}, or {0, ms until the first permit expires, or until the first queued
# waiter's deadline when a permit is free but others are queued first}.
FAIR_PERMIT_ACQUIRE = Script(
    "fair_permit_acquire",
    QUEUE_FUNCTIONS
    + """
local member = ARGV[3]
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'zset' and kind ~= 'none' then
  if ARGV[2] == '1' then
    queue_join(KEYS[3], KEYS[4], member, now_ms(), tonumber(ARGV[7]))
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
local ms, time = now_ms()
local taken = 0
if kind == 'zset' then
  local own
  own, taken = live_permits(KEYS[1], ms, ARGV[1])
  if own then
    return {1, own}
  end
end
local free = tonumber(ARGV[6]) - taken
local allowed, queued, deadline = false, nil, nil
if free > 0 then
  allowed, queued, deadline = may_take(KEYS[3], KEYS[4], member, ms, free)
end
if not allowed then
  if ARGV[2] == '1' then
    queue_join(KEYS[3], KEYS[4], member, ms, tonumber(ARGV[7]))
  end
  if deadline then
    return {0, deadline - ms}
  end
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2]) - ms}
end
if queued then
  queue_leave(KEYS[3], KEYS[4], member, queued == 'head')
end
local fence, text = issue_fence(KEYS[2], time, ARGV[5])
add_permit(KEYS[1], ms, tonumber(ARGV[4]), ARGV[1] .. '#' .. text)
return {1, fence}
""",
)

# A semaphore's release with the queue (see PERMIT_RELEASE): as many queued waiters are woken as
# permits are free (two releases in quick succession must wake two waiters, not the same first
# one twice while it has not taken its permit yet).
# KEYS[1] permits, KEYS[2] queue, KEYS[3] waiters' deadlines
# ARGV[1] the value this owner stored, ARGV[2] wake channel, ARGV[3] limit
# Returns PERMIT_RELEASE's answers.
FAIR_PERMIT_RELEASE = Script(
    "fair_permit_release",
    QUEUE_FUNCTIONS
    + """
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
  return 0
end
local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expires then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
local now = now_ms()
if tonumber(expires) <= now then
  return 0
end
local free = tonumber(ARGV[3]) - redis.call('ZCOUNT', KEYS[1], string.format('(%d', now), '+inf')
if type(wake_next(KEYS[2], ARGV[2], KEYS[1], math.max(free, 1))) == 'table' then
  return 2
end
return 1
""",
)
