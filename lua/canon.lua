-- Rewrites ban list members written in another spelling than fleetban's
-- (`::ffff:198.51.100.90`, `2001:DB8::1`, written by hand or by another
-- tool) as fleetban writes them (docs/design.md §3), so that `unban` in any
-- spelling finds them. Idempotent; the later end wins; a record moves with
-- its member unless the written spelling has one already.
-- KEYS[1] {prefix}:bans  KEYS[2] {prefix}:banrec
-- ARGV pairs: member as found, member as fleetban writes it
-- Returns how many members were rewritten.
-- record.lua: the records (lua/record.lua), put here when the script is embedded
local n = 0
for i = 1, #ARGV, 2 do
  local raw, canon = ARGV[i], ARGV[i + 1]
  local score = redis.call('ZSCORE', KEYS[1], raw)
  if score then
    redis.call('ZADD', KEYS[1], 'GT', score, canon)
    redis.call('ZREM', KEYS[1], raw)
    local rec = rec_get(raw)
    if rec and not rec_get(canon) then
      rec_put(canon, rec)
    end
    rec_del(raw)
    n = n + 1
  end
end
return n
