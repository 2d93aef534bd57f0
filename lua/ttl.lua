-- ttl.lua: the shortest remaining TTL of the keys, if every key still holds our value.
-- KEYS: the lock keys.
-- ARGV[1]: our value (token .. metadata).
-- Returns the shortest TTL in milliseconds, -1 when no key has a TTL (someone ran PERSIST),
-- and -2 when the lock is no longer held.
local values = redis.call('mget', unpack(KEYS))
for i = 1, #KEYS do
  if values[i] ~= ARGV[1] then
    return -2
  end
end

local shortest = -1
for _, key in ipairs(KEYS) do
  local ttl = redis.call('pttl', key)
  if ttl >= 0 and (shortest == -1 or ttl < shortest) then
    shortest = ttl
  end
end
return shortest
