-- queue/acquire.lua: take a hold (a lock, a shared hold or a permit) if its keys are free
-- for it and no waiter is before it; else, for a caller that waits, take its place in
-- each key's queue (see queue.lua, whose text comes first), in the same script.
-- KEYS: the n main keys (a lock's or a shared hold's keys, or the semaphore), then their
-- queues, expiries, tickets and fencing counters (see queue.lua).
-- ARGV[1]: the value to store (owner .. metadata); ARGV[2]: the owner part's length in
-- bytes (self-delimiting: never the start of another's); ARGV[3]: the TTL in ms; ARGV[4]:
-- '1' for fencing tokens; ARGV[5]: the kind, 'l', 'r' or 'p'; ARGV[6]: a semaphore's
-- limit (else ''); ARGV[7]: '1' when the token is the caller's own (its owner re-obtains
-- what it holds); ARGV[8]: the caller's queue entry (see queue.lua), or '' for one that
-- does not wait (try_lock); ARGV[9]: how long (ms) the entry lives unless renewed;
-- ARGV[10]: the caller's locker channel; ARGV[11]: '1' when the queue's keys follow the
-- main keys, '' when there are none (on a cluster, a name whose queue would be in another
-- slot: the hold is taken as if nobody queued, and its waiters ask at their delays).
-- Returns 1 when taken now (with fencing: {'fences', token per key}; for a shared hold,
-- {'read', each counter as it is}), 2 when already held by this owner, re-obtained (with
-- fencing: {'kept', tokens}); {'queued', wait, fences, ...} when not (and queued, if
-- it waits), with each waiter of the caller's own locker this script gave its hold to
-- (its wait number and fences); {'limit', stored} when a
-- semaphore's live holders use another limit; {'wrongtype', key, type} when a key holds
-- something else. Nothing else is changed unless the hold is taken (but the expired go,
-- and waiters that can now be served are).
local value, owner_len, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fencing, kind, limit = ARGV[4] == '1', ARGV[5], tonumber(ARGV[6])
local member, lifetime, own = ARGV[8], tonumber(ARGV[9]), ARGV[10]
local with_queue = ARGV[11] == '1'
local n = with_queue and #KEYS / 5 or #KEYS
if not with_queue and (fencing or member ~= '') then
  return redis.error_reply('ERR redguard acquire: fencing and waiting need the queue keys')
end
if not owner_len or owner_len < 1 or owner_len > #value or not ttl or ttl < 1
    or n < 1 or n ~= math.floor(n) or not lifetime or lifetime < 1
    or (kind == 'p' and (not limit or limit < 1 or n ~= 1)) then
  return redis.error_reply('ERR redguard acquire: bad owner length, ttl, limit or keys')
end
-- Before any write: the expiries come from TIME, so the writes must be replicated as
-- such (the default from Redis 5; the only way from Redis 7, which has REDIS_VERSION_NUM).
if redis.replicate_commands and not redis.REDIS_VERSION_NUM then
  redis.replicate_commands()
end
q_setup(n, not with_queue and {} or alone_tickets)
-- The server's clock, asked only where something expires by it (not for a lock on free
-- keys nobody waits for).
local now = 0
local anyone = false
for i = 1, n do
  anyone = anyone or q_waiting[i]
end
if kind ~= 'l' or anyone then
  now = q_now()
end

-- (A lock on free keys nobody waits for was taken by acquire_alone.lua, which comes
-- first: this is every other case.)

-- What each key is: another type is never touched; the same owner re-obtains its own.
local owner = string.sub(value, 1, owner_len)
local mine = 0
for i = 1, n do
  local key = KEYS[i]
  local found = redis.call('type', key).ok
  if found == 'none' then
    q_free_found[kind .. key] = true
  elseif found == 'string' then
    if kind ~= 'l' then
      -- A lock holds it: a reader waits; a semaphore's key is never a string.
      if kind == 'p' then
        return {'wrongtype', key, 'string, not a semaphore'}
      end
    elseif redis.call('getrange', key, 0, owner_len - 1) == owner then
      mine = mine + 1
    else
      q_free_found['l' .. key] = false -- another owner's lock
    end
  elseif found == 'zset' then
    if now == 0 then
      now = q_now()
    end
    local marker = redis.call('zscore', key, '')
    if kind == 'p' then
      local stored = marker and marker ~= '-inf' and -tonumber(marker)
      if not (stored and stored >= 1 and stored == math.floor(stored)) then
        return {'wrongtype', key, 'zset, not a semaphore'}
      end
      redis.call('zremrangebyscore', key, 0, now)
      local count = redis.call('zcard', key) - 1 -- live holders (the limit is no holder)
      if count > 0 and stored ~= limit then
        return {'limit', string.format('%.0f', stored)}
      end
      q_free_found['p' .. key] = count < stored
    elseif marker ~= '-inf' then
      return {'wrongtype', key, 'zset, not a read lock'}
    end
  elseif found ~= 'none' then
    return {'wrongtype', key, found}
  end
