-- acquire.lua: take every key, or none of them.
-- KEYS: the lock keys; with fencing, followed by one fencing counter per lock key.
-- ARGV[1]: the value to store (owner .. metadata); ARGV[2]: the owner part's length in
-- bytes (a random token, or a fixed one as '<length>:<token>': never the start of another);
-- ARGV[3]: the TTL in milliseconds; ARGV[4]: '1' for fencing tokens, else '0'; ARGV[5],
-- for a hand-over only: the releasing guard's value, which every key must still hold, and
-- which ours then replaces (a fresh acquisition: new fencing tokens).
-- Returns 1 when every key is now ours (with fencing: {'fences', token per key}), 2 when
-- they already were, re-obtained by the same owner (with fencing: {'kept', token per
-- key}), 0 when another owner holds one of them, and {'wrongtype', key, type} when a key
-- (or a counter) holds another Redis type (or, for a hand-over, 0 when some key no
-- longer holds the releasing guard's value). Nothing is changed unless every key is ours.
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

local over = ARGV[5]
local fresh
if over then
  -- A hand-over: only from the releasing guard, on every key, to us.
  local values = redis.call('mget', unpack(KEYS, 1, n))
  for i = 1, n do
    if values[i] ~= over then
      return 0
    end
  end
  redis.call('mset', unpack(args))
  fresh = true
else
  fresh = redis.call('msetnx', unpack(args)) == 1
end
if not fresh then
  -- Some key exists. Never overwrite a value of another type.
  for i = 1, n do
    local kind = redis.call('type', KEYS[i]).ok
    if kind ~= 'string' and kind ~= 'none' then
      return {'wrongtype', KEYS[i], kind}
    end
  end
  -- The same owner may re-obtain its own keys, all of them or none. Owner parts are
  -- self-delimiting, so a value that starts with ours is exactly our owner's.
  local owner = string.sub(ARGV[1], 1, owner_len)
  for i = 1, n do
    if redis.call('getrange', KEYS[i], 0, owner_len - 1) ~= owner then
      return 0
    end
  end
  redis.call('mset', unpack(args))
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
