-- read/release.lua: give up a shared hold (see acquire.lua).
-- KEYS: the keys. ARGV[1]: the reader's value; ARGV[2]: where release channels start
-- (see ../release.lua), or '' to announce nothing.
-- Returns, in its lowest bit, 1 when every key was still shared by us (all are given up
-- now), else 0 (those that were are given up all the same); above it, how many listeners
-- the most-heard announcement reached. A key is announced once its last reader has left
-- (waiting locks may take it), and deleted when nothing is left on it but the marker.
-- Its TTL stays as it was: never shorter than its last member's.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local held, listeners = 1, 0
for _, key in ipairs(KEYS) do
  if redis.pcall('zscore', key, '') ~= '-inf' then
    held = 0 -- not a read lock (any more)
  else
    redis.call('zremrangebyscore', key, -now, now)
    if redis.call('zrem', key, ARGV[1]) == 0 then
      held = 0
    end
    -- The highest member: a reader still in, or else an intent, or else the marker.
    local highest = redis.call('zrange', key, -1, -1, 'withscores')
    if highest[1] == '' then
      redis.call('del', key)
    end
    if tonumber(highest[2]) < 0 and ARGV[2] ~= '' then
      -- The last reader is gone: a hint to the locks that wait (pcall: see ../release.lua).
      local heard = redis.pcall('publish', ARGV[2] .. key, '')
      if type(heard) == 'number' and heard > listeners then
        listeners = heard
      end
    end
  end
end
return held + 2 * listeners
