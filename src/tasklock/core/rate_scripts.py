"""The rate limit's one script: GCRA over one or more limits, on the server's clock.

The arithmetic is explained in :mod:`tasklock.core.rates`. Times are microseconds on the server's
clock (``TIME``): no client clock is read, so hosts whose clocks disagree share one limit
exactly. TATs are kept with a thousandth of a microsecond (``%.3f``: Lua would print a plain
number with 14 significant digits, losing the microseconds of a timestamp); answers are whole
microseconds, a wait rounded up so that a caller who sleeps it is never early.
"""

from __future__ import annotations

from tasklock.core.scripting import Script

__all__ = ["RATE"]

#: Each limit keeps two timestamps, both GCRA TATs over the same rate and burst: its *slots*
#: (``<period>ms``: every call admitted or deferred takes the next one, so deferred calls get
#: their own slots in arrival order) and its *starts* (``<period>ms:starts``: taken when a call
#: is told to go). A call goes only when both admit it, and a deferred call that comes back goes
#: at its slot or, when it comes back late, at the next start the limit admits: calls that were
#: held up together (a backlog in the broker's queue) are spaced again rather than run at once,
#: so starts never exceed the rate even when deferred calls come back late.
#:
#: KEYS[1]  the limit: a hash of those timestamps in µs; it expires when every one is in the past
#:          (an idle limit costs no memory)
#: KEYS[2]  optional: this call's reservation key (the task layer's deferred calls), a string
#:          holding the reserved slot in µs
#: ARGV[1]  how long the caller will wait to go, in µs: 0 = not at all (a refused call consumes
#:          nothing), -1 = as long as it takes
#: ARGV[2]  with KEYS[2]: ms to keep a reservation past its slot; a call that would wait longer
#:          than ARGV[1] is then not refused but deferred: it takes its slot, which is stored in
#:          KEYS[2] (for the wait plus this); 0 = refuse instead
#: ARGV[3]  how long a call that finds its reservation waits to go, in µs (-1: any); further away
#:          (it came back early: clocks of hosts differ, RQ's scheduler works in whole seconds; or
#:          late, behind other starts) it is deferred again, its slot kept
#: ARGV[4..] per limit, three values: field, emission interval in µs, burst
#: Returns {status, wait in µs, remaining}: status 1 = admitted (go after the wait, which is
#:          within what the caller waits; a reservation found is used up), 0 = refused (nothing
#:          consumed; the wait is when to try again), 2 = deferred (come back after the wait; the
#:          reservation is stored in, or kept at, KEYS[2]).
RATE = Script(
    "rate",
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local max_wait = tonumber(ARGV[1])
local keep = tonumber(ARGV[2])
local early = tonumber(ARGV[3])

local n = (#ARGV - 3) / 3
local names, intervals, bursts = {}, {}, {}
for i = 1, n do
  names[2 * i - 1] = ARGV[3 * i + 1]
  names[2 * i] = ARGV[3 * i + 1] .. ':starts'
  intervals[i] = tonumber(ARGV[3 * i + 2])
  bursts[i] = tonumber(ARGV[3 * i + 3])
end
local stored = redis.call('HMGET', KEYS[1], unpack(names))
local slots, starts = {}, {}
-- The earliest time every limit has a slot free, and admits a start.
local slot_at, start_at = now, now
for i = 1, n do
  local slack = (1 - bursts[i]) * intervals[i]
  slots[i] = math.max(now, tonumber(stored[2 * i - 1]) or now)
  starts[i] = math.max(now, tonumber(stored[2 * i]) or now)
  slot_at = math.max(slot_at, slots[i] + slack)
  start_at = math.max(start_at, starts[i] + slack)
end

local reserved = false
if KEYS[2] then
  reserved = redis.call('GET', KEYS[2])
end
local at, limit
if reserved then
  at = math.max(tonumber(reserved), start_at)
  limit = early
else
  at = math.max(slot_at, start_at)
  limit = max_wait
end
local wait = at - now
local deferring = false
if limit >= 0 and wait > limit then
  if reserved then
    return {2, math.ceil(wait), 0}
  end
  if not (KEYS[2] and keep > 0) then
    return {0, math.ceil(wait), 0}
  end
  deferring = true
end

local values = {}
local expire = now
local remaining = nil
for i = 1, n do
  local interval, burst = intervals[i], bursts[i]
  if not reserved then
    slots[i] = math.max(slots[i], at) + interval
    values[#values + 1] = names[2 * i - 1]
    values[#values + 1] = string.format('%.3f', slots[i])
  end
  if not deferring then
    starts[i] = math.max(starts[i], at) + interval
    values[#values + 1] = names[2 * i]
    values[#values + 1] = string.format('%.3f', starts[i])
  end
  local latest = math.max(slots[i], starts[i])
  expire = math.max(expire, latest)
  -- (a microsecond of tolerance: timestamps of 1.7e15 µs are exact to a quarter of one only,
  -- and 4 intervals of 1e6/7 µs would come out just under 4)
  local tolerance = math.min(1, interval / 1000)
  local left = math.floor((now + burst * interval - latest + tolerance) / interval)
  if remaining == nil or left < remaining then
    remaining = left
  end
end
redis.call('HSET', KEYS[1], unpack(values))
-- Only ever lengthened: callers of one name with other rates (a longer period) keep their state.
local ttl = math.ceil((expire - now) / 1000) + 1
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
if deferring then
  redis.call('SET', KEYS[2], string.format('%.3f', at), 'PX', math.ceil(wait / 1000) + keep)
  return {2, math.ceil(wait), 0}
end
if reserved then
  redis.call('DEL', KEYS[2])
end
return {1, math.ceil(wait), math.max(0, remaining)}
""",
)
