-- Writes back bans a host still enforces after Redis lost the list (a
-- restart without persistence, FLUSHALL; docs/design.md §3). Idempotent,
-- and safe for several hosts at once: the later end wins (ZADD GT), and a
-- record is written only with the end it describes.
-- KEYS[1] {prefix}:bans  KEYS[2] {prefix}:banrec  KEYS[3] {prefix}:events
-- ARGV[1] host  ARGV[2] stream maxlen, then per ban: addr, until ('inf' or
--   ms), rule, record (JSON, as ban.lua writes it)
-- The record is written compact when it can be (lua/record.lua).
-- Returns how many entries were added or given a later end.
-- record.lua: the records (lua/record.lua), put here when the script is embedded
local n = 0
for i = 3, #ARGV, 4 do
  local addr, untl = ARGV[i], ARGV[i + 1]
  if redis.call('ZADD', KEYS[1], 'GT', 'CH', untl, addr) == 1 then
    n = n + 1
    local ok, r = pcall(cjson.decode, ARGV[i + 3])
    if ok and type(r) == 'table' then
      rec_put(addr, r)
    else
      rec_del(addr)
      redis.call('HSET', KEYS[2], addr, ARGV[i + 3])
    end
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', 'op', 'ban', 'addr', addr,
      'until', untl, 'rule', ARGV[i + 2], 'host', ARGV[1])
  end
end
return n
