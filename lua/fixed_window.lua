-- Fixed window for one (rule, address), one call per batch of hits: the
-- seeds' INCR + PEXPIRE, in one script so that no counter is left without
-- its expiry. Window number N = floor(now / window); a hit is over the limit
-- when its window's counter already holds `limit`.
-- KEYS[1]  base ({prefix}:fw:{ADDR}:RULE); the counter of window N is KEYS[1]..':'..N
--          (same hash slot as KEYS[1]: the address is the hash tag)
-- ARGV[1]  window in ms
-- ARGV[2]  limit
-- ARGV[3]  1 = `now` from the server's TIME, 0 = from the hits
-- ARGV[4]  unused (0)
-- ARGV[5], ARGV[6], ...  pairs (time ms, member) in log order
-- Returns {i, n} as sliding_window.lua: n = the counter the hit found (over),
-- or the last counter incremented (under; 0 if none).
-- A counter cannot tell a line read twice from a new one: a batch sent again
-- after a timeout is counted again (see README, "Choosing an algorithm").
local base = KEYS[1]
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local server_now
if ARGV[3] == '1' then
  local t = redis.call('TIME')
  server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local count = 0
local i = 0
local ck, c = nil, 0
for a = 5, #ARGV, 2 do
  i = i + 1
  local now = server_now or tonumber(ARGV[a])
  local key = base .. ':' .. string.format('%d', math.floor(now / window))
  if key ~= ck then
    ck = key
    c = tonumber(redis.call('GET', key) or '0')
  end
  if c >= limit then return {i, c} end
  c = redis.call('INCR', key)
  if c == 1 then redis.call('PEXPIRE', key, window + 1000) end
  count = c
end
return {0, count}
