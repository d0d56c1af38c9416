-- Fixed window for several (rule, address) groups of one rule in one call
-- (of one bucket on a Redis Cluster), each group's hits in order as if
-- alone, each line counted once (docs/design.md §2). Window number
-- N = floor(now / window); a hit is over the limit when its window already
-- counted `limit` hits.
-- KEYS[g]  group g's base (prefix:fixed:{BUCKET}:ADDR:RULE); window N is the HASH
--          KEYS[g]..':'..N (same hash slot: the bucket is the hash tag):
--          c = hits counted, and per origin (host and file) the byte offset
--          of the last line counted from it; PEXPIRE window + 1000 ms when
--          created, so no counter is left without its expiry.
-- ARGV[1]  window in ms
-- ARGV[2]  limit
-- ARGV[3]  1 = `now` from the server's TIME, 0 = from the hits
-- ARGV[4]  unused (0)
-- ARGV[5]  G, the number of groups; ARGV[6] .. ARGV[5+G] their numbers of
--          hits; then each group's triples (time ms, origin, offset) in log
--          order
-- Returns {i1, n1, i2, n2, ...} as sliding_window.lua: n = the count the
-- hit found (over), or the count of the last hit's window (under).
-- A line at or before the offset last counted from its origin in its window
-- was counted (or judged) already: a re-read after a crash, a batch sent
-- again after a timeout. It is neither counted nor judged again. The lines
-- of one origin reach a window in offset order (docs/design.md §2).
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local server_now
if ARGV[3] == '1' then
  local t = redis.call('TIME')
  server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- tier.lua: the fixed-window counter (lua/tier.lua), put here when the script is embedded

local function one(base, first, last)
  local i = 0
  for a = first, last, 3 do
    i = i + 1
    local now = server_now or tonumber(ARGV[a])
    local key = base .. ':' .. string.format('%d', math.floor(now / window))
    if tier_offer(key, ARGV[a + 1], ARGV[a + 2], limit) == 'full' then
      local c = tc
      tier_save()
      return i, c
    end
  end
  local c = tc
  tier_save()
  return 0, c
end

local groups = tonumber(ARGV[5])
local out = {}
local a = 6 + groups
for g = 1, groups do
  local n = tonumber(ARGV[5 + g])
  out[2 * g - 1], out[2 * g] = one(KEYS[g], a, a + 3 * n - 3)
  a = a + 3 * n
end
return out
