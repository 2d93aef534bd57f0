-- queue/queue.lua: the waiters' queue on the server, shared by the scripts that start
-- with it (acquire.lua, release.lua; the text is put before theirs).
--
-- Each key K a hold waits for has, in K's hash slot (see src/backend/companion.rs):
--   Q, a sorted set: each waiting entry scored by its ticket (the order of arrival);
--   A, a sorted set: the same entries scored by when they expire (ms on this server's
--      clock) unless the waiter's refresher renews them (refresh.lua);
--   T, a string: the last ticket given; it exists exactly while Q does, so that a
--      release learns whether anyone waits from the MGET that reads its keys.
-- Q, A and T live as long as their longest-lived entry, and go with the last one.
--
-- An entry is '<kind><n>,<ttl>,<fencing>,<wait>,<channel length>,<value length>:'
-- followed by the waiter's locker channel, its value and, when n > 1, each of its n keys
-- as '<length>:<key>'; <wait> is a number of the waiter's own, which the word to it names
-- (two waiters of one fixed token have the same value). kind is 'l' (a lock), 'r' (a shared hold) or 'p' (a permit); ttl in
-- ms; fencing '1' or '0'. A permit's entry has its semaphore's limit for n ('p8,...'): its
-- one key is the semaphore. The entry says everything a script needs to give the waiter
-- its hold and tell it so: the waiter sends nothing more.
--
-- KEYS of a script with the queue: n main keys (the hold's), then their n queues (Q),
-- n expiries (A), n tickets (T) and n fencing counters; QN is n.
local QN
-- Whether Q of each main key has entries (T exists).
local q_waiting = {}
-- Key name -> its index among the main keys.
local q_index = {}
-- What q_free and q_first found, until a write may change it (see q_changed): each
-- redis.call costs more than the command it runs, so none is asked twice.
local q_free_found, q_first_found = {}, {}

local function q_changed()
  q_free_found, q_first_found = {}, {}
end

local function q_now()
  local time = redis.call('time')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Sets QN and reads the tickets: one MGET, or `values` when the caller's MGET read them.
local function q_setup(n, tickets)
  QN = n
  tickets = tickets or redis.call('mget', unpack(KEYS, 3 * n + 1, 4 * n))
  for i = 1, n do
    q_waiting[i] = tickets[i] ~= false and tickets[i] ~= nil
    q_index[KEYS[i]] = i
  end
end

-- The entry `member` of the queue of `key`, or nil for one not of ours.
local function q_parse(member, key)
  local kind, n, ttl, f, wait, chlen, vlen, at =
    string.match(member, '^([lrp])(%d+),(%d+),([01]),(%d+),(%d+),(%d+):()')
  if not kind then
    return nil
  end
  n, chlen, vlen = tonumber(n), tonumber(chlen), tonumber(vlen)
  local limit
  if kind == 'p' then
    limit, n = n, 1
  end
  local entry = {
    limit = limit, member = member, kind = kind, n = n, ttl = tonumber(ttl), fencing = f == '1',
    wait = wait,
    channel = string.sub(member, at, at + chlen - 1),
    value = string.sub(member, at + chlen, at + chlen + vlen - 1),
    keys = {key},
  }
  if n > 1 then
    local pos = at + chlen + vlen
    for j = 1, n do
      local len, start = string.match(member, '^(%d+):()', pos)
      if not len then
        return nil
      end
      entry.keys[j] = string.sub(member, start, start + tonumber(len) - 1)
      pos = start + tonumber(len)
    end
  end
  return entry
end

-- Drops every entry whose waiter stopped renewing it (died, or paused too long).
local function q_purge(i, now)
  if not q_waiting[i] then
    return
  end
  local q, a = KEYS[QN + i], KEYS[2 * QN + i]
  -- At most a thousand at a time (unpack has a limit); the rest go in later scripts.
  local dead = redis.call('zrangebyscore', a, '-inf', now, 'LIMIT', 0, 1000)
  if #dead > 0 then
    q_changed()
    redis.call('zrem', q, unpack(dead))
    redis.call('zrem', a, unpack(dead))
    if redis.call('exists', q) == 0 then
      redis.call('del', a, KEYS[3 * QN + i])
      q_waiting[i] = false
    end
  end
end

-- Takes `member` out of the queue of main key i.
local function q_remove(i, member)
  if not q_waiting[i] then
    return
  end
  local q = KEYS[QN + i]
  if redis.call('zrem', q, member) == 1 then
    q_changed()
    redis.call('zrem', KEYS[2 * QN + i], member)
    if redis.call('exists', q) == 0 then
      redis.call('del', KEYS[2 * QN + i], KEYS[3 * QN + i])
      q_waiting[i] = false
    end
  end
end

-- Whether the hold of `kind` could be taken on `key` now, as far as that key goes. A
-- semaphore's expired permits, and a read lock's expired readers, are dropped first.
local function q_ask_free(kind, key, now)
  if kind == 'l' then
    local found = redis.call('type', key).ok
    if found == 'zset' and redis.call('zscore', key, '') == '-inf' then
      redis.call('zremrangebyscore', key, '(-inf', now)
      if redis.call('zcard', key) == 1 then
        redis.call('del', key) -- no reader left
        return true
      end
    end
    return found == 'none'
  elseif kind == 'r' then
    local found = redis.call('type', key).ok
    return found == 'none' or (found == 'zset' and redis.call('zscore', key, '') == '-inf')
  end
  -- A permit: fewer live holders than the limit (scored -limit).
  local lowest = redis.pcall('zrange', key, 0, 0, 'withscores')
  if type(lowest) ~= 'table' or lowest.err then
    return false
  end
  if not lowest[1] then
    return true
  end
  if lowest[1] ~= '' or lowest[2] == '-inf' or tonumber(lowest[2]) >= 0 then
    return false -- not a semaphore (-inf marks a read lock)
  end
  redis.call('zremrangebyscore', key, 0, now)
  return redis.call('zcard', key) - 1 < -tonumber(lowest[2])
end

local function q_free(kind, key, now)
  local asked = kind .. key
  local free = q_free_found[asked]
  if free == nil then
    free = q_ask_free(kind, key, now)
    q_free_found[asked] = free
  end
  return free
end

-- An entry for several keys one of which it cannot take now: a later waiter may pass it
-- on the others (it could not use them yet, and a holder of that key may be waiting for
-- them: without this, the two would wait for each other for ever).
local function q_blocked(entry, now)
  for _, key in ipairs(entry.keys) do
    if not q_free(entry.kind, key, now) then
      return true
    end
  end
  return false
end

-- The first entry of main key i's queue that is not blocked (see q_blocked), or nil.
local function q_ask_first(i, now)
  if not q_waiting[i] then
    return nil
  end
  -- The head alone first (it is almost always the one): the cost of a release does not
  -- grow with the queue's length.
  local from, size = 0, 1
  while true do
    local batch = redis.call('zrange', KEYS[QN + i], from, from + size - 1)
    if #batch == 0 then
      return nil
    end
    local dropped = 0
    for _, member in ipairs(batch) do
      local entry = q_parse(member, KEYS[i])
      if not entry then
        -- Not an entry this script can read (another version's, or garbage): out.
        redis.call('zrem', KEYS[QN + i], member)
        redis.call('zrem', KEYS[2 * QN + i], member)
        dropped = dropped + 1
      elseif entry.n == 1 or not q_blocked(entry, now) then
        return entry
      end
    end
    from, size = from + size - dropped, 10
  end
end

local function q_first(i, now)
  local found = q_first_found[i]
  if found == nil then
    found = q_ask_first(i, now) or false
    q_first_found[i] = found
  end
  return found or nil
end

-- Whether `entry` may take its keys now: every one free for it, and it the first waiter
-- there (or, for an entry not queued yet, nobody first). 'elsewhere' when some of its
-- keys are not among this script's: it must ask itself.
local function q_servable(entry, now, queued)
  for _, key in ipairs(entry.keys) do
    local i = q_index[key]
    if not i then
      return 'elsewhere'
    end
    if not q_free(entry.kind, key, now) then
      return false
    end
    local first = q_first(i, now)
    if first and first.member ~= entry.member then
      return false
    end
    if not first and queued and q_waiting[i] then
      return false -- queued behind blocked entries only: not first itself either
    end
  end
  return true
end

-- Gives `entry` its keys for `ms` (with fencing: its tokens) and takes it out of the
-- queues. Returns its fences, as a list of numbers (empty without fencing).
local function q_take(entry, ms, now)
  q_changed()
  local fences = {}
  local expiry = string.format('%.0f', now + ms)
  for j, key in ipairs(entry.keys) do
    local i = q_index[key]
    local counter = KEYS[4 * QN + i]
    if entry.kind == 'l' then
      -- PSETEX, not SET: a client's SET is a request of its own, which the benches count
      -- as a round trip from the server's command counts.
      redis.call('psetex', key, ms, entry.value)
      if entry.fencing then
        fences[j] = redis.call('incr', counter)
      end
    elseif entry.kind == 'r' then
      redis.call('zadd', key, '-inf', '', expiry, entry.value)
      if redis.call('pttl', key) < ms then
        redis.call('pexpireat', key, expiry)
      end
      if entry.fencing then
        fences[j] = tonumber(redis.call('get', counter) or '0')
      end
    else
      redis.call('zadd', key, -entry.limit, '', expiry, entry.value)
      if redis.call('pttl', key) < ms then
        redis.call('pexpireat', key, expiry)
      end
      if entry.fencing then
        fences[j] = redis.call('incr', counter)
      end
    end
    q_remove(i, entry.member)
  end
  return fences
end

-- How long a waiter's entry has left: a hold given to it lasts no longer (a waiter that
-- died costs the others that much, not its TTL), and its refresher lengthens it.
local function q_claim(entry, now)
  local left = entry.ttl
  for _, key in ipairs(entry.keys) do
    local i = q_index[key]
    local alive = redis.call('zscore', KEYS[2 * QN + i], entry.member)
    if alive then
      left = math.min(left, tonumber(alive) - now)
    end
  end
  return math.max(1, left)
end

-- Gives the keys to whoever is first and can take them, as often as that changes; tells
-- each waiter served on its locker's channel ('h', its fences, ':', its wait number), or,
-- when it is this script's caller's own locker (channel `own`), by the reply (`handed`).
-- A waiter first on some of these keys whose other keys are not this script's is told to
-- attempt ('t:' and its wait number).
local function q_serve(now, own, handed)
  local told, taken = {}, {}
  for _ = 1, 10000 do
    local changed = false
    for i = 1, QN do
      local first = not taken[i] and q_first(i, now)
      if first and not told[first.member] then
        local servable = q_servable(first, now, true)
        if servable == true then
          local fences = table.concat(q_take(first, q_claim(first, now), now), ',')
          if first.kind == 'l' then
            -- Its keys are held now: nobody else is served on them.
            for _, key in ipairs(first.keys) do
              taken[q_index[key]] = true
            end
          end
          if first.channel == own then
            handed[#handed + 1] = first.wait
            handed[#handed + 1] = fences
          else
            redis.pcall('publish', first.channel, 'h' .. fences .. ':' .. first.wait)
          end
          changed = true
        elseif servable == 'elsewhere' then
          told[first.member] = true
          redis.pcall('publish', first.channel, 't:' .. first.wait)
        end
      end
    end
    if not changed then
      return
    end
  end
end

-- Puts `member` at the back of every queue (unless `queued` already), and renews its
-- expiry. The queue's keys live twice the lifetime (so that this is seldom done again),
-- and never less than it.
local function q_join(member, now, lifetime, queued)
  q_changed()
  local expiry = string.format('%.0f', now + lifetime)
  for i = 1, QN do
    local q, a, t = KEYS[QN + i], KEYS[2 * QN + i], KEYS[3 * QN + i]
    if not queued then
      redis.call('zadd', q, 'NX', redis.call('incr', t), member)
      q_waiting[i] = true
    end
    redis.call('zadd', a, expiry, member)
    if redis.call('pttl', q) < lifetime then
      redis.call('pexpire', q, 2 * lifetime)
      redis.call('pexpire', a, 2 * lifetime)
      redis.call('pexpire', t, 2 * lifetime)
    end
  end
end
