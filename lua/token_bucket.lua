-- Token bucket for one (rule, address) as GCRA (the form redis-cell uses),
-- one call per batch of hits. State in one HASH: t = the theoretical arrival
-- time in microseconds (when the bucket is full again), m = the member of the
-- last hit counted.
-- KEYS[1]  {prefix}:tb:{ADDR}:RULE
-- ARGV[1]  interval in microseconds between two tokens (1 / rate)
-- ARGV[2]  burst: the bucket's capacity
-- ARGV[3]  1 = `now` from the server's TIME, 0 = from the hits
-- ARGV[4]  key lifetime in ms (burst x interval + 1000: a full bucket needs no state)
-- ARGV[5], ARGV[6], ...  pairs (time ms, member) in log order
-- Per hit: t' = max(t, now) + interval; over if t' - now > burst x interval;
-- else t = t'. Returns {i, n}: n = tokens in use, ceil((t - now) / interval),
-- at the hit over the limit or after the last hit counted (0 if none).
-- A batch sent again (timeout, re-read after a crash) carries the member of
-- the last hit counted: that hit and the ones before it in the batch were
-- counted already and are skipped.
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local server_now
if ARGV[3] == '1' then
  local t = redis.call('TIME')
  server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local st = redis.call('HMGET', key, 't', 'm')
local tat = tonumber(st[1])
local mark = st[2]
local start = 5
if mark then
  for a = 5, #ARGV, 2 do
    if ARGV[a + 1] == mark then start = a + 2 break end
  end
end
local function in_use(t, now)
  local d = t - now
  local q = math.floor(d / interval)
  if q * interval < d then q = q + 1 end
  return q
end
local i = (start - 5) / 2
local changed = false
local result = nil
local last_now = nil
for a = start, #ARGV, 2 do
  i = i + 1
  local now = (server_now or tonumber(ARGV[a])) * 1000
  local member = ARGV[a + 1]
  if member ~= mark then
    local t = tat
    if t == nil or t < now then t = now end
    if t + interval - now > burst * interval then
      result = {i, in_use(t, now)}
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
if result then return result end
if last_now == nil then return {0, 0} end
return {0, in_use(tat, last_now)}
