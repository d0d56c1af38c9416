-- Writes one ban atomically: ban list, record, event, offence count (DESIGN §3).
-- KEYS[1] {prefix}:bans     ZSET  member = address or prefix, score = expiry ms (inf = permanent)
-- KEYS[2] {prefix}:banrec   the records (lua/record.lua: compact in
--         {prefix}:banrec:N and :meta, or JSON in this HASH)
-- KEYS[3] {prefix}:events   STREAM
-- KEYS[4] {prefix}:off:ADDR STRING offence count, TTL forget_after
-- KEYS[5] {prefix}:esc:RULE:NET ZSET  (escalate_network only) member =
--         address the rule banned in NET, score = its latest ban (ms)
-- ARGV: addr, now_ms, duration_ms, factor, max_ms, forget_after_ms,
--       rule, reason, host, hits, mode, stream_maxlen, replace,
--       net, net_bans, net_within_ms, net_duration_ms, net_reason
--       (net = '' without escalate_network)
-- mode: 'auto'  a rule decided: no-op if a ban is already active; escalates
--       'set'   an operator's ban of duration_ms
--       'perm'  an operator's permanent ban
-- An operator's ban never shortens an active one: the later end wins (a
-- permanent ban stays permanent) and the active ban's rule, host, start
-- and count are kept, its reason too unless a new one is given; with
-- replace = '1' it is replaced whatever the ends (`ban --replace`).
-- escalate_network: a rule's new ban of addr (code 1) is noted in
-- KEYS[5]; addresses whose latest ban is not later than now - within
-- leave it; when net_bans or more are left and net itself is not banned,
-- net is banned until now + net_duration_ms (its record, list entry and
-- event written here, in the same step), and net_until is that end.
-- Returns {code, until, count, effect, was, net_until}: net_until '' when
-- no network was banned. code 1 for a new ban (effect
-- 'new'), 0 if a rule's ban found one active (effect 'active'), 2 for an
-- operator's ban of an active one (effect 'kept', 'extended' or
-- 'replaced'; was = the active ban's end). A damaged record (not a JSON
-- object, or compact and unreadable) is no record: the ban is written
-- anew, keeping the later end.
-- record.lua: the records (lua/record.lua), put here when the script is embedded
local addr = ARGV[1]
local now = tonumber(ARGV[2])
local duration = tonumber(ARGV[3])
local factor = tonumber(ARGV[4])
local max = tonumber(ARGV[5])
local forget = tonumber(ARGV[6])
local mode = ARGV[11]
local replace = ARGV[13] == '1'

-- Expired entries leave the list (bounded work per call).
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 100)
if #old > 0 then
  redis.call('ZREM', KEYS[1], unpack(old))
  for _, m in ipairs(old) do rec_del(m) end
end

local function fmt(u)
  if u == 'inf' then return 'inf' end
  return string.format('%d', u)
end

-- The active ban, if any: its end ('inf' or a number) and its record
-- (nil when missing or damaged).
local cur = redis.call('ZSCORE', KEYS[1], addr)
if cur == 'inf' or cur == '+inf' then
  cur = 'inf'
elseif cur then
  cur = tonumber(cur)
  if cur and cur <= now then cur = nil end
end
local currec, damaged
if cur then
  currec, damaged = rec_get(addr)
end

if mode == 'auto' and cur then
  -- Active: nothing new (with a damaged record, written anew below).
  if not damaged then
    local count = (currec and tonumber(currec['count'])) or 1
    return {0, fmt(cur), count, 'active', fmt(cur), ''}
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

local function later(a, b)
  if a == 'inf' or b == 'inf' then return 'inf' end
  if a > b then return a end
  return b
end

local code, effect = 1, 'new'
local rule, reason, host, since, hits = ARGV[7], ARGV[8], ARGV[9], now, tonumber(ARGV[10])
if cur then
  if mode == 'auto' then
    untl = later(untl, cur)
  else
    code = 2
    if currec and reason == '' then reason = currec['reason'] or '' end
    if currec and currec['count'] then count = tonumber(currec['count']) or 1 end
    if replace then
      effect = 'replaced'
    else
      if cur == 'inf' or (untl ~= 'inf' and untl <= cur) then
        effect = 'kept'
        untl = cur
      else
        effect = 'extended'
      end
      if currec then
        rule = currec['rule'] or rule
        host = currec['host'] or host
        since = tonumber(currec['since']) or now
        hits = tonumber(currec['hits']) or 0
      end
    end
  end
end

local until_s = fmt(untl)
rec_put(addr, {rule = rule, reason = reason, host = host, since = since,
  ['until'] = (untl == 'inf') and cjson.null or untl, count = count, hits = hits})
if effect ~= 'kept' then
  redis.call('ZADD', KEYS[1], until_s, addr)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[12], '*', 'op', 'ban', 'addr', addr,
    'until', until_s, 'rule', rule, 'host', ARGV[9])
end
local was = ''
if cur then was = fmt(cur) end

local net_until = ''
local net = ARGV[14]
if mode == 'auto' and code == 1 and net and net ~= '' and KEYS[5] then
  local within = tonumber(ARGV[16])
  -- The latest ban counts: an older time written late (a queued ban)
  -- does not move an address back.
  local seen = redis.call('ZSCORE', KEYS[5], addr)
  if not seen or tonumber(seen) < now then
    redis.call('ZADD', KEYS[5], now, addr)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - within)
  redis.call('PEXPIRE', KEYS[5], within)
  if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[15]) then
    local ncur = redis.call('ZSCORE', KEYS[1], net)
    local active = ncur == 'inf' or ncur == '+inf' or (ncur and tonumber(ncur) > now)
    if not active then
      local nu = now + tonumber(ARGV[17])
      net_until = fmt(nu)
      rec_put(net, {rule = ARGV[7], reason = ARGV[18],
        host = ARGV[9], since = now, ['until'] = nu, count = 1, hits = 0})
      redis.call('ZADD', KEYS[1], net_until, net)
      redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[12], '*', 'op', 'ban', 'addr', net,
        'until', net_until, 'rule', ARGV[7], 'host', ARGV[9])
    end
  end
end
return {code, until_s, count, effect, was, net_until}