end
if fencing then
  -- Absent, or exactly the digits INCR accepts (at most 15: Lua's numbers stay exact).
  for i = 4 * n + 1, 5 * n do
    if q_index[KEYS[i]] then
      return {'wrongtype', KEYS[i], 'lock key that is also a fencing counter'}
    end
    local found = redis.call('type', KEYS[i]).ok
    local counter = found == 'string' and redis.call('get', KEYS[i])
    if found ~= 'none' and not (counter and #counter <= 15
        and (counter == '0' or string.match(counter, '^[1-9]%d*$'))) then
      return {'wrongtype', KEYS[i], found .. ', not a fencing counter'}
    end
  end
end
for i = 1, n do
  q_purge(i, now)
end

-- Ours already: a lock this owner holds, or a permit this value (or fixed owner) holds.
local held_by = nil
if kind == 'p' and redis.call('exists', KEYS[1]) == 1 then
  held_by = redis.call('zscore', KEYS[1], value) and value
  if not held_by and ARGV[7] == '1' then
    for _, holder in ipairs(redis.call('zrangebyscore', KEYS[1], '(0', '+inf')) do
      if string.sub(holder, 1, owner_len) == owner then
        held_by = holder
        break
      end
    end
  end
end
-- A shared hold this value has on every key already: given to it by a release whose word
-- is still on its way (or a request sent again).
local reading = kind == 'r'
for i = 1, n do
  local expiry = reading and redis.pcall('zscore', KEYS[i], value)
  reading = type(expiry) == 'string' and tonumber(expiry) > now
end
if reading then
  if member ~= '' then
    for i = 1, n do
      q_remove(i, member)
    end
  end
  local expiry = string.format('%.0f', now + ttl)
  local fences = {'read'}
  for i = 1, n do
    redis.call('zadd', KEYS[i], 'XX', expiry, value)
    if redis.call('pttl', KEYS[i]) < ttl then
      redis.call('pexpireat', KEYS[i], expiry)
    end
    fences[i + 1] = fencing and tonumber(redis.call('get', KEYS[4 * n + i]) or '0') or nil
  end
  return fencing and fences or 1
end
if (kind == 'l' and mine == n) or held_by then
  if member ~= '' then
    for i = 1, n do
      q_remove(i, member)
    end
  end
  local fences = {'kept'}
  if kind == 'l' then
    for i = 1, n do
      redis.call('psetex', KEYS[i], ttl, value) -- not SET: see queue.lua's q_take
      if fencing then
        local current = tonumber(redis.call('get', KEYS[4 * n + i]) or '0')
        fences[i + 1] = current >= 1 and current or redis.call('incr', KEYS[4 * n + i])
      end
    end
  else
    local expiry = string.format('%.0f', now + ttl)
    redis.call('zrem', KEYS[1], held_by)
    redis.call('zadd', KEYS[1], -limit, '', expiry, value)
    if redis.call('pttl', KEYS[1]) < ttl then
      redis.call('pexpireat', KEYS[1], expiry)
    end
    if fencing then
      fences[2] = redis.call('incr', KEYS[4 * n + 1])
    end
  end
  return fencing and fences or 2
end

local keys = {}
for i = 1, n do
  keys[i] = KEYS[i]
end
local me = {
  member = member ~= '' and member or nil, kind = kind, n = n, keys = keys,
  value = value, fencing = fencing, limit = limit,
}
local queued = me.member and q_waiting[1] and redis.call('zscore', KEYS[n + 1], member) and true
if mine == 0 and q_servable(me, now, queued) == true then
  local fences = q_take(me, ttl, now)
  if kind ~= 'l' then
    -- A reader or a permit: those first behind it may come in too (readers together, a
    -- permit while some are free), so they are served now, not at their renewals (told
    -- by message, the caller's own locker's too: this reply has no room for them).
    for i = 1, n do
      if q_waiting[i] then
        q_serve(now, '', {})
        break
      end
    end
  end
  if not fencing then
    return 1
  end
  table.insert(fences, 1, kind == 'r' and 'read' or 'fences')
  return fences
end

-- Not ours to take now: others first, if they can be served (only where some key is
-- free: a release serves the others); then our place.
if now == 0 then
  now = q_now()
end
local handed = {}
for i = 1, n do
  if q_waiting[i] and q_free(kind, KEYS[i], now) then
    q_serve(now, own, handed)
    break
  end
end
if me.member then
  q_join(member, now, lifetime, queued)
end
local reply = {'queued'}
for _, item in ipairs(handed) do
  reply[#reply + 1] = item
end
return reply
