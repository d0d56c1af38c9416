-- record.lua: a ban's record, compact (docs/design.md §3, "The records").
-- Put in place of its line in ban.lua, unban.lua, restore.lua and
-- canon.lua when they are embedded (a script cannot load another); KEYS[2]
-- is {prefix}:banrec in each. Many records are read by src/bans/list/record.rs
-- (decode_record), which must agree with rec_slot and rec_decode here.
-- A record is {rule, reason, host, since, count, hits} (its end is the
-- list's score). Most are stored compact, ~30 B each with their share of
-- the buckets:
--   {prefix}:banrec:N (N = 0..4095, the first 12 bits of SHA-1(member)):
--     HASH, field = the next 6 bytes of SHA-1(member), value = byte 1 then
--     varints since, count, hits, name id. ~250 records per bucket at
--     1,000,000 bans: Redis keeps each as one listpack (up to 512 entries
--     and 64 B values by default).
--   {prefix}:banrec:meta: HASH, the (rule, host, reason) triples interned:
--     '#ID' -> 'rule\nhost\nreason', '=' .. that text -> ID, 'n' -> the last
--     ID. In the reason, \2 stands for the member and \1 for the hits.
-- A record that cannot be compact (a name or reason with those bytes,
-- numbers that are not whole, more than REC_MAX_NAMES triples) is JSON in
-- the hash {prefix}:banrec (field = member), as before: versions before the
-- compact records wrote every record so, and a JSON record of a member is
-- read before its compact one (an older version may have written it later).
local REC = KEYS[2]
local REC_META = REC .. ':meta'
local REC_MAX_NAMES = 16383

-- The bucket and the field of member's compact record.
local function rec_slot(member)
  local h = redis.sha1hex(member)
  local f = {}
  for i = 4, 14, 2 do
    f[#f + 1] = string.char(tonumber(string.sub(h, i, i + 1), 16))
  end
  return REC .. ':' .. tonumber(string.sub(h, 1, 3), 16), table.concat(f)
end

local function rec_whole(n)
  return type(n) == 'number' and n >= 0 and n < 2 ^ 53 and n == math.floor(n)
end

local function rec_put_varint(t, n)
  repeat
    local b = n % 128
    n = math.floor(n / 128)
    if n > 0 then b = b + 128 end
    t[#t + 1] = string.char(b)
  until n == 0
end

-- The varint at i of s and the index after it; nil when s ends first.
local function rec_get_varint(s, i)
  local n, mul = 0, 1
  while mul < 2 ^ 56 do
    local b = string.byte(s, i)
    if not b then return nil end
    i = i + 1
    if b < 128 then return n + b * mul, i end
    n = n + (b - 128) * mul
    mul = mul * 128
  end
  return nil
end

-- s with the first plain occurrence of what replaced by by (s if none).
local function rec_replace(s, what, by)
  if what == '' then return s end
  local a, b = string.find(s, what, 1, true)
  if not a then return s end
  return string.sub(s, 1, a - 1) .. by .. string.sub(s, b + 1)
end

-- The ID of r's (rule, host, reason) triple, interned now if new; nil
-- when it cannot be (see above).
local function rec_name(member, r)
  local rule, host, reason = r.rule, r.host, r.reason
  if type(rule) ~= 'string' or type(host) ~= 'string' or type(reason) ~= 'string' then return nil end
  if string.find(rule, '\n', 1, true) or string.find(host, '\n', 1, true)
    or string.find(reason, '[\1\2]') then
    return nil
  end
  local t = rec_replace(reason, member, '\2')
  if r.hits > 0 then t = rec_replace(t, string.format('%d', r.hits), '\1') end
  local text = rule .. '\n' .. host .. '\n' .. t
  local id = redis.call('HGET', REC_META, '=' .. text)
  if id then return tonumber(id) end
  local n = (tonumber(redis.call('HGET', REC_META, 'n')) or 0) + 1
  if n > REC_MAX_NAMES then return nil end
  redis.call('HSET', REC_META, 'n', n, '=' .. text, n, '#' .. n, text)
  return n
end

-- Triples already read by this call, by ID.
local rec_names = {}

-- The compact record raw of member as a table; nil when damaged or its
-- triple is unknown.
local function rec_decode(member, raw)
  if string.byte(raw, 1) ~= 1 then return nil end
  local since, count, hits, id
  local i = 2
  since, i = rec_get_varint(raw, i)
  if not since then return nil end
  count, i = rec_get_varint(raw, i)
  if not count then return nil end
  hits, i = rec_get_varint(raw, i)
  if not hits then return nil end
  id, i = rec_get_varint(raw, i)
  if not id or i ~= #raw + 1 then return nil end
  local text = rec_names[id]
  if not text then
    text = redis.call('HGET', REC_META, '#' .. id)
    if not text then return nil end
    rec_names[id] = text
  end
  local a = string.find(text, '\n', 1, true)
  local b = a and string.find(text, '\n', a + 1, true)
  if not b then return nil end
  local reason = string.sub(text, b + 1)
  reason = rec_replace(reason, '\1', string.format('%d', hits))
  reason = rec_replace(reason, '\2', member)
  return {rule = string.sub(text, 1, a - 1), host = string.sub(text, a + 1, b - 1), reason = reason,
    since = since, count = count, hits = hits}
end

-- member's record (a table) and whether one is there but damaged (not a
-- JSON object, or compact and unreadable): nil, true.
local function rec_get(member)
  local j = redis.call('HGET', REC, member)
  if j then
    local ok, r = pcall(cjson.decode, j)
    if ok and type(r) == 'table' then return r, false end
    return nil, true
  end
  local key, field = rec_slot(member)
  local raw = redis.call('HGET', key, field)
  if not raw then return nil, false end
  local r = rec_decode(member, raw)
  if r then return r, false end
  return nil, true
end

-- Writes member's record r {rule, reason, host, since, until, count, hits}
-- (until: the JSON form's, cjson.null when permanent), compact when it can
-- be, and removes the other form.
local function rec_put(member, r)
  local key, field = rec_slot(member)
  local id
  if rec_whole(r.since) and rec_whole(r.count) and rec_whole(r.hits) then
    id = rec_name(member, r)
  end
  if id then
    local t = {string.char(1)}
    rec_put_varint(t, r.since)
    rec_put_varint(t, r.count)
    rec_put_varint(t, r.hits)
    rec_put_varint(t, id)
    redis.call('HSET', key, field, table.concat(t))
    redis.call('HDEL', REC, member)
  else
    redis.call('HSET', REC, member, cjson.encode(r))
    redis.call('HDEL', key, field)
  end
end

-- Removes member's record, both forms.
local function rec_del(member)
  local key, field = rec_slot(member)
  redis.call('HDEL', REC, member)
  redis.call('HDEL', key, field)
end
