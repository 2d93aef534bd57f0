-- refresh.lua: extend the TTL of one or more locks, each only if every one of its keys
-- still holds its value. One call refreshes a whole batch: one reply, one round trip.
-- KEYS: the keys of every lock, one lock after another.
-- ARGV: three per lock: its number of keys, its value (token .. metadata), the new TTL in
-- milliseconds.
-- Returns one integer per lock: 1 when refreshed, 0 when no longer held (left untouched).
local total = 0
for i = 1, #ARGV, 3 do
  local count, ttl = tonumber(ARGV[i]), tonumber(ARGV[i + 2])
  if not count or count < 1 or not ttl or ttl < 1 then
    return redis.error_reply('ERR redguard refresh: bad key count or ttl')
  end
  total = total + count
end
if total ~= #KEYS or #ARGV % 3 ~= 0 then
  return redis.error_reply('ERR redguard refresh: keys and arguments do not match')
end

local results = {}
local first = 1
for i = 1, #ARGV, 3 do
  local last = first + tonumber(ARGV[i]) - 1
  local value = ARGV[i + 1]
  local values = redis.call('mget', unpack(KEYS, first, last))
  local held = 1
  for j = 1, #values do
    if values[j] ~= value then
      held = 0
      break
    end
  end
  if held == 1 then
    for j = first, last do
      redis.call('pexpire', KEYS[j], ARGV[i + 2])
    end
  end
  results[#results + 1] = held
  first = last + 1
end
return results
