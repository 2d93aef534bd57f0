-- proclaim.lua: a leader advertises a new value, for the rest of its term.
-- KEYS[1]: the election's lock key; KEYS[2]: where the proclaimed value is kept (a hash:
-- term, value; no TTL, and stale once another term leads).
-- ARGV[1]: the leader's stored value; ARGV[2]: its term; ARGV[3]: the new value;
-- ARGV[4]: the channel observers listen on.
-- Returns 1 when proclaimed, 0 when this leader no longer holds the election, or
-- {'wrongtype', key, type} (nothing changed).
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
local kind = redis.call('type', KEYS[2]).ok
if kind ~= 'none' and kind ~= 'hash' then
  return {'wrongtype', KEYS[2], kind}
end
redis.call('hset', KEYS[2], 'term', ARGV[2], 'value', ARGV[3])
redis.call('publish', ARGV[4], ARGV[2])
return 1
