-- Sliding window (DESIGN §2) for several (rule, address) groups of one rule
-- in one call, each group's hits processed in order as if alone: one
-- EVALSHA per rule and flush slice instead of one per address (outside a
-- Redis Cluster; on a Cluster a call's groups share a bucket, one hash slot).
-- KEYS[2g-1]  group g's window ZSET (prefix:win:{BUCKET}:ADDR:RULE)
-- KEYS[2g]    group g's prefilter counters' base (prefix:fixed:{BUCKET}:ADDR:RULE);
--             window N is the HASH KEYS[2g]..':'..N, as in fixed_window.lua
-- ARGV[1]  window in ms
-- ARGV[2]  limit: hits allowed within one window
-- ARGV[3]  1 = take `now` from the server's TIME (clock: redis), 0 = from the hits
-- ARGV[4]  prefilter threshold P = floor(prefilter x limit); 0 = no prefilter
-- ARGV[5]  G, the number of groups
-- ARGV[6] .. ARGV[5+G]  each group's number of hits
-- then each group's hits in log order, group after group: pairs (time ms,
-- member), or with a prefilter quadruples (time ms, member, origin, offset)
-- Returns {i1, n1, i2, n2, ...}, per group: i = 1-based index of the first
-- hit over the limit (0: none), n = the count it was judged on (over) or the
-- members in the ZSET (under).
-- A hit is judged on the members dated at or before it: those dated after
-- it (a log whose clock went back, lines out of order) are not counted
-- against it, and those dated more than a window after it leave the window
-- (the clock went back: they belong to another timeline; DESIGN §2, "Time
-- out of order").
-- Hits after the first one over the limit are not counted: the address is
-- being banned. A member already present is a line read again after a
-- crash: it is neither counted again nor judged again.
--
-- Prefilter (two tiers): the first P hits of each fixed window N (of length
-- `window`) are only counted in a fixed-window counter and never judged;
-- from the (P+1)-th on, a hit goes to the ZSET and is judged on ZCARD + P, a
-- lower bound of the exact count (those P hits lie within the sliding
-- window). A line the counter counted already (at or before the offset last
-- counted from its origin in that window) is neither counted nor judged
-- again, as in fixed_window.lua.
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local prefilter = tonumber(ARGV[4])
local server_now
if ARGV[3] == '1' then
  local t = redis.call('TIME')
  server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The ARGV values per hit.
local stride = 2
if prefilter > 0 then stride = 4 end

-- tier.lua: the fixed-window counter (lua/tier.lua), put here when the script is embedded

-- A group of hits in time order, spanning less than a window, that all fit
-- (the count after the first hit's sweep plus the hits <= limit: no hit can
-- find the window full, later sweeps only remove more), with nothing for the
-- later hits' sweeps to remove, ends as the per-hit steps below would: one
-- ZADD NX for all its members. Returns nil when the group is not of that
-- kind (the steps below decide it).
local function all_fit(key, first, last)
  local n = (last - first) / 2 + 1
  if prefilter > 0 or n < 2 or n > 512 then return nil end
  local t1 = server_now or tonumber(ARGV[first])
  local tn = t1
  for a = first + 2, last, 2 do
    local t = server_now or tonumber(ARGV[a])
    if t < tn then return nil end
    tn = t
  end
  -- Within one window no hit of the group can sweep another one away (the
  -- per-hit steps would then count a repeated member again).
  if tn - t1 >= window then return nil end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', t1 - window)
  redis.call('ZREMRANGEBYSCORE', key, '(' .. string.format('%d', t1 + window), '+inf')
  local count = redis.call('ZCARD', key)
  if count + n > limit then return nil end
  -- A member the later hits' sweeps would remove could come back in the
  -- group (a re-read line, a folded member's twin): the per-hit steps then.
  if tn > t1 and redis.call('ZCOUNT', key, '(' .. string.format('%d', t1 - window),
      string.format('%d', tn - window)) > 0 then
    return nil
  end
  local args = {}
  for a = first, last, 2 do
    args[#args + 1] = server_now or ARGV[a]
    args[#args + 1] = ARGV[a + 1]
  end
  local added = redis.call('ZADD', key, 'NX', unpack(args))
  count = count + added
  if added > 0 then redis.call('PEXPIRE', key, window + 1000) end
  return count
end

-- One group: the pairs ARGV[first], ARGV[first + 1] .. ARGV[last + 1].
local function one(key, fw, first, last)
  local fit = all_fit(key, first, last)
  if fit then return 0, fit end
  local swept = nil
  -- The earliest hit the members more than a window after it were removed for.
  local low = nil
  local added = false
  -- The ZSET's cardinality, kept in step with what this call removes and adds
  -- (ZREMRANGEBYSCORE and ZADD NX return how many): one ZCARD per group, and
  -- no ZSCORE unless the window is full (a hit over the limit may be a re-read).
  local count = nil
  local i = 0
  for a = first, last, stride do
    i = i + 1
    local now = server_now or tonumber(ARGV[a])
    local member = ARGV[a + 1]
    local screened = false
    if prefilter > 0 then
      local fk = fw .. ':' .. string.format('%d', math.floor(now / window))
      screened = tier_offer(fk, ARGV[a + 2], ARGV[a + 3], prefilter) ~= 'full'
    end
    if not screened then
      -- Members at or before now - window leave the window; a later hit can
      -- only remove more, so the sweep is skipped when time has not advanced
      -- (and no member dated before the last sweep was added since).
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
      if count == nil then count = redis.call('ZCARD', key) end
      -- Full: members dated after this hit (the clock went back, lines
      -- out of order) are not counted against it.
      local within = count
      if count + prefilter >= limit then
        within = count - redis.call('ZCOUNT', key, '(' .. string.format('%d', now), '+inf')
      end
      if within + prefilter >= limit then
        if not redis.call('ZSCORE', key, member) then
          if added then redis.call('PEXPIRE', key, window + 1000) end
          tier_save()
          return i, within + prefilter
        end
      elseif redis.call('ZADD', key, 'NX', now, member) == 1 then
        count = count + 1
        added = true
        -- A member dated before the last sweep, or more than a window
        -- after the earliest hit: a later hit's sweep may have to remove it.
        if now < swept then swept = nil end
        if now > low + window then low = nil end
      end
    end
  end
  if added then redis.call('PEXPIRE', key, window + 1000) end
  tier_save()
  return 0, count or redis.call('ZCARD', key)
end

local groups = tonumber(ARGV[5])
local out = {}
local a = 6 + groups
for g = 1, groups do
  local n = tonumber(ARGV[5 + g])
  out[2 * g - 1], out[2 * g] = one(KEYS[2 * g - 1], KEYS[2 * g], a, a + stride * n - stride)
  a = a + stride * n
end
return out
