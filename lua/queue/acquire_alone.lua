-- queue/acquire_alone.lua: a lock on free keys nobody waits for, before the queue's
-- functions are even defined (their definitions cost each call more than this does).
-- Comes first in acquire.lua's script; its arguments are acquire.lua's. MSETNX changes
-- nothing if any key exists; when it fails, or someone waits, the rest of the script
-- decides (with the tickets read here in `alone_tickets`).
local alone_tickets
if ARGV[5] == 'l' and ARGV[4] == '0' and ARGV[11] == '1' and #KEYS % 5 == 0 then
  local n = #KEYS / 5
  local ttl, owner_len = tonumber(ARGV[3]), tonumber(ARGV[2])
  -- The checks acquire.lua makes before any write.
  if n >= 1 and ttl and ttl >= 1 and owner_len and owner_len >= 1
      and owner_len <= #ARGV[1] then
    alone_tickets = redis.call('mget', unpack(KEYS, 3 * n + 1, 4 * n))
    local nobody = true
    for i = 1, n do
      nobody = nobody and not alone_tickets[i]
    end
    if nobody then
      local args = {}
      for i = 1, n do
        args[2 * i - 1], args[2 * i] = KEYS[i], ARGV[1]
      end
      if redis.call('msetnx', unpack(args)) == 1 then
        for i = 1, n do
          redis.call('pexpire', KEYS[i], ARGV[3])
        end
        return 1
      end
    end
  end
end
