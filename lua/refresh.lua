-- refresh.lua: extend the TTL of a batch of holds (locks, permits, shared holds), each only if
-- it is still held. One call refreshes the whole batch: one reply, one round trip.
-- KEYS: the keys of every hold, one hold after another.
-- ARGV: three per hold: its shape, its value (owner .. metadata), the new TTL in ms. The
-- shape of a lock is its number of keys, each a string that must hold the value; 'p' is a
-- semaphore permit, whose one key is its semaphore (see semaphore/acquire.lua); 'r' and a
-- number is a shared hold of that many keys (see read/acquire.lua).
-- Returns one integer per hold: 1 when refreshed, 0 when no longer held (left untouched:
-- an expired permit is never revived).
local total, timed = 0, false
for i = 1, #ARGV, 3 do
  local shape, ttl = ARGV[i], tonumber(ARGV[i + 2])
  local kind = string.sub(shape, 1, 1)
  local count = (kind == 'p' and 1) or (kind == 'r' and tonumber(string.sub(shape, 2)))
    or tonumber(shape)
  timed = timed or kind == 'p' or kind == 'r'
  if not count or count < 1 or not ttl or ttl < 1 then
    return redis.error_reply('ERR redguard refresh: bad key count or ttl')
  end
  total = total + count
end
if total ~= #KEYS or #ARGV % 3 ~= 0 then
  return redis.error_reply('ERR redguard refresh: keys and arguments do not match')
end

-- Permits expire on this server's clock (see semaphore/acquire.lua, also for why the
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
  -- Every key must still be shared by us, live on the server's clock (see read/).
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
    -- Never shorter than the last member's (a longer one may be another reader's).
    if redis.call('pttl', KEYS[j]) < tonumber(ttl) then
      redis.call('pexpireat', KEYS[j], expiry)
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
