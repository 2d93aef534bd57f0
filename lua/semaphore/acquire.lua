-- semaphore/acquire.lua: take one permit of a semaphore, if fewer than its limit are held.
-- KEYS[1]: the semaphore, a sorted set: each holder's value, scored by when it expires
-- (ms on this server's clock: no client's clock is ever compared with another's), and
-- the member '' (never a value: values are not empty) scored by minus the limit in use;
-- KEYS[2], with fencing only: the semaphore's fencing counter.
-- ARGV[1]: the value to store (owner .. metadata); ARGV[2]: the owner part's length in
-- bytes; ARGV[3]: the TTL in ms; ARGV[4]: '1' for a fencing token, else '0'; ARGV[5]: the
-- limit; ARGV[6]: '1' when the token is the caller's own, whose owner re-obtains the
-- permit it holds instead of taking a second one.
-- Returns 1 for a new permit (with fencing: {'fences', token}), 2 when this value (or, for
-- a fixed token, this owner) held one already, now set to the new TTL (with fencing:
-- {'kept', a new token}); {'full', ms} when every permit is held, with the time until
-- the first of them expires; {'limit', stored} when live holders use another limit;
-- {'wrongtype', key, type} when a key holds something else. Nothing is changed unless
-- the permit is taken (but expired holders are dropped). A sorted set without the limit
-- member is someone else's: 'wrongtype', and it is left untouched.
local owner_len, ttl, limit = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local fencing = ARGV[4] == '1'
if not owner_len or owner_len < 1 or owner_len > #ARGV[1] or not ttl or ttl < 1
    or not limit or limit < 1 or #KEYS ~= (fencing and 2 or 1) then
  return redis.error_reply('ERR redguard semaphore acquire: bad owner length, ttl, limit or keys')
end
-- Before any write: the expiries come from TIME, so the writes must be replicated as
-- such, not as the script: the default from Redis 5, the only way from Redis 7 (which has
-- REDIS_VERSION_NUM, and where the call is a costly no-op).
if redis.replicate_commands and not redis.REDIS_VERSION_NUM then
  redis.replicate_commands()
end
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- Each key is used first through pcall: one of another type answers WRONGTYPE, and only
-- then is its type asked (no extra call on the usual path). Other errors are passed on.
local function first(key, what, command, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    if not string.find(reply.err, '^WRONGTYPE') then
      return nil, reply
    end
    local kind = redis.call('type', key).ok
    return nil, {'wrongtype', key, what and (kind .. ', not ' .. what) or kind}
  end
  return reply
end
-- Ours, or free: the lowest member of a semaphore is the limit, as minus an integer.
local lowest, failure = first(KEYS[1], nil, 'zrange', 0, 0, 'withscores')
if failure then
  return failure
end
local stored = lowest[1] == '' and -tonumber(lowest[2])
if lowest[1] and not (stored and stored >= 1 and stored < math.huge
    and stored == math.floor(stored)) then
  return {'wrongtype', KEYS[1], 'zset, not a semaphore'}
end
local count = stored and redis.call('zcard', KEYS[1]) or 0
if fencing then
  local counter
  counter, failure = first(KEYS[2], 'a fencing counter', 'get')
  if failure then
    return failure
  end
  -- Exactly the digits INCR accepts (and Lua's numbers keep exact): at most 15.
  if counter and not (#counter <= 15 and (counter == '0' or string.match(counter, '^[1-9]%d*$'))) then
    return {'wrongtype', KEYS[2], 'string, not a fencing counter'}
  end
end
if count > 0 then
  -- Expired holders go; the limit, scored below 0, stays.
  count = count - 1 - redis.call('zremrangebyscore', KEYS[1], 0, now)
end
if count > 0 and stored ~= limit then
  return {'limit', string.format('%.0f', stored)}
end

-- Ours already: the same value (a request sent again), or the same fixed owner.
local mine = count > 0 and redis.call('zscore', KEYS[1], ARGV[1]) and ARGV[1]
if not mine and count > 0 and ARGV[6] == '1' then
  local owner = string.sub(ARGV[1], 1, owner_len)
  for _, holder in ipairs(redis.call('zrange', KEYS[1], 0, -1)) do
    if string.sub(holder, 1, owner_len) == owner then
      mine = holder
      break
    end
  end
end
if not mine and count >= limit then
  local earliest = redis.call('zrangebyscore', KEYS[1], '(0', '+inf', 'withscores', 'limit', 0, 1)
  return {'full', math.max(1, tonumber(earliest[2]) - now)}
end

if mine then
  redis.call('zrem', KEYS[1], mine)
end
-- Integers as Redis wants them (a Lua number would be written with 14 digits at most).
local expiry = string.format('%.0f', now + ttl)
redis.call('zadd', KEYS[1], -limit, '', expiry, ARGV[1])
-- The semaphore goes when its last holder expires.
local last = expiry
if count > (mine and 1 or 0) then
  last = string.format('%.0f', tonumber(redis.call('zrange', KEYS[1], -1, -1, 'withscores')[2]))
end
redis.call('pexpireat', KEYS[1], last)
if not fencing then
  return mine and 2 or 1
end
return {mine and 'kept' or 'fences', redis.call('incr', KEYS[2])}
