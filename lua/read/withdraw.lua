-- read/withdraw.lua: a lock that stopped waiting takes back its intent (see
-- ../acquire.lua), so that readers need not wait for it to expire.
-- KEYS: the lock's keys. ARGV[1]: the lock's value; ARGV[2]: where release channels start
-- (see ../release.lua), or '' to announce nothing.
-- Returns how many keys had the intent. Each is announced (readers wait behind it), and
-- deleted when nothing is left on it but the marker.
local taken = 0
for _, key in ipairs(KEYS) do
  if redis.pcall('zscore', key, '') == '-inf' and redis.call('zrem', key, '!' .. ARGV[1]) == 1 then
    taken = taken + 1
    if redis.call('zcard', key) == 1 then
      redis.call('del', key)
    end
    if ARGV[2] ~= '' then
      redis.pcall('publish', ARGV[2] .. key, '')
    end
  end
end
return taken
