-- acquire.lua: take every key, or none of them, without the queue: for a lock on a quorum
-- of servers or across cluster slots (elsewhere, see queue/acquire.lua).
-- KEYS: the lock keys; with fencing, followed by one fencing counter per lock key.
-- ARGV[1]: the value to store (owner .. metadata); ARGV[2]: the owner part's length in
-- bytes (a random token, or a fixed one as '<length>:<token>': never the start of another);
-- ARGV[3]: the TTL in milliseconds; ARGV[4]: '1' for fencing tokens, else '0'.
-- Returns 1 when every key is now ours (with fencing: {'fences', token per key}), 2 when
-- they already were, re-obtained by the same owner (with fencing: {'kept', token per
-- key}), 0 when another owner or live readers hold one of them, and {'wrongtype', key,
-- type} when a key (or a counter) holds another Redis type. Nothing is changed unless
-- every key is ours (but expired readers are dropped).
local owner_len, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local fencing = ARGV[4] == '1'
local n = fencing and #KEYS / 2 or #KEYS
if not owner_len or owner_len < 1 or owner_len > #ARGV[1] or not ttl or ttl < 1
    or n ~= math.floor(n) then
  -- Checked before any write: PEXPIRE 0 would delete the keys, a bad TTL keep them forever.
  -- (Numbers only check; the strings go to PEXPIRE, as a Lua number loses digits.)
  return redis.error_reply('ERR redguard acquire: bad owner length, ttl or key count')
end

-- Every counter must be absent, or a plain non-negative integer small enough for INCR and
-- for Lua's numbers to stay exact, and none may be one of the lock keys: so that no INCR
-- can fail once the keys are set (a script is not rolled back).
if fencing then
  local locked = {}
  for i = 1, n do
    locked[KEYS[i]] = true
  end
  for i = n + 1, #KEYS do
    local kind = redis.call('type', KEYS[i]).ok
    if locked[KEYS[i]] then
      return {'wrongtype', KEYS[i], 'lock key that is also a fencing counter'}
    end
    if kind ~= 'none' then
      local value = kind == 'string' and redis.call('get', KEYS[i])
      -- Exactly the form INCR accepts: digits without leading zeros, at most 15 of them.
      if not value or #value > 15
          or not (value == '0' or string.match(value, '^[1-9]%d*$')) then
        return {'wrongtype', KEYS[i], kind .. ', not a fencing counter'}
      end
    end
  end
end

local args = {}
for i = 1, n do
  args[2 * i - 1] = KEYS[i]
  args[2 * i] = ARGV[1]
end

local fresh = redis.call('msetnx', unpack(args)) == 1
if not fresh then
  -- Some key exists: held by an owner (a string), shared by readers (a sorted set of
  -- theirs, see queue/acquire.lua), or of another type, which is never overwritten.
  local now, shared, unread = nil, {}, {}
  local owner = string.sub(ARGV[1], 1, owner_len)
  local taken, mine = false, 0
  for i = 1, n do
    local kind = redis.call('type', KEYS[i]).ok
    if kind == 'zset' then
      if redis.call('zscore', KEYS[i], '') ~= '-inf' then
        return {'wrongtype', KEYS[i], 'zset, not a read lock'}
      end
      if not now then
        local time = redis.call('time')
        now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
      end
      -- Readers are scored by their expiry: drop the expired.
      redis.call('zremrangebyscore', KEYS[i], '(-inf', now)
      if redis.call('zcard', KEYS[i]) > 1 then
        shared[#shared + 1] = KEYS[i]
      else
        unread[#unread + 1] = KEYS[i] -- no reader left: a writer may take it
      end
    elseif kind == 'string' then
      -- The same owner may re-obtain its own keys. Owner parts are self-delimiting, so a
      -- value that starts with ours is exactly our owner's.
      if redis.call('getrange', KEYS[i], 0, owner_len - 1) == owner then
        mine = mine + 1
      else
        taken = true
      end
    elseif kind ~= 'none' then
      return {'wrongtype', KEYS[i], kind}
    end
  end
  if taken or #shared > 0 then
    return 0 -- held: by readers, or by another owner
  end
  if #unread > 0 then
    -- No reader left on these keys: they are free, as the others may be.
    redis.call('del', unpack(unread))
    fresh = redis.call('msetnx', unpack(args)) == 1
    if not fresh then
      return 0 -- some other key is our own: a re-obtain is of all the keys or none
    end
  elseif mine == n then
    redis.call('mset', unpack(args)) -- re-obtained, all of them
  else
    return 0 -- some keys ours, others free: all or none
  end
end

for i = 1, n do
  redis.call('pexpire', KEYS[i], ARGV[3])
end
if not fencing then
  return fresh and 1 or 2
end

-- A new acquisition gets the next token of each key; a re-obtain keeps the current one.
local fences = {fresh and 'fences' or 'kept'}
for i = n + 1, #KEYS do
  local current = redis.call('get', KEYS[i])
  if fresh or not current or tonumber(current) < 1 then
    fences[#fences + 1] = redis.call('incr', KEYS[i])
  else
    fences[#fences + 1] = tonumber(current)
  end
end
return fences
