-- read/downgrade.lua: turn a lock into a shared hold of the same keys, in one step.
-- KEYS: the lock's keys. ARGV[1]: the lock's value, which becomes the reader's; ARGV[2]:
-- the TTL in ms; ARGV[3]: where release channels start (see ../release.lua), or ''.
-- Returns 1 (+ 2 * the most listeners an announcement reached) when every key held the
-- value and is now shared by it; 0 when some key no longer held it (nothing changed).
local values = redis.call('mget', unpack(KEYS))
for i = 1, #KEYS do
  if values[i] ~= ARGV[1] then
    return 0
  end
end
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expiry = string.format('%.0f', now + tonumber(ARGV[2]))
local listeners = 0
for _, key in ipairs(KEYS) do
  redis.call('del', key)
  redis.call('zadd', key, '-inf', '', expiry, ARGV[1])
  redis.call('pexpireat', key, expiry)
  if ARGV[3] ~= '' then
    -- Readers that wait may enter now (pcall: see ../release.lua).
    local heard = redis.pcall('publish', ARGV[3] .. key, '')
    if type(heard) == 'number' and heard > listeners then
      listeners = heard
    end
  end
end
return 1 + 2 * listeners
