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

#: KEYS[1]  the limit: a hash, one field per limit (``<period>ms``), its TAT in µs as the value;
#:          expires when every TAT is in the past (an idle limit costs no memory)
#: KEYS[2]  optional: this call's reservation key (the task layer's deferred calls), a string
#:          holding the reserved slot in µs
#: ARGV[1]  how long the caller will wait for its slot, in µs: 0 = not at all (a refused call
#:          consumes nothing), -1 = as long as it takes
#: ARGV[2]  with KEYS[2]: ms to keep a reservation past its slot; a call whose slot is further than
#:          the caller waits is then not refused but deferred: its slot is reserved and stored in
#:          KEYS[2] (for the wait plus this); 0 = refuse instead
#: ARGV[3]  how long a call that finds its reservation waits for its slot, in µs (-1: any); a
#:          deferred call that comes back early (clocks of hosts differ; RQ's scheduler works in
#:          whole seconds) sleeps the rest, and is deferred again when that is longer
#: ARGV[4..] per limit, three values: field, emission interval in µs, burst
#: Returns {status, wait in µs, remaining}: status 1 = admitted (after the wait, which is within
#:          what the caller waits), 0 = refused (nothing consumed; the wait is when to try again),
#:          2 = deferred (slot reserved in KEYS[2]; come back after the wait). A call that finds
#:          its reservation is admitted when the slot is within what it waits (the reservation is
#:          used up), and deferred again, reservation kept, when it is not.
RATE = Script(
    "rate",
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local max_wait = tonumber(ARGV[1])
local keep = tonumber(ARGV[2])
local early = tonumber(ARGV[3])

if KEYS[2] then
  local slot = redis.call('GET', KEYS[2])
  if slot then
    local wait = math.max(0, tonumber(slot) - now)
    if early < 0 or wait <= early then
      redis.call('DEL', KEYS[2])
      return {1, math.ceil(wait), 0}
    end
    return {2, math.ceil(wait), 0}
  end
end

local n = (#ARGV - 3) / 3
local fields, intervals, bursts = {}, {}, {}
for i = 1, n do
  fields[i] = ARGV[3 * i + 1]
  intervals[i] = tonumber(ARGV[3 * i + 2])
  bursts[i] = tonumber(ARGV[3 * i + 3])
end
local stored = redis.call('HMGET', KEYS[1], unpack(fields))
local at = now
local tats = {}
for i = 1, n do
  local tat = now
  if stored[i] then
    tat = math.max(now, tonumber(stored[i]))
  end
  tats[i] = tat
  at = math.max(at, tat + (1 - bursts[i]) * intervals[i])
end

local wait = at - now
local deferred = false
if max_wait >= 0 and wait > max_wait then
  if not (KEYS[2] and keep > 0) then
    return {0, math.ceil(wait), 0}
  end
  deferred = true
end

local expire = now
local remaining = nil
local values = {}
for i = 1, n do
  local interval, burst = intervals[i], bursts[i]
  local new = math.max(tats[i], at) + interval
  values[#values + 1] = fields[i]
  values[#values + 1] = string.format('%.3f', new)
  expire = math.max(expire, new)
  -- (a microsecond of tolerance: timestamps of 1.7e15 µs are exact to a quarter of one only,
  -- and 4 intervals of 1e6/7 µs would come out just under 4)
  local left = math.floor((now + burst * interval - new + math.min(1, interval / 1000)) / interval)
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
if deferred then
  redis.call('SET', KEYS[2], string.format('%.3f', at), 'PX', math.ceil(wait / 1000) + keep)
  return {2, math.ceil(wait), 0}
end
return {1, math.ceil(wait), math.max(0, remaining)}
""",
)
