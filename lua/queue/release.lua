-- queue/release.lua: give up a hold (or turn a lock into a shared hold), then give the
-- keys to the waiters first in their queues (see queue.lua, whose text comes first).
-- KEYS: the n main keys, then their queues, expiries, tickets and fencing counters.
-- ARGV[1]: the hold's value; ARGV[2]: its kind, 'l', 'r' or 'p', or 'd' to turn a lock
-- into a shared hold of ARGV[6] ms, or 'f' to remove whatever lock holds the keys (see
-- below); ARGV[3]: the caller's locker channel; ARGV[4]: the
-- caller's own queue entry to take out too (a waiter that stops waiting), or ''; ARGV[5]:
-- where release channels start, to announce each freed key to waiters that do not queue
-- (on a cluster: locks across slots), or '' to announce nothing; ARGV[6]: for 'd', the
-- TTL; ARGV[7]: '1' when the queue's keys follow the main keys, '' when there are none
-- (see acquire.lua); ARGV[8]: how long (ms) an entry lives unless renewed; ARGV[9] on:
-- entries of waiters of the caller's own locker to put at the back of the queue first
-- (they asked for exactly these keys while the caller held them: see src/wait/joins.rs).
-- Returns, when no waiter of the caller's own locker was served, 1 when the hold was
-- whole (it is given up now) and 0 when not (what was still ours is given up all the
-- same); else {that, value, fences, value, fences, ...} for each waiter of the caller's
-- locker that was given its hold (fences joined by ',').
local value, kind, own, member, announce = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local with_queue = ARGV[7] == '1'
local n = with_queue and #KEYS / 5 or #KEYS
if n < 1 or n ~= math.floor(n) then
  return redis.error_reply('ERR redguard release: bad key count')
end
if redis.replicate_commands and not redis.REDIS_VERSION_NUM then
  redis.replicate_commands() -- before any write: see acquire.lua
end

local held, freed = 1, {}
-- ARGV[2] 'f' (Locker::force_release; ARGV[1] unused): every key's lock, or all the
-- readers of its read lock, whoever holds them; none of them when some key holds anything
-- else, a semaphore too: then {'refused', key, what it holds}. `held` is 1 when a live
-- hold was removed.
local function force_out()
  local now, found = q_now(), {}
  for i = 1, n do
    local key = KEYS[i]
    local what = redis.call('type', key).ok
    if what == 'zset' then
      local marker = redis.call('zscore', key, '')
      if marker ~= '-inf' then
        local semaphore = marker and tonumber(marker) < 0
        return {'refused', key, semaphore and 'semaphore' or 'zset, not a lock'}
      end
      found[i] = redis.call('zcount', key, '(' .. string.format('%.0f', now), '+inf') > 0
    elseif what == 'string' then
      -- Only a lock's value: an owner part (see src/hold/token.rs), so that a counter, a
      -- fenced record or a plain value given by mistake is left alone.
      local stored = redis.call('get', key)
      if not (string.match(stored, '^' .. string.rep('[0-9a-f]', 32))
          or string.match(stored, '^%d+:')) then
        return {'refused', key, 'string that is not a lock'}
      end
      found[i] = true
    elseif what ~= 'none' then
      return {'refused', key, what}
    end
  end
  held = 0
  for i = 1, n do
    if found[i] ~= nil then
      redis.call('del', KEYS[i]) -- the fencing counters stay: the next fence is higher
      freed[#freed + 1] = KEYS[i]
      held = found[i] and 1 or held
    end
  end
end

if kind == 'f' then
  q_setup(n, not with_queue and {} or nil)
  local refused = force_out()
  if refused then
    return refused
  end
elseif kind == 'l' or kind == 'd' then
  -- One MGET reads the keys and whether anyone waits for them.
  local names = {}
  for i = 1, n do
    names[i] = KEYS[i]
    names[n + i] = with_queue and KEYS[3 * n + i] or nil
  end
  -- Read already by release_alone.lua (which comes first) when it found waiters.
  local values = alone_read or redis.call('mget', unpack(names))
  local ours = {}
  for i = 1, n do
    if values[i] == value then
      ours[#ours + 1] = KEYS[i]
    else
      held = 0
    end
  end
  local tickets = {}
  for i = 1, n do
    tickets[i] = values[n + i]
  end
  q_setup(n, with_queue and tickets or {})
  if kind == 'd' then
    if held == 0 then
      return 0 -- nothing changed
    end
    local now = q_now()
    local expiry = string.format('%.0f', now + tonumber(ARGV[6]))
    for i = 1, n do
      redis.call('del', KEYS[i])
      redis.call('zadd', KEYS[i], '-inf', '', expiry, value)
      redis.call('pexpireat', KEYS[i], expiry)
    end
  elseif #ours > 0 then
    redis.call('del', unpack(ours))
    for _, key in ipairs(ours) do
      q_free_found['l' .. key], q_free_found['r' .. key] = true, true
    end
  end
  freed = ours
else
  q_setup(n, not with_queue and {} or nil)
  local now = q_now()
  for i = 1, n do
    local key = KEYS[i]
    local marker = redis.pcall('zscore', key, '')
    local ours = type(marker) == 'string' and ((kind == 'r') == (marker == '-inf'))
    if ours then
      -- Expired holders go first: readers are scored by their expiry, the limit below 0.
      redis.call('zremrangebyscore', key, kind == 'r' and '(-inf' or 0, now)
      if redis.call('zrem', key, value) == 0 then
        held = 0
      else
        freed[#freed + 1] = key -- room for one more (announced to waiters that ask)
      end
      local last = redis.call('zrange', key, -1, -1, 'withscores')
      if last[1] == '' then
        redis.call('del', key) -- nothing left but the marker
      elseif kind == 'p' then
        -- The semaphore lives as long as its last holder.
        redis.call('pexpireat', key, string.format('%.0f', tonumber(last[2])))
      end
    else
      held = 0
    end
  end
end

if member ~= '' then
  for i = 1, n do
    q_remove(i, member)
  end
end
if #ARGV >= 9 and with_queue then
  local now = q_now()
  for j = 9, #ARGV do
    q_join(ARGV[j], now, tonumber(ARGV[8]), false)
  end
end
local handed = {}
local anyone = false
for i = 1, n do
  anyone = anyone or q_waiting[i]
end
if anyone then
  local now = q_now()
  for i = 1, n do
    q_purge(i, now)
  end
  q_serve(now, own, handed)
end
if announce ~= '' then
  -- A hint for waiters that do not queue (pcall: a user without the right still releases).
  for _, key in ipairs(freed) do
    redis.pcall('publish', announce .. key, '')
  end
end
if #handed == 0 then
  return held
end
local reply = {held}
for _, item in ipairs(handed) do
  reply[#reply + 1] = item
end
return reply
