-- Removes one address or network from the ban list, with its record, and
-- tells the fleet (DESIGN §3). The offence count is kept: escalation
-- remembers an unbanned repeat offender until forget_after.
-- KEYS[1] {prefix}:bans  KEYS[2] {prefix}:banrec  KEYS[3] {prefix}:events
-- ARGV[1] addr  ARGV[2] host  ARGV[3] stream maxlen  ARGV[4..] other
-- spellings of addr that may be members (`::ffff:a.b.c.d` of an IPv4
-- address, until a reconcile rewrote it; lua/canon.lua)
-- Returns 1 if the address was banned, 0 otherwise.
-- record.lua: the records (lua/record.lua), put here when the script is embedded
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
rec_del(ARGV[1])
for i = 4, #ARGV do
  removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  rec_del(ARGV[i])
end
if removed > 1 then removed = 1 end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'op', 'unban', 'addr', ARGV[1], 'host', ARGV[2])
return removed
