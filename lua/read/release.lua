-- read/release.lua: give up a shared hold (see acquire.lua).
-- KEYS: the keys. ARGV[1]: the reader's value; ARGV[2]: where release channels start
-- (see ../release.lua), or '' to announce nothing.
-- Returns, in its lowest bit, 1 when every key was still shared by us (all are given up
-- now), else 0 (those that were are given up all the same); above it, how many listeners
-- the most-heard announcement reached. A key is announced once its last reader has left
-- (waiting writers may take it); it is deleted when nothing is left on it.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local held, listeners = 1, 0
for _, key in ipairs(KEYS) do
  local ours = redis.call('type', key).ok == 'zset' and redis.call('zscore', key, '') == '0'
  if ours then
    redis.call('zremrangebyscore', key, '(0', now)
    redis.call('zremrangebyscore', key, -now, '(0')
    if redis.call('zrem', key, ARGV[1]) == 0 then
      held = 0
    end
    local last = tonumber(redis.call('zrange', key, -1, -1, 'withscores')[2])
    local first = tonumber(redis.call('zrange', key, 0, 0, 'withscores')[2])
    if last == 0 and first == 0 then
      redis.call('del', key) -- only the marker left
    else
      redis.call('pexpireat', key, string.format('%.0f', math.max(last, -first)))
    end
    if last <= 0 and ARGV[2] ~= '' then
      -- The last reader is gone: a hint to the writers that wait (pcall: see ../release.lua).
      local heard = redis.pcall('publish', ARGV[2] .. key, '')
      if type(heard) == 'number' and heard > listeners then
        listeners = heard
      end
    end
  else
    held = 0
  end
end
return held + 2 * listeners
