-- semaphore/release.lua: give back a permit.
-- KEYS[1]: the semaphore (see acquire.lua).
-- ARGV[1]: the permit's value; ARGV[2]: where release channels start (see
-- ../release.lua), or '' to announce nothing.
-- Returns, in its lowest bit, 1 when the permit was held (it is given back now), 0 when it
-- had expired or was taken away; above that bit, how many listeners the announcement
-- on ARGV[2] .. KEYS[1] reached. Expired holders are dropped, and the semaphore deleted
-- with its last holder.
if redis.replicate_commands and not redis.REDIS_VERSION_NUM then
  redis.replicate_commands() -- before any write: see acquire.lua
end
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Only a semaphore (a sorted set with the limit member, see acquire.lua) is ours.
local limit = redis.pcall('zscore', KEYS[1], '')
if type(limit) == 'table' and limit.err then
  if string.find(limit.err, '^WRONGTYPE') then
    return 0 -- another type: nothing of ours here
  end
  return limit
end
if not limit or limit == '-inf' then -- none: not a semaphore; -inf: a read lock
  return 0
end
redis.call('zremrangebyscore', KEYS[1], 0, now)
local held = redis.call('zrem', KEYS[1], ARGV[1])
local last = redis.call('zrange', KEYS[1], -1, -1, 'withscores')
if last[1] and last[1] ~= '' then
  redis.call('pexpireat', KEYS[1], string.format('%.0f', tonumber(last[2])))
elseif last[1] then
  redis.call('del', KEYS[1]) -- no holder left, only the limit
end

-- A hint only, so a user without the right to publish still releases (pcall).
local listeners = 0
if ARGV[2] ~= '' then
  local heard = redis.pcall('publish', ARGV[2] .. KEYS[1], '')
  if type(heard) == 'number' then
    listeners = heard
  end
end
return held + 2 * listeners
