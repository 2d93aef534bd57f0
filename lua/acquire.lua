-- acquire.lua: take every key, or none of them.
-- KEYS: the lock keys.
-- ARGV[1]: the value to store (token .. metadata); ARGV[2]: the token's length in bytes;
-- ARGV[3]: the TTL in milliseconds.
-- Returns 1 when every key is now ours, 0 when another owner holds one of them, and
-- {key, type} when a key holds another Redis type (nothing is changed then).
local token_len, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
if not token_len or token_len < 1 or token_len > #ARGV[1] or not ttl or ttl < 1 then
  -- Checked before any write: PEXPIRE 0 would delete the keys, a bad TTL keep them forever.
  -- (Numbers only check; the strings go to PEXPIRE, as a Lua number loses digits.)
  return redis.error_reply('ERR redguard acquire: bad token length or ttl')
end

local args = {}
for i, key in ipairs(KEYS) do
  args[2 * i - 1] = key
  args[2 * i] = ARGV[1]
end

if redis.call('msetnx', unpack(args)) == 0 then
  -- Some key exists. Never overwrite a value of another type.
  for _, key in ipairs(KEYS) do
    local kind = redis.call('type', key).ok
    if kind ~= 'string' and kind ~= 'none' then
      return {key, kind}
    end
  end
  -- The same owner (same token prefix) may re-obtain its own keys, all of them or none.
  local token = string.sub(ARGV[1], 1, token_len)
  for _, key in ipairs(KEYS) do
    if redis.call('getrange', key, 0, token_len - 1) ~= token then
      return 0
    end
  end
  redis.call('mset', unpack(args))
end

for _, key in ipairs(KEYS) do
  redis.call('pexpire', key, ARGV[3])
end
return 1
