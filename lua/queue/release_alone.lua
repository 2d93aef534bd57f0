-- queue/release_alone.lua: the release of a lock (or a permit) nobody waits for, before the queue's
-- functions are even defined (their definitions cost each call more than this does).
-- Comes first in release.lua's script; its arguments are release.lua's. When someone
-- waits, it leaves what it read in `alone_read` for the rest of the script.
local alone_read
if ARGV[2] == 'l' and ARGV[4] == '' and ARGV[7] == '1' and #ARGV == 8 then
  local n = #KEYS / 5
  local names = {}
  for i = 1, n do
    names[i] = KEYS[i]
    names[n + i] = KEYS[3 * n + i]
  end
  local values = redis.call('mget', unpack(names))
  local nobody = true
  for i = n + 1, 2 * n do
    nobody = nobody and not values[i]
  end
  if nobody then
    local ours, held = {}, 1
    for i = 1, n do
      if values[i] == ARGV[1] then
        ours[#ours + 1] = KEYS[i]
      else
        held = 0
      end
    end
    if #ours > 0 then
      redis.call('del', unpack(ours))
    end
    if ARGV[5] ~= '' then
      for _, key in ipairs(ours) do
        redis.pcall('publish', ARGV[5] .. key, '') -- see release.lua
      end
    end
    return held
  end
  alone_read = values
end
if ARGV[2] == 'p' and ARGV[4] == '' and ARGV[7] == '1' and #ARGV == 8 and #KEYS == 5
    and not redis.call('get', KEYS[4]) then
  -- A permit, nobody waiting (see release.lua, whose checks these are).
  if redis.replicate_commands and not redis.REDIS_VERSION_NUM then
    redis.replicate_commands()
  end
  local marker = redis.pcall('zscore', KEYS[1], '')
  if type(marker) ~= 'string' or marker == '-inf' then
    return 0 -- not a semaphore
  end
  local time = redis.call('time')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('zremrangebyscore', KEYS[1], 0, now)
  local held = redis.call('zrem', KEYS[1], ARGV[1])
  local last = redis.call('zrange', KEYS[1], -1, -1, 'withscores')
  if last[1] == '' then
    redis.call('del', KEYS[1])
  elseif last[1] then
    redis.call('pexpireat', KEYS[1], string.format('%.0f', tonumber(last[2])))
  end
  if ARGV[5] ~= '' and held == 1 then
    redis.pcall('publish', ARGV[5] .. KEYS[1], '')
  end
  return held
end
