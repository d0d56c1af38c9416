-- One page of the active ban list, in the list's order (score, then
-- member), after the entry the previous page ended with (docs/design.md §3,
-- "Reading the list"). A whole list in one reply is unbounded in bytes and
-- in Redis's time (1,000,000 bans: ~0.5 s, past `redis.timeout`); a page is
-- bounded, and costs O(log N + page).
-- KEYS[1] {prefix}:bans
-- ARGV[1] now (ms): entries ending at or before it are not active
-- ARGV[2] the member the previous page ended with ('' for the first page)
-- ARGV[3] its score as that page returned it
-- ARGV[4] the page size
-- Returns member, score, member, score... as ZRANGE WITHSCORES does.
-- The next page starts right after that member when it still holds that
-- score; otherwise (unbanned or banned again meanwhile) at the first entry
-- of its score: the caller skips what it read already. An entry added
-- behind the cursor during the read comes as an event after the snapshot's
-- stream id, as every change does.
local list, n = KEYS[1], tonumber(ARGV[4])
local start
if ARGV[2] ~= '' then
  if redis.call('ZSCORE', list, ARGV[2]) == ARGV[3] then
    start = redis.call('ZRANK', list, ARGV[2]) + 1
  else
    start = redis.call('ZCOUNT', list, '-inf', '(' .. ARGV[3])
  end
else
  start = redis.call('ZCOUNT', list, '-inf', ARGV[1])
end
return redis.call('ZRANGE', list, start, start + n - 1, 'WITHSCORES')
