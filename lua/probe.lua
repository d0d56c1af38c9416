-- probe.lua: which commands fleetban needs that this user may not run
-- (`fleetban check --online`). Nothing stays: the two keys are fleetban's
-- own probe keys, created with a 10 s expiry and deleted at the end.
-- KEYS[1]: a key of the windows' pattern (PREFIX:*)
-- KEYS[2]: a key of the list's pattern ({PREFIX}:*)
-- Returns the denied commands, `NAME` or `NAME KEY-PATTERN`.
local w, l = KEYS[1], KEYS[2]
local denied = {}
local function try(name, ...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    local e = r.err
    if string.find(e, 'NOPERM', 1, true) or string.find(e, "can't run this command", 1, true)
      or string.find(e, 'No permissions', 1, true) then
      denied[#denied + 1] = name
    end
  end
end
-- The windows (sliding_window, fixed_window, token_bucket, sliding_counter).
try('zadd', 'ZADD', w, 0, 'probe')
try('pexpire', 'PEXPIRE', w, 10000)
try('zscore', 'ZSCORE', w, 'probe')
try('zcard', 'ZCARD', w)
try('zcount', 'ZCOUNT', w, 0, 1)
try('zremrangebyscore', 'ZREMRANGEBYSCORE', w, 0, 0)
try('hmget', 'HMGET', w, 'c')
try('hget', 'HGET', w, 'c')
try('hset', 'HSET', w, 'c', 1)
try('time', 'TIME')
-- The ban list, records, events, offences, hosts, hot marks, epoch.
try('zadd', 'ZADD', l, 0, 'probe')
try('pexpire', 'PEXPIRE', l, 10000)
try('zrange', 'ZRANGE', l, 0, 0)
try('zrank', 'ZRANK', l, 'probe')
try('zcount', 'ZCOUNT', l, 0, 1)
try('zrangebyscore', 'ZRANGEBYSCORE', l, 0, 0)
try('zscore', 'ZSCORE', l, 'probe')
try('zrem', 'ZREM', l, 'probe')
try('hmget', 'HMGET', l, 'x')
try('hget', 'HGET', l, 'x')
try('hset', 'HSET', l, 'x', 1)
try('hdel', 'HDEL', l, 'x')
try('incr', 'INCR', l)
try('xadd', 'XADD', l, 'MAXLEN', 1, '*', 'op', 'probe')
try('xread', 'XREAD', 'COUNT', 1, 'STREAMS', l, '0-0')
try('xrevrange', 'XREVRANGE', l, '+', '-', 'COUNT', 1)
try('xinfo|stream', 'XINFO', 'STREAM', l)
try('sadd', 'SADD', l, 'probe')
try('scard', 'SCARD', l)
try('smembers', 'SMEMBERS', l)
try('get', 'GET', l)
try('set', 'SET', l, 'probe', 'PX', 10000)
try('del', 'DEL', w, l)
-- One entry per command, in the order first denied.
local seen, out = {}, {}
for _, n in ipairs(denied) do
  if not seen[n] then
    seen[n] = true
    out[#out + 1] = n
  end
end
return out
