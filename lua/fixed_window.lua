-- Fixed window for several (rule, address) groups of one rule in one call
-- (one per address on a Redis Cluster), each group's hits in order as if
-- alone: the seeds' INCR + PEXPIRE, in one script so that no counter is left
-- without its expiry. Window number N = floor(now / window); a hit is over
-- the limit when its window's counter already holds `limit`.
-- KEYS[g]  group g's base ({prefix}:fw:{ADDR}:RULE); the counter of window N
--          is KEYS[g]..':'..N (same hash slot: the address is the hash tag)
-- ARGV[1]  window in ms
-- ARGV[2]  limit
-- ARGV[3]  1 = `now` from the server's TIME, 0 = from the hits
-- ARGV[4]  unused (0)
-- ARGV[5]  G, the number of groups; ARGV[6] .. ARGV[5+G] their numbers of
--          hits; then each group's pairs (time ms, member) in log order
-- Returns {i1, n1, i2, n2, ...} as sliding_window.lua: n = the counter the
-- hit found (over), or the last counter incremented (under; 0 if none).
-- A counter cannot tell a line read twice from a new one: a batch sent again
-- after a timeout is counted again (see README, "Choosing an algorithm").
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local server_now
if ARGV[3] == '1' then
  local t = redis.call('TIME')
  server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function one(base, first, last)
  local count = 0
  local i = 0
  local ck, c = nil, 0
  for a = first, last, 2 do
    i = i + 1
    local now = server_now or tonumber(ARGV[a])
    local key = base .. ':' .. string.format('%d', math.floor(now / window))
    if key ~= ck then
      ck = key
      c = tonumber(redis.call('GET', key) or '0')
    end
    if c >= limit then return i, c end
    c = redis.call('INCR', key)
    if c == 1 then redis.call('PEXPIRE', key, window + 1000) end
    count = c
  end
  return 0, count
end

local groups = tonumber(ARGV[5])
local out = {}
local a = 6 + groups
for g = 1, groups do
  local n = tonumber(ARGV[5 + g])
  out[2 * g - 1], out[2 * g] = one(KEYS[g], a, a + 2 * n - 2)
  a = a + 2 * n
end
return out
