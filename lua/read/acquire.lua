-- read/acquire.lua: a shared hold of every key, or of none.
-- A key shared by readers is a sorted set: the member '' scored -inf (which tells it from
-- a semaphore, or from a sorted set of someone else's), each reader's value scored by
-- when it expires, and each waiting lock's intent ('!' .. its value, see ../acquire.lua)
-- scored by minus when it expires; in ms, on this server's clock. So the expired, readers
-- and intents alike, are the scores from -now to now. The key's TTL is never shorter
-- than its last member's.
-- KEYS: the keys; with fencing, followed by one fencing counter per key.
-- ARGV[1]: the value to store (owner .. metadata); ARGV[2]: the TTL in ms; ARGV[3]: '1'
-- for the keys' fencing counters, else '0'.
-- Returns 1 when every key is now shared by us too (with fencing: {'read', each key's
-- counter as it is, 0 where there is none}); {'busy', ms} (or 0) when a key is held by
-- a lock, or a waiting lock's live intent is on it (readers wait behind it): ms until
-- what holds it expires; {'wrongtype', key, type} when a key (or a counter) holds
-- something else. Nothing is changed unless every key is taken (but the expired go).
local ttl = tonumber(ARGV[2])
local fencing = ARGV[3] == '1'
local n = fencing and #KEYS / 2 or #KEYS
if not ttl or ttl < 1 or n < 1 or n ~= math.floor(n) or #ARGV[1] < 1 then
  return redis.error_reply('ERR redguard read acquire: bad value, ttl or key count')
end
-- No replicate_commands: this needs Redis 5 or newer, which replicates the writes of a
-- script that called TIME as the writes themselves.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local new = {}
for i = 1, n do
  -- One call tells ours from free, another type, or a sorted set of someone else's.
  local marker = redis.pcall('zscore', KEYS[i], '')
  if type(marker) == 'table' then
    if not string.find(marker.err or '', '^WRONGTYPE') then
      return marker
    end
    local kind = redis.call('type', KEYS[i]).ok
    if kind ~= 'string' then
      return {'wrongtype', KEYS[i], kind}
    end
    -- Held by a lock: its release will be heard, unless it dies; then it expires.
    local left = redis.call('pttl', KEYS[i])
    return left > 0 and {'busy', left} or 0
  elseif marker == '-inf' then
    redis.call('zremrangebyscore', KEYS[i], -now, now)
    -- Above the marker: the intent that expires last, if any (else a reader, or nothing).
    local next = redis.call('zrange', KEYS[i], 1, 1, 'withscores')[2]
    if next and tonumber(next) < 0 then
      -- A lock waits for this key: behind it, until it takes the key (heard), takes its
      -- intent back (heard), or dies (its intent expires then).
      return {'busy', math.max(1, -tonumber(next) - now)}
    end
  elseif marker or redis.call('exists', KEYS[i]) == 1 then
    return {'wrongtype', KEYS[i], 'zset, not a read lock'}
  else
    new[i] = true
  end
end
for i = n + 1, #KEYS do
  local kind = redis.call('type', KEYS[i]).ok
  local value = kind == 'string' and redis.call('get', KEYS[i])
  if kind ~= 'none' and not (value and #value <= 15
      and (value == '0' or string.match(value, '^[1-9]%d*$'))) then
    return {'wrongtype', KEYS[i], kind .. ', not a fencing counter'}
  end
end

local expiry = string.format('%.0f', now + ttl)
for i = 1, n do
  redis.call('zadd', KEYS[i], '-inf', '', expiry, ARGV[1])
  if new[i] then
    redis.call('pexpireat', KEYS[i], expiry)
  elseif redis.REDIS_VERSION_NUM then
    redis.call('pexpireat', KEYS[i], expiry, 'GT') -- Redis 7: only ever later
  else
    local left = redis.call('pttl', KEYS[i])
    if left < ttl then
      redis.call('pexpireat', KEYS[i], expiry)
    end
  end
end
if not fencing then
  return 1
end
local fences = {'read'}
for i = n + 1, #KEYS do
  fences[#fences + 1] = tonumber(redis.call('get', KEYS[i]) or '0')
end
return fences
