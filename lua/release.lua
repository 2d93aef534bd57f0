-- release.lua: delete every key, if every key still holds our value.
-- KEYS: the lock keys.
-- ARGV[1]: our value (token .. metadata).
-- Returns 1 when released, 0 when the lock is no longer held (nothing is deleted then).
local values = redis.call('mget', unpack(KEYS))
for i = 1, #KEYS do
  if values[i] ~= ARGV[1] then
    return 0
  end
end

redis.call('del', unpack(KEYS))
return 1
