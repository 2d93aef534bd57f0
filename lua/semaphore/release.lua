-- semaphore/release.lua: give back a permit.
-- KEYS[1]: the holders (see acquire.lua); KEYS[2]: the limit in use.
-- ARGV[1]: the permit's value; ARGV[2]: where release channels start (see
-- ../release.lua), or '' to announce nothing.
-- Returns, in its lowest bit, 1 when the permit was held (it is given back now), 0 when it
-- had expired or was taken away; above that bit, how many listeners the announcement
-- on ARGV[2] .. KEYS[1] reached. Expired holders are dropped, and both keys deleted with
-- the last holder.
if redis.call('type', KEYS[1]).ok ~= 'zset' then
  return 0 -- nothing of ours here: another type, or gone
end
if redis.replicate_commands then
  redis.replicate_commands() -- before any write: see acquire.lua
end
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
local held = redis.call('zrem', KEYS[1], ARGV[1])
local limit_kind = redis.call('type', KEYS[2]).ok
local last = redis.call('zrange', KEYS[1], -1, -1, 'withscores')[2]
if not last then
  redis.call('del', KEYS[1])
  if limit_kind == 'string' then
    redis.call('del', KEYS[2])
  end
else
  last = string.format('%.0f', tonumber(last))
  redis.call('pexpireat', KEYS[1], last)
  if limit_kind == 'string' then
    redis.call('pexpireat', KEYS[2], last)
  end
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
