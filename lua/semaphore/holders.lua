-- semaphore/holders.lua: the live holders of a semaphore (read only).
-- KEYS[1]: the semaphore (see acquire.lua). ARGV[1]: 'count' or 'list'.
-- Returns {'count', n}, or {'holders', value, ms left, ...} (the first to expire first),
-- or {'wrongtype', key, type} when the key holds something else.
local kind = redis.call('type', KEYS[1]).ok
if kind ~= 'zset' and kind ~= 'none' then
  return {'wrongtype', KEYS[1], kind}
end
-- A sorted set without the limit member (see acquire.lua) is not a semaphore.
local limit = kind == 'zset' and redis.call('zscore', KEYS[1], '')
if kind == 'zset' and (not limit or limit == '-inf') then
  return {'wrongtype', KEYS[1], 'zset, not a semaphore'}
end
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Live: expiring after now (see acquire.lua, which drops those at or before now; the limit,
-- scored below 0, is no holder).
local after = '(' .. string.format('%.0f', now)
if ARGV[1] == 'count' then
  return {'count', redis.call('zcount', KEYS[1], after, '+inf')}
end
local reply = {'holders'}
local live = redis.call('zrangebyscore', KEYS[1], after, '+inf', 'withscores')
for i = 1, #live, 2 do
  reply[#reply + 1] = live[i]
  reply[#reply + 1] = tonumber(live[i + 1]) - now
end
return reply
