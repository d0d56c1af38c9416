-- Token bucket as GCRA (the form redis-cell uses) for several (rule,
-- address) groups of one rule in one call (of one bucket on a Redis
-- Cluster), each group's hits in order as if alone. State per address in
-- one HASH: t = the theoretical arrival time in microseconds (when the
-- bucket is full again), m = the member of the last hit counted.
-- KEYS[g]  group g's prefix:tb:{BUCKET}:ADDR:RULE
-- ARGV[1]  interval in microseconds between two tokens (1 / rate)
-- ARGV[2]  burst: the bucket's capacity
-- ARGV[3]  1 = `now` from the server's TIME, 0 = from the hits
-- ARGV[4]  key lifetime in ms (burst x interval + 1000: a full bucket needs no state)
-- ARGV[5]  G, the number of groups; ARGV[6] .. ARGV[5+G] their numbers of
--          hits; then each group's pairs (time ms, member) in log order
-- Per hit: t' = max(t, now) + interval; over if t' - now > burst x interval;
-- else t = t'. Returns {i1, n1, i2, n2, ...}: n = tokens in use,
-- ceil((t - now) / interval), at the hit over the limit or after the last
-- hit counted (0 if none).
-- A batch sent again as it was (a timeout) carries the member of the last
-- hit counted: that hit and the ones before it in the batch were counted
-- already and are skipped. Lines read again after a crash that come batched
-- otherwise, or interleaved with another file's, count again
-- (docs/design.md §2).
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local server_now
if ARGV[3] == '1' then
  local t = redis.call('TIME')
  server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function in_use(t, now)
  local d = t - now
  local q = math.floor(d / interval)
  if q * interval < d then q = q + 1 end
  return q
end

local function one(key, first, last)
  local st = redis.call('HMGET', key, 't', 'm')
  local tat = tonumber(st[1])
  local mark = st[2]
  local start = first
  if mark then
    for a = first, last, 2 do
      if ARGV[a + 1] == mark then start = a + 2 break end
    end
  end
  local i = (start - first) / 2
  local changed = false
  local result_i, result_n = nil, nil
  local last_now = nil
  for a = start, last, 2 do
    i = i + 1
    local now = (server_now or tonumber(ARGV[a])) * 1000
    local member = ARGV[a + 1]
    if member ~= mark then
      local t = tat
      -- The bucket more than twice its fill time ahead of the hit: the
      -- clock went back; the bucket starts afresh.
      if t == nil or t < now or t - now > 2 * burst * interval then t = now end
      if t + interval - now > burst * interval then
        result_i, result_n = i, in_use(t, now)
        break
      end
      tat = t + interval
      mark = member
      changed = true
      last_now = now
    end
  end
  if changed then
    redis.call('HSET', key, 't', string.format('%.0f', tat), 'm', mark)
    redis.call('PEXPIRE', key, ARGV[4])
  end
  if result_i then return result_i, result_n end
  if last_now == nil then return 0, 0 end
  return 0, in_use(tat, last_now)
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
