-- Distinct values in a sliding window (DESIGN §2, "Distinct values") for
-- several (rule, address) groups of one rule in one call, each group's hits
-- processed in order as if alone, as sliding_window.lua does.
-- KEYS[g]  group g's window ZSET (prefix:win:{BUCKET}:ADDR:RULE): member =
--          the hash of a value (computed by fleetban, the same on every
--          host), score = the latest time the value was seen (ms)
-- ARGV[1]  window in ms
-- ARGV[2]  limit: distinct values allowed within one window
-- ARGV[3]  1 = take `now` from the server's TIME (clock: redis), 0 = from the hits
-- ARGV[4]  0 (the place of sliding_window.lua's prefilter)
-- ARGV[5]  G, the number of groups
-- ARGV[6] .. ARGV[5+G]  each group's number of hits
-- then each group's hits in log order, group after group: pairs (time ms, member)
-- Returns {i1, n1, i2, n2, ...}, per group: i = 1-based index of the first
-- hit over the limit (0: none), n = the count it was judged on (over) or the
-- members in the ZSET (under).
-- Per hit: members at or before now - window leave, and those dated more
-- than a window after it (the clock went back: another timeline). A value
-- present is not counted again, whatever its time: its score becomes the
-- later of the two (ZADD GT), so that a value repeated stays in the window.
-- A value not present is judged on the members dated at or before the hit:
-- `limit` of them already, it is over the limit and is not added (the
-- address is being banned; the hits after it are not counted). So a ZSET
-- never holds more than `limit` members. A line read again after a crash is
-- its value again: present, not counted again.
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local server_now
if ARGV[3] == '1' then
  local t = redis.call('TIME')
  server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- One group: the pairs ARGV[first], ARGV[first + 1] .. ARGV[last + 1].
local function one(key, first, last)
  -- As in sliding_window.lua: the sweep at or before now - window is
  -- skipped when time has not advanced, the sweep of members more than a
  -- window ahead when the hit is not earlier than the earliest one swept
  -- for, unless a member added or raised since may need it.
  local swept = nil
  local low = nil
  local added = false
  local count = nil
  local i = 0
  for a = first, last, 2 do
    i = i + 1
    local now = server_now or tonumber(ARGV[a])
    local member = ARGV[a + 1]
    if swept == nil or now > swept then
      local removed = redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
      swept = now
      if count then count = count - removed end
    end
    if low == nil or now < low then
      local removed = redis.call('ZREMRANGEBYSCORE', key, '(' .. string.format('%d', now + window), '+inf')
      low = now
      if count then count = count - removed end
    end
    local score = redis.call('ZSCORE', key, member)
    if score then
      if now > tonumber(score) then
        redis.call('ZADD', key, 'XX', now, member)
        added = true
        if now > low + window then low = nil end
      end
    else
      if count == nil then count = redis.call('ZCARD', key) end
      local within = count
      if count >= limit then
        -- Members dated after this hit are not counted against it.
        within = count - redis.call('ZCOUNT', key, '(' .. string.format('%d', now), '+inf')
      end
      if within >= limit then
        if added then redis.call('PEXPIRE', key, window + 1000) end
        return i, within
      end
      redis.call('ZADD', key, now, member)
      count = count + 1
      added = true
      if now < swept then swept = nil end
      if now > low + window then low = nil end
    end
  end
  if added then redis.call('PEXPIRE', key, window + 1000) end
  return 0, count or redis.call('ZCARD', key)
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
