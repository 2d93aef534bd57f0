-- leader.lua: who leads an election, as anyone may see it (read only).
-- KEYS[1]: the election's lock key; KEYS[2]: its fencing counter (the term counter);
-- KEYS[3]: the value its leader last proclaimed (a hash: term, value).
-- Returns {} when nobody leads; else {term, ms, value}: ms left on the server's clock (-1:
-- no TTL), and the value the leader of this term proclaimed last, or its stored value
-- (owner part, then the value it campaigned with; the caller splits it) tagged by a
-- first character: 'p' proclaimed, 's' stored. Or {'wrongtype', key, type}.
for i = 1, 2 do
  local kind = redis.call('type', KEYS[i]).ok
  if kind ~= 'none' and kind ~= 'string' then
    return {'wrongtype', KEYS[i], kind}
  end
end
local stored = redis.call('get', KEYS[1])
if not stored then
  return {}
end
-- The counter was raised by the script that made this leader, and by no one since (an
-- election's lock is only ever taken with fencing, by a random owner).
local term = tonumber(redis.call('get', KEYS[2]) or '0') or 0
local ms = redis.call('pttl', KEYS[1])
if redis.call('type', KEYS[3]).ok == 'hash' then
  local proclaimed = redis.call('hmget', KEYS[3], 'term', 'value')
  if tonumber(proclaimed[1]) == term and proclaimed[2] then
    return {term, ms, 'p' .. proclaimed[2]}
  end
end
return {term, ms, 's' .. stored}
