-- The records of members of the ban list, for reading (`fleetban bans`,
-- `explain`, the record a changed ban kept, a host's copy for writing a
-- lost list back; docs/design.md §3, "The records").
-- KEYS[1] {prefix}:bans (unused: the list's slot)  KEYS[2] {prefix}:banrec
-- ARGV: members (at most 1,000 a call: bounded work)
-- Returns per member its record as JSON text {rule, reason, host, since,
-- count, hits} (a JSON record as it was written, damaged or not), or nil
-- when it has none or its compact record cannot be read.
-- record.lua: the records (lua/record.lua), put here when the script is embedded
local out = {}
for i = 1, #ARGV do
  local m = ARGV[i]
  local j = redis.call('HGET', REC, m)
  if j then
    out[i] = j
  else
    local key, field = rec_slot(m)
    local raw = redis.call('HGET', key, field)
    local r = raw and rec_decode(m, raw)
    out[i] = r and cjson.encode(r) or false
  end
end
return out
