-- holders.lua: who holds a key, as an operator may see it (read only).
-- KEYS[1]: the key; KEYS[2], if given: its fencing counter, and KEYS[3] and KEYS[4] its
-- queue and the queue's expiries (see queue/queue.lua). ARGV[1]: 'list', or 'count' for
-- only how many.
-- Returns {what, fence, value, ms, value, ms, ...} ({what, fence, n} for 'count'): what
-- is 'free', 'lock' (one value; ms -1 when the key has no TTL), 'read' (each live reader,
-- see queue/acquire.lua, then each lock queued for the key: '!' and its value) or 'semaphore' (each live permit, see queue/acquire.lua);
-- fence is the counter as it is, or -1 when there is none, or it is not a counter, or
-- the key is a semaphore (its permits have no counter value of their own); ms are left on
-- the server's clock, the first to expire first. Or {'wrongtype', key, type}.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local count = ARGV[1] == 'count'
local fence = -1
if KEYS[2] then
  local counter = redis.pcall('get', KEYS[2])
  if type(counter) == 'string' and string.match(counter, '^%d+$') and #counter <= 15 then
    fence = tonumber(counter)
  end
end
local kind = redis.call('type', KEYS[1]).ok
if kind == 'none' then
  return {'free', fence, count and 0 or nil}
elseif kind == 'string' then
  if count then
    return {'lock', fence, 1}
  end
  return {'lock', fence, redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1])}
elseif kind == 'zset' then
  local marker = redis.call('zscore', KEYS[1], '')
  local what = (marker == '-inf' and 'read') or (marker and tonumber(marker) < 0 and 'semaphore')
  if not what then
    return {'wrongtype', KEYS[1], 'zset, not a lock'}
  end
  if what == 'semaphore' then
    fence = -1
  end
  local after = '(' .. string.format('%.0f', now)
  if count then
    return {what, fence, redis.call('zcount', KEYS[1], after, '+inf')}
  end
  local reply = {what, fence}
  local live = redis.call('zrangebyscore', KEYS[1], after, '+inf', 'withscores')
  for i = 1, #live, 2 do
    reply[#reply + 1] = live[i]
    reply[#reply + 1] = tonumber(live[i + 1]) - now
  end
  if what == 'read' and KEYS[3] then
    -- Then the locks queued for these readers, in order, each with the time its place has
    -- left (see queue/queue.lua: 'l', then the lengths, then the channel and value).
    for _, entry in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
      local chlen, vlen, at = string.match(entry, '^l%d+,%d+,[01],%d+,(%d+),(%d+):()')
      local alive = chlen and redis.call('zscore', KEYS[4], entry)
      if alive and tonumber(alive) > now then
        local from = at + tonumber(chlen)
        reply[#reply + 1] = '!' .. string.sub(entry, from, from + tonumber(vlen) - 1)
        reply[#reply + 1] = tonumber(alive) - now
      end
    end
  end
  return reply
end
return {'wrongtype', KEYS[1], kind}
