-- semaphore/acquire.lua: take one permit of a semaphore, if fewer than its limit are held.
-- KEYS[1]: the holders, a sorted set of values, each scored by when it expires (ms on this
-- server's clock: no client's clock is ever compared with another's); KEYS[2]: the limit
-- in use; KEYS[3], with fencing only: the semaphore's fencing counter.
-- ARGV[1]: the value to store (owner .. metadata); ARGV[2]: the owner part's length in
-- bytes; ARGV[3]: the TTL in ms; ARGV[4]: '1' for a fencing token, else '0'; ARGV[5]: the
-- limit; ARGV[6]: '1' when the token is the caller's own, whose owner re-obtains the
-- permit it holds instead of taking a second one.
-- Returns 1 for a new permit (with fencing: {'fences', token}), 2 when this value (or, for
-- a fixed token, this owner) held one already, now set to the new TTL (with fencing:
-- {'kept', a new token}); {'full', ms} when every permit is held, with the time until
-- the first of them expires; {'limit', stored} when live holders use another limit;
-- {'wrongtype', key, type} when a key holds something else. Nothing is changed unless
-- the permit is taken (but expired holders are dropped).
local owner_len, ttl, limit = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local fencing = ARGV[4] == '1'
if not owner_len or owner_len < 1 or owner_len > #ARGV[1] or not ttl or ttl < 1
    or not limit or limit < 1 or #KEYS ~= (fencing and 3 or 2) then
  return redis.error_reply('ERR redguard semaphore acquire: bad owner length, ttl, limit or keys')
end
-- Before any write: the expiries come from TIME, so the writes must be replicated as
-- such, not as the script (the default from Redis 5, the only way from Redis 7).
if redis.replicate_commands then
  redis.replicate_commands()
end

-- Exactly the digits INCR accepts (and Lua's numbers keep exact): at most 15.
local function is_count(value)
  return value and #value <= 15 and (value == '0' or string.match(value, '^[1-9]%d*$'))
end
local kind = redis.call('type', KEYS[1]).ok
if kind ~= 'zset' and kind ~= 'none' then
  return {'wrongtype', KEYS[1], kind}
end
kind = redis.call('type', KEYS[2]).ok
local stored = kind == 'string' and redis.call('get', KEYS[2])
if kind ~= 'none' and not (is_count(stored) and stored ~= '0') then
  return {'wrongtype', KEYS[2], kind .. ', not a semaphore limit'}
end
if fencing then
  kind = redis.call('type', KEYS[3]).ok
  if kind ~= 'none' and not is_count(kind == 'string' and redis.call('get', KEYS[3])) then
    return {'wrongtype', KEYS[3], kind .. ', not a fencing counter'}
  end
end

local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- An integer as Redis wants it (a Lua number would be written with 14 digits at most).
local function ms(number)
  return string.format('%.0f', number)
end
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
local count = redis.call('zcard', KEYS[1])
if count > 0 and stored and tonumber(stored) ~= limit then
  return {'limit', stored}
end

-- Ours already: the same value (a request sent again), or the same fixed owner.
local mine = redis.call('zscore', KEYS[1], ARGV[1]) and ARGV[1]
if not mine and ARGV[6] == '1' then
  local owner = string.sub(ARGV[1], 1, owner_len)
  for _, holder in ipairs(redis.call('zrange', KEYS[1], 0, -1)) do
    if string.sub(holder, 1, owner_len) == owner then
      mine = holder
      break
    end
  end
end
if not mine and count >= limit then
  local first = redis.call('zrange', KEYS[1], 0, 0, 'withscores')
  return {'full', math.max(1, tonumber(first[2]) - now)}
end

if mine then
  redis.call('zrem', KEYS[1], mine)
end
redis.call('zadd', KEYS[1], ms(now + ttl), ARGV[1])
redis.call('set', KEYS[2], ARGV[5])
-- Both keys go when the last holder expires.
local last = ms(tonumber(redis.call('zrange', KEYS[1], -1, -1, 'withscores')[2]))
redis.call('pexpireat', KEYS[1], last)
redis.call('pexpireat', KEYS[2], last)
if not fencing then
  return mine and 2 or 1
end
return {mine and 'kept' or 'fences', redis.call('incr', KEYS[3])}
