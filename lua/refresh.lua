-- refresh.lua: extend the TTL of a batch of holds (locks, permits, shared holds), each only if
-- it is still held. One call refreshes the whole batch: one reply, one round trip.
-- KEYS: the keys of every hold, one hold after another.
-- ARGV: three per hold: its shape, its value (owner .. metadata), the new TTL in ms. The
-- shape of a lock is its number of keys, each a string that must hold the value; 'p' is a
-- semaphore permit, whose one key is its semaphore (see queue/acquire.lua); 'r' and a
-- number is a shared hold of that many keys (see queue/acquire.lua); 'w' and a number is
-- a waiter's queue entry (see queue/queue.lua) on that many keys, whose keys are those
-- keys, then their queues, their expiries and their tickets, whose value is the entry and
-- whose TTL is how long the entry lives from now.
-- Returns one integer per hold: 1 when refreshed, 0 when no longer held (left untouched:
-- an expired permit is never revived); for an entry, 1 when it is still in every queue,
-- 0 when not (its waiter was given its hold, or was dropped as dead), or when it is first
-- in every queue and its keys look free (what held them expired without a release): 0
-- has its waiter ask, and its attempt takes them.
local total, timed = 0, false
for i = 1, #ARGV, 3 do
  local shape, ttl = ARGV[i], tonumber(ARGV[i + 2])
  local kind = string.sub(shape, 1, 1)
  local count = (kind == 'p' and 1) or (kind == 'r' and tonumber(string.sub(shape, 2)))
    or (kind == 'w' and (tonumber(string.sub(shape, 2)) or 0) * 4) or tonumber(shape)
  timed = timed or kind == 'p' or kind == 'r' or kind == 'w'
  if not count or count < 1 or not ttl or ttl < 1 then
    return redis.error_reply('ERR redguard refresh: bad key count or ttl')
  end
  total = total + count
end
if total ~= #KEYS or #ARGV % 3 ~= 0 then
  return redis.error_reply('ERR redguard refresh: keys and arguments do not match')
end

-- Permits expire on this server's clock (see queue/acquire.lua, also for why the
-- writes must be replicated as such, which is decided before the first write).
local now
if timed then
  if redis.replicate_commands and not redis.REDIS_VERSION_NUM then
    redis.replicate_commands()
  end
  local time = redis.call('time')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local function refresh_lock(first, last, value, ttl)
  local values = redis.call('mget', unpack(KEYS, first, last))
  for j = 1, #values do
    if values[j] ~= value then
      return 0
    end
  end
  for j = first, last do
    redis.call('pexpire', KEYS[j], ttl)
  end
  return 1
end

local function refresh_permit(holders, value, ttl)
  -- Another type here must not fail the whole batch: the permit is just not held; nor is
  -- it in a sorted set without the limit member (not a semaphore).
  local limit = redis.pcall('zscore', holders, '')
  if type(limit) ~= 'string' or limit == '-inf' then
    return 0 -- not a semaphore (-inf marks a read lock)
  end
  redis.call('zremrangebyscore', holders, 0, now)
  if not redis.call('zscore', holders, value) then
    return 0
  end
  redis.call('zadd', holders, 'XX', string.format('%.0f', now + tonumber(ttl)), value)
  local last = redis.call('zrange', holders, -1, -1, 'withscores')[2]
  last = string.format('%.0f', tonumber(last))
  redis.call('pexpireat', holders, last)
  return 1
end

