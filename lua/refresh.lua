-- refresh.lua: extend the TTL of every key, if every key still holds our value.
-- KEYS: the lock keys.
-- ARGV[1]: our value (token .. metadata); ARGV[2]: the new TTL in milliseconds.
-- Returns 1 when refreshed, 0 when the lock is no longer held (nothing is changed then).
local values = redis.call('mget', unpack(KEYS))
for i = 1, #KEYS do
  if values[i] ~= ARGV[1] then
    return 0
  end
end

for _, key in ipairs(KEYS) do
  redis.call('pexpire', key, ARGV[2])
end
return 1
