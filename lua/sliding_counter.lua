-- Sliding counter for several (rule, address) groups of one rule in one
-- call (of one bucket on a Redis Cluster), each group's hits in order as
-- if alone: two fixed windows weighted by overlap, O(1) state whatever the
-- limit. One HASH per address: n = current window number, c = hits counted
-- in window n, p = hits counted in window n - 1, m = member of the last hit
-- counted.
-- KEYS[g]  group g's prefix:sc:{BUCKET}:ADDR:RULE
-- ARGV[1]  window in ms
-- ARGV[2]  limit
-- ARGV[3]  1 = `now` from the server's TIME, 0 = from the hits
-- ARGV[4]  unused (0)
-- ARGV[5]  G, the number of groups; ARGV[6] .. ARGV[5+G] their numbers of
--          hits; then each group's pairs (time ms, member) in log order
-- Per hit, with N = floor(now / window): if N > n the windows move on (p = c
-- if N = n + 1, else 0; c = 0; n = N). The estimate, in hits x window (exact
-- integers), is p x (window - elapsed) + c x window, elapsed = now - n x window
-- (0 for a hit older than window n: judged as at its start). Over when the
-- estimate >= limit x window; else c = c + 1.
-- Returns {i1, n1, i2, n2, ...}: n = floor(estimate / window) at the hit
-- over the limit, or c after the last hit (under). Resent batches: as
-- token_bucket.lua.
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local server_now
if ARGV[3] == '1' then
  local t = redis.call('TIME')
  server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function one(key, first, last)
  local st = redis.call('HMGET', key, 'n', 'c', 'p', 'm')
  local cur = tonumber(st[1])
  local c = tonumber(st[2]) or 0
  local p = tonumber(st[3]) or 0
  local mark = st[4]
  local start = first
  if mark then
    for a = first, last, 2 do
      if ARGV[a + 1] == mark then start = a + 2 break end
    end
  end
  local i = (start - first) / 2
  local changed = false
  local result_i, result_n = nil, nil
  for a = start, last, 2 do
    i = i + 1
    local now = server_now or tonumber(ARGV[a])
    local member = ARGV[a + 1]
    if member ~= mark then
      local n = math.floor(now / window)
      -- A hit two windows or more before the counter's: the clock went
      -- back; the counter starts afresh.
      if cur == nil or n < cur - 1 then
        cur, c, p = n, 0, 0
      elseif n > cur then
        if n == cur + 1 then p = c else p = 0 end
        c, cur = 0, n
      end
      local elapsed = 0
      if n == cur then elapsed = now - cur * window end
      local est = p * (window - elapsed) + c * window
      if est >= limit * window then
        result_i, result_n = i, math.floor(est / window)
        break
      end
      c = c + 1
      mark = member
      changed = true
    end
  end
  if changed then
    redis.call('HSET', key, 'n', string.format('%.0f', cur), 'c', c, 'p', p, 'm', mark)
    redis.call('PEXPIRE', key, 2 * window + 1000)
  end
  if result_i then return result_i, result_n end
  return 0, c
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
