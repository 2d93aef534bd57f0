-- release.lua: delete every key, if every key still holds our value.
-- KEYS: the lock keys.
-- ARGV[1]: our value (token .. metadata); ARGV[2]: where release channels start (the
-- locker's prefix, then 'redguard:released:'), or '' to announce nothing (a quorum
-- attempt that fell short and takes back what it took: nobody waits for that).
-- Returns 1 when released, 0 when the lock is no longer held (nothing is deleted then).
-- Each key is announced on the channel ARGV[2] .. key once it is free: deleted here, or
-- already gone (on a quorum, the node a waiter listens on may never have had the lock).
-- A hint only, so a user without the right to publish still releases (pcall).
local values = redis.call('mget', unpack(KEYS))
local ours, gone = 0, 0
for i = 1, #KEYS do
  if values[i] == ARGV[1] then
    ours = ours + 1
  elseif values[i] then
    return 0
  else
    gone = gone + 1
  end
end

local released = ours == #KEYS
if released then
  redis.call('del', unpack(KEYS))
end
if (released or gone == #KEYS) and ARGV[2] ~= '' then
  for _, key in ipairs(KEYS) do
    redis.pcall('publish', ARGV[2] .. key, '')
  end
end
return released and 1 or 0