local function refresh_read(first, last, value, ttl)
  -- Every key must still be shared by us, live on the server's clock (see queue/queue.lua).
  for j = first, last do
    local ours = redis.pcall('zscore', KEYS[j], '') == '-inf'
    local expiry = ours and redis.call('zscore', KEYS[j], value)
    if not expiry or tonumber(expiry) <= now then
      return 0
    end
  end
  local expiry = string.format('%.0f', now + tonumber(ttl))
  for j = first, last do
    redis.call('zadd', KEYS[j], 'XX', expiry, value)
    -- The key lives as long as its last reader (never shorter: a longer one may be
    -- another's; and shorter once ours was shortened, by a release before hold_at_least
    -- ran out, so that a writer's renewal finds the key gone when the last reader is).
    local latest = redis.call('zrange', KEYS[j], -1, -1, 'withscores')
    redis.call('pexpireat', KEYS[j], string.format('%.0f', tonumber(latest[2])))
  end
  return 1
end

-- Whether `key` looks free for the waiter of `entry` (see queue/queue.lua).
local function looks_free(key, entry)
  local kind = string.sub(entry, 1, 1)
  local found = redis.call('type', key).ok
  if kind == 'l' then
    return found == 'none'
  elseif kind == 'r' then
    return found ~= 'string'
  end
  local limit = tonumber(string.match(entry, '^p(%d+),'))
  return found == 'none' or (found == 'zset' and limit
    and redis.call('zcount', key, '(' .. string.format('%.0f', now), '+inf') < limit)
end

local function renew_entry(first, count, member, lifetime)
  local queues = first + count
  local head = true
  for j = queues, queues + count - 1 do
    -- Waiters that stopped renewing go first (so a dead one before us costs no more).
    local dead = redis.pcall('zrangebyscore', KEYS[j + count], '-inf', now, 'LIMIT', 0, 1000)
    if type(dead) == 'table' and #dead > 0 and not dead.err then
      redis.pcall('zrem', KEYS[j], unpack(dead))
      redis.pcall('zrem', KEYS[j + count], unpack(dead))
      if redis.call('exists', KEYS[j]) == 0 then
        redis.call('del', KEYS[j + count], KEYS[j + 2 * count]) -- the queue went with them
      end
    end
    local place = redis.pcall('zrank', KEYS[j], member)
    if type(place) ~= 'number' then
      return 0
    end
    -- A lock or permit waiter asks whenever its keys look free (they pass from one
    -- waiter to the next in the release script, so free keys with waiters mean what held
    -- them expired, or the first waiter is a multi-key one blocked elsewhere); a reader
    -- only when first (readers queue behind a writer while others read).
    local first = place == 0 or string.sub(member, 1, 1) ~= 'r'
    head = head and first and looks_free(KEYS[j - count], member)
  end
  if head then
    return 0 -- its own attempt takes the keys (or serves whoever is first)
  end
  local expiry = string.format('%.0f', now + tonumber(lifetime))
  for j = queues, queues + count - 1 do
    local queue, alive, ticket = KEYS[j], KEYS[j + count], KEYS[j + 2 * count]
    redis.pcall('zadd', alive, expiry, member)
    if redis.call('pttl', queue) < tonumber(lifetime) then
      -- Twice the lifetime, as queue/queue.lua's q_join sets it.
      redis.call('pexpire', queue, 2 * lifetime)
      redis.call('pexpire', alive, 2 * lifetime)
      redis.call('pexpire', ticket, 2 * lifetime)
    end
  end
  return 1
end

local results = {}
local first = 1
for i = 1, #ARGV, 3 do
  local shape, value, ttl = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if shape == 'p' then
    results[#results + 1] = refresh_permit(KEYS[first], value, ttl)
    first = first + 1
  elseif string.sub(shape, 1, 1) == 'w' then
    local count = tonumber(string.sub(shape, 2))
    results[#results + 1] = renew_entry(first, count, value, ttl)
    first = first + 4 * count
  elseif string.sub(shape, 1, 1) == 'r' then
    local last = first + tonumber(string.sub(shape, 2)) - 1
    results[#results + 1] = refresh_read(first, last, value, ttl)
    first = last + 1
  else
    local last = first + tonumber(shape) - 1
    results[#results + 1] = refresh_lock(first, last, value, ttl)
    first = last + 1
  end
end
return results
