-- fenced_set.lua: writes a value unless a later term (fencing token) has written it.
-- KEYS[1]: the key to write, a plain string (its TTL, if any, is kept); KEYS[2]: the
-- largest token that wrote it.
-- ARGV[1]: this writer's token; ARGV[2]: the value.
-- Returns 1 when written, 0 when refused (nothing changed). Or {'wrongtype', key, type}
-- for a key of another type, or a record that is not a token (nothing changed).
for i = 1, 2 do
  local kind = redis.call('type', KEYS[i]).ok
  if kind ~= 'none' and kind ~= 'string' then
    return {'wrongtype', KEYS[i], kind}
  end
end
local last = redis.call('get', KEYS[2])
if last and not (string.match(last, '^%d+$') and #last <= 15) then
  return {'wrongtype', KEYS[2], 'string that is not a fencing token'}
end
if last and tonumber(last) > tonumber(ARGV[1]) then
  return 0
end
redis.call('set', KEYS[1], ARGV[2], 'keepttl')
redis.call('set', KEYS[2], ARGV[1])
return 1
