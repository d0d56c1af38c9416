-- Writes one ban atomically: ban list, record, event, offence count (DESIGN §3).
-- KEYS[1] {prefix}:bans     ZSET  member = address or prefix, score = expiry ms (inf = permanent)
-- KEYS[2] {prefix}:banrec   HASH  address -> JSON record
-- KEYS[3] {prefix}:events   STREAM
-- KEYS[4] {prefix}:off:ADDR STRING offence count, TTL forget_after
-- ARGV: addr, now_ms, duration_ms, factor, max_ms, forget_after_ms,
--       rule, reason, host, hits, mode, stream_maxlen
-- mode: 'auto'  a rule decided: no-op if a ban is already active; escalates
--       'set'   an operator's ban: replaces any active ban, no escalation
--       'perm'  an operator's permanent ban
-- Returns {1, until, count} for a new ban, {0, until, count} if one was active
-- (with a damaged record, the ban is written anew: {1, ...}).
local addr = ARGV[1]
local now = tonumber(ARGV[2])
local duration = tonumber(ARGV[3])
local factor = tonumber(ARGV[4])
local max = tonumber(ARGV[5])
local forget = tonumber(ARGV[6])
local mode = ARGV[11]

-- Expired entries leave the list (bounded work per call).
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 100)
if #old > 0 then
  redis.call('ZREM', KEYS[1], unpack(old))
  redis.call('HDEL', KEYS[2], unpack(old))
end

-- A record that is not a JSON object (damaged, written by hand) is no
-- record: the ban being written replaces it, keeping the later end.
local keep
if mode == 'auto' then
  local cur = redis.call('ZSCORE', KEYS[1], addr)
  if cur then
    local rec = redis.call('HGET', KEYS[2], addr)
    local ok, r = true, nil
    if rec then ok, r = pcall(cjson.decode, rec) end
    if not rec or (ok and type(r) == 'table') then
      local count = (r and tonumber(r['count'])) or 1
      return {0, cur, count}
    end
    keep = cur
  end
end

local count = 1
local untl
if mode == 'auto' then
  count = redis.call('INCR', KEYS[4])
  redis.call('PEXPIRE', KEYS[4], forget)
  local d = duration * (factor ^ (count - 1))
  if d > max then d = max end
  untl = now + math.floor(d)
elseif mode == 'perm' then
  untl = 'inf'
else
  untl = now + duration
end

if keep then
  if keep == 'inf' then untl = 'inf'
  elseif untl ~= 'inf' and tonumber(keep) > untl then untl = tonumber(keep) end
end

local until_s = tostring(untl)
if untl ~= 'inf' then until_s = string.format('%d', untl) end
redis.call('ZADD', KEYS[1], until_s, addr)
local rec = cjson.encode({rule = ARGV[7], reason = ARGV[8], host = ARGV[9], since = now,
  ['until'] = (untl == 'inf') and cjson.null or untl, count = count, hits = tonumber(ARGV[10])})
redis.call('HSET', KEYS[2], addr, rec)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[12], '*', 'op', 'ban', 'addr', addr,
  'until', until_s, 'rule', ARGV[7], 'host', ARGV[9])
return {1, until_s, count}
