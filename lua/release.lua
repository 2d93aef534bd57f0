-- release.lua: delete every key, if every key still holds our value.
-- KEYS: the lock keys.
-- ARGV[1]: our value (token .. metadata); ARGV[2]: where release channels start (the
-- locker's prefix, then 'redguard:released:'), or '' to announce nothing (a quorum
-- attempt that fell short and takes back what it took: nobody waits for that).
-- Returns 1 when released, 0 when the lock is no longer held (nothing is deleted then).
-- Each deleted key is announced on the channel ARGV[2] .. key, for waiters: a hint only,
-- so a user without the right to publish still releases (pcall).
local values = redis.call('mget', unpack(KEYS))
for i = 1, #KEYS do
  if values[i] ~= ARGV[1] then
    return 0
  end
end

redis.call('del', unpack(KEYS))
if ARGV[2] ~= '' then
  for _, key in ipairs(KEYS) do
    redis.pcall('publish', ARGV[2] .. key, '')
  end
end
return 1
