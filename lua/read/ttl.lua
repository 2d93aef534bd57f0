-- read/ttl.lua: the shortest time a shared hold has left on any of its keys.
-- KEYS: the keys. ARGV[1]: the reader's value.
-- Returns the ms left on the server's clock, or -2 when some key no longer has us.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local shortest
for _, key in ipairs(KEYS) do
  local expiry = redis.pcall('zscore', key, '') == '-inf' and redis.call('zscore', key, ARGV[1])
  local left = expiry and tonumber(expiry) - now
  if not left or left <= 0 then
    return -2
  end
  if not shortest or left < shortest then
    shortest = left
  end
end
return shortest
