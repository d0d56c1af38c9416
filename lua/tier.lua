-- The fixed-window counter with each line counted once (docs/design.md §2),
-- shared by fixed_window.lua and the prefilter of sliding_window.lua: a
-- script cannot load another, so `store::scripts` puts this file in place
-- of the line `-- tier.lua` of each when it embeds them. It uses the
-- including script's local `window` (ms).
-- One fixed window's HASH in hand (tk): its count (tc), whether it is new
-- (tfresh), whether it changed (tdirty), and the marks of the origins looked
-- up so far: the first one's in o1/m1 (offset as a number; t1 its text once
-- it moved), any other's in `more` (origin -> {offset, text}). No table in
-- the usual case, one origin per group.
local tk, tc, tfresh, tdirty = nil, 0, false, false
local o1, m1, t1, more = nil, -1, nil, nil

-- Writes what changed in the window in hand, with its expiry if it is new.
local function tier_save()
  if tdirty then
    if more == nil then
      redis.call('HSET', tk, 'c', tc, o1, t1)
    else
      local args = {'c', tc}
      if t1 then args[3], args[4] = o1, t1 end
      for o, v in pairs(more) do
        if v[2] then
          args[#args + 1] = o
          args[#args + 1] = v[2]
        end
      end
      redis.call('HSET', tk, unpack(args))
    end
    if tfresh then redis.call('PEXPIRE', tk, window + 1000) end
  end
  tk, tc, tdirty, t1, more = nil, 0, false, nil, nil
end

-- Offers the line at `offset` of `origin` (ARGV text) to window `key`, of
-- at most `cap` hits: 'seen' (counted before), 'full', or 'counted'.
local function tier_offer(key, origin, offset, cap)
  if key ~= tk then
    tier_save()
    local v = redis.call('HMGET', key, 'c', origin)
    tk, tc, tfresh = key, tonumber(v[1]) or 0, not v[1]
    o1, m1 = origin, tonumber(v[2]) or -1
  end
  local at = tonumber(offset)
  if origin == o1 then
    if at <= m1 then return 'seen' end
    if tc >= cap then return 'full' end
    m1, t1 = at, offset
  else
    if more == nil then more = {} end
    local v = more[origin]
    if v == nil then
      v = {tonumber(redis.call('HGET', key, origin)) or -1, false}
      more[origin] = v
    end
    if at <= v[1] then return 'seen' end
    if tc >= cap then return 'full' end
    v[1], v[2] = at, offset
  end
  tc = tc + 1
  tdirty = true
  return 'counted'
end
