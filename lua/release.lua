-- release.lua: delete every key that still holds our value.
-- KEYS: the lock keys.
-- ARGV[1]: our value (owner .. metadata); ARGV[2]: where release channels start (the
-- locker's prefix, then 'redguard:released:'), or '' to announce nothing (a quorum
-- attempt that fell short and takes back what it took: nobody waits for that).
-- Returns 1 when every key held our value (all are deleted now), 0
-- when the lock was no longer whole: the keys that still held our value are deleted all
-- the same (keys that expire a moment apart would otherwise keep the rest until their
-- TTL), others are left.
-- Each key is announced on the channel ARGV[2] .. key once it is free: deleted here, or
-- already gone (on a quorum, the node a waiter listens on may never have had the lock).
-- A hint only, so a user without the right to publish still releases (pcall).
local values = redis.call('mget', unpack(KEYS))
local ours, free = {}, {}
for i = 1, #KEYS do
  if values[i] == ARGV[1] then
    ours[#ours + 1] = KEYS[i]
    free[#free + 1] = KEYS[i]
  elseif not values[i] then
    free[#free + 1] = KEYS[i]
  end
end

if #ours > 0 then
  redis.call('del', unpack(ours))
end
if ARGV[2] ~= '' then
  for _, key in ipairs(free) do
    redis.pcall('publish', ARGV[2] .. key, '')
  end
end
return #ours == #KEYS and 1 or 0
