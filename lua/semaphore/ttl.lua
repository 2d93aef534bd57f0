-- semaphore/ttl.lua: how long a permit has left.
-- KEYS[1]: the semaphore (see acquire.lua). ARGV[1]: the permit's value.
-- Returns the ms left on the server's clock, or -2 when the permit is not held.
-- Only a semaphore (a sorted set with the limit member, see acquire.lua) holds permits.
if redis.call('type', KEYS[1]).ok ~= 'zset' or not redis.call('zscore', KEYS[1], '') then
  return -2
end
local expiry = redis.call('zscore', KEYS[1], ARGV[1])
if not expiry then
  return -2
end
local time = redis.call('time')
local left = tonumber(expiry) - (tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
if left <= 0 then
  return -2
end
return left
