/**
 * Lua run inside Redis: each admission is one EVALSHA that checks everything in the
 * contract's order and writes only when every check passes; settlement is another, release a
 * third. All keys of an account share the hash tag `{accountId}`, so the scripts also run on
 * Redis Cluster. Time is Redis's own (TIME), so instances with skewed clocks agree.
 *
 * Every script checks every argument before its first write (Lua does not roll back: a
 * command that fails half-way leaves the writes before it), and writes money with HSET of an
 * integer it computed, saturating at 2^53 - 1, so no value can turn a field into a float or
 * an exponent. Money fields are read with `num`, which treats anything unreadable as 0.
 *
 * Keys of account A under prefix P:
 *   P{A}:wt, P{A}:wn  RPM window: sorted set of the milliseconds that admitted (member = score
 *                     = ms), and a hash: `n` = admissions in the window, and ms -> admissions in
 *                     that ms for the milliseconds that admitted more than one (absent = 1).
 *                     Memory follows use: at most one member per millisecond, whatever the
 *                     limit, and at low rates no more than one member per admission
 *   P{A}:s        concurrency leases: sorted set, score = lease expiry, member = ticket id
 *   P{A}:m        money: hash day, spent (today), bal (prepaid balance), resv (sum of reservations), credited,
 *                 src (1 once the money was read from a shared ledger: with one, a script that finds
 *                 no src answers 'restore', and the instance rebuilds the hash from the ledger, once)
 *   P{A}:r        reservations: hash ticket id -> micro-dollars (returned when a lease expires)
 *   P{A}:kwt:K, P{A}:kwn:K  per-key RPM window of key K;  P{A}:ks:K  per-key leases of key K
 *   P{A}:i:X      Idempotency-Key X in flight: string = ticket id, expires with the lease
 *   P{A}:c:E      admin credit E applied (E: its Idempotency-Key, or its entry id); expires after 8 days
 */

const PRELUDE = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local day = math.floor(now / 86400000)
local SAFE = 9007199254740991

-- An argument that must be an integer in [lo, hi]; nil otherwise (checked before any write).
local function int(v, lo, hi)
  if type(v) ~= 'string' or #v > 17 or not string.match(v, '^%-?%d+$') then return nil end
  local n = tonumber(v)
  if n == nil or n < lo or n > hi then return nil end
  return n
end
local function flag(v)
  if v == '1' then return true elseif v == '0' then return false end
  return nil
end
local function bad(name)
  return redis.error_reply('ERR model-gateway: invalid argument ' .. name)
end
local function num(v)
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return 0 end
  return n
end
-- Adds to a money field, saturating at +-(2^53 - 1); returns the new value.
local function add(key, field, delta)
  local n = num(redis.call('HGET', key, field)) + delta
  if n > SAFE then n = SAFE elseif n < -SAFE then n = -SAFE end
  redis.call('HSET', key, field, string.format('%.0f', n))
  return n
end
-- With a shared ledger (flag 1), money not yet read from it (Redis lost it, or never had it).
local function unsourced(needsrc, m)
  return needsrc and redis.call('HGET', m, 'src') ~= '1'
end
-- Leases of a crashed instance run out: drop them and give their reservations back.
local function expireLeases(s, m, r)
  local expired = redis.call('ZRANGEBYSCORE', s, '-inf', now)
  if #expired == 0 then return end
  redis.call('ZREMRANGEBYSCORE', s, '-inf', now)
  local back = 0
  for _, tid in ipairs(expired) do
    local amt = redis.call('HGET', r, tid)
    if amt then
      redis.call('HDEL', r, tid)
      back = back + num(amt)
    end
  end
  if back > 0 then add(m, 'resv', -back) end
end
`;

/**
 * KEYS: wt wn s m r kwt kwn ks i.
 * ARGV: id rpm conc krpm kconc haskey cap prepaid estimate lease hasidem instant needsrc
 * (limits and the estimate are -1 for "none").
 */
export const ADMIT = `${PRELUDE}
local id = ARGV[1]
local rpm, conc = int(ARGV[2], -1, SAFE), int(ARGV[3], -1, SAFE)
local krpm, kconc = int(ARGV[4], -1, SAFE), int(ARGV[5], -1, SAFE)
local haskey = flag(ARGV[6])
local cap, prepaid, est = int(ARGV[7], -1, SAFE), flag(ARGV[8]), int(ARGV[9], -1, SAFE)
local lease = int(ARGV[10], 1, 86400000)
local hasidem, instant, needsrc = flag(ARGV[11]), flag(ARGV[12]), flag(ARGV[13])
if type(id) ~= 'string' or id == '' then return bad('id') end
if rpm == nil then return bad('rpm') end
if conc == nil then return bad('concurrency') end
if krpm == nil then return bad('key rpm') end
if kconc == nil then return bad('key concurrency') end
if cap == nil then return bad('cap') end
if est == nil then return bad('estimate') end
if lease == nil then return bad('lease') end
if haskey == nil or prepaid == nil or hasidem == nil or instant == nil or needsrc == nil then return bad('flag') end
if est >= 0 and unsourced(needsrc, KEYS[4]) then return {'restore', 0, 0} end

expireLeases(KEYS[3], KEYS[4], KEYS[5])
if haskey then redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now) end

if hasidem and redis.call('EXISTS', KEYS[9]) == 1 then return {'idempotency_conflict', 0, 0} end

if est >= 0 then
  local m = redis.call('HMGET', KEYS[4], 'day', 'spent', 'bal', 'resv')
  local spent = num(m[2])
  if num(m[1]) ~= day then spent = 0 end
  local resv = num(m[4])
  if cap >= 0 and spent + resv >= cap then return {'daily_cap_exceeded', 0, (day + 1) * 86400000} end
  if prepaid and num(m[3]) - resv <= 0 then return {'insufficient_balance', 0, 0} end
  -- Reservations stay a safe integer (the memory store refuses the same way).
  if resv + est > SAFE then
    if cap >= 0 then return {'daily_cap_exceeded', 0, (day + 1) * 86400000} end
    return {'insufficient_balance', 0, 0}
  end
end

-- Milliseconds until one more admission fits in a window (expired pairs are dropped first).
local function rpmwait(wt, wn, limit)
  if limit < 0 then return 0 end
  if limit == 0 then return 60000 end
  local edge = now - 60000
  local total = num(redis.call('HGET', wn, 'n'))
  local gone = redis.call('ZRANGEBYSCORE', wt, '-inf', edge)
  if #gone > 0 then
    for i = 1, #gone, 1000 do
      local last = math.min(i + 999, #gone)
      local counts = redis.call('HMGET', wn, unpack(gone, i, last))
      for j = 1, #counts do total = total - (counts[j] and num(counts[j]) or 1) end
      redis.call('HDEL', wn, unpack(gone, i, last))
    end
    redis.call('ZREMRANGEBYSCORE', wt, '-inf', edge)
    if total < 0 then total = 0 end
    redis.call('HSET', wn, 'n', string.format('%.0f', total))
  end
  if total < limit then return 0 end
  -- The oldest (total - limit + 1) admissions must leave before the next one fits.
  local leaving = total - limit + 1
  local from = 0
  while true do
    local page = redis.call('ZRANGE', wt, from, from + 99, 'WITHSCORES')
    if #page == 0 then return 60000 end
    for j = 1, #page, 2 do
      local c = redis.call('HGET', wn, page[j])
      leaving = leaving - (c and num(c) or 1)
      if leaving <= 0 then return tonumber(page[j + 1]) + 60000 - now end
    end
    from = from + 100
  end
end
local function rpmrecord(wt, wn)
  local ms = string.format('%.0f', now)
  -- A millisecond's first admission is its member alone; the second gives it a count.
  if redis.call('ZADD', wt, 'NX', now, ms) == 0 then
    if redis.call('HSETNX', wn, ms, 2) == 0 then redis.call('HINCRBY', wn, ms, 1) end
  end
  redis.call('HINCRBY', wn, 'n', 1)
  redis.call('PEXPIRE', wt, 60000)
  redis.call('PEXPIRE', wn, 60000)
end

local wait = rpmwait(KEYS[1], KEYS[2], rpm)
if haskey then wait = math.max(wait, rpmwait(KEYS[6], KEYS[7], krpm)) end
if wait > 0 then return {'rate_limit_exceeded', wait, 0} end

if conc >= 0 and redis.call('ZCARD', KEYS[3]) >= conc then return {'concurrency_limit_exceeded', 1000, 0} end
if haskey and kconc >= 0 and redis.call('ZCARD', KEYS[8]) >= kconc then return {'concurrency_limit_exceeded', 1000, 0} end

-- Every check passed: only now take anything.
if rpm > 0 then rpmrecord(KEYS[1], KEYS[2]) end
if haskey and krpm > 0 then rpmrecord(KEYS[6], KEYS[7]) end
if not instant then
  -- No expiry on the lease set: its reservations must come back through expireLeases.
  redis.call('ZADD', KEYS[3], now + lease, id)
  if haskey then
    redis.call('ZADD', KEYS[8], now + lease, id)
    redis.call('PEXPIRE', KEYS[8], lease * 2)
  end
  if hasidem then redis.call('SET', KEYS[9], id, 'PX', lease) end
  if est > 0 then
    redis.call('HSET', KEYS[5], id, string.format('%.0f', est))
    add(KEYS[4], 'resv', est)
  end
end
return {'ok', 0, 0}
`;

/**
 * Turns a ticket's reservation into its charge; holds on to its slot and idempotency key.
 * KEYS: m r. ARGV: id cost prepaid needsrc. Returns the balance after (prepaid) or 0, or 'restore'.
 */
export const SETTLE = `${PRELUDE}
local id = ARGV[1]
local cost, prepaid, needsrc = int(ARGV[2], 0, SAFE), flag(ARGV[3]), flag(ARGV[4])
if type(id) ~= 'string' or id == '' then return bad('id') end
if cost == nil then return bad('cost') end
if prepaid == nil or needsrc == nil then return bad('flag') end
if cost > 0 and unsourced(needsrc, KEYS[1]) then return 'restore' end
local amt = redis.call('HGET', KEYS[2], id)
if amt then
  redis.call('HDEL', KEYS[2], id)
  add(KEYS[1], 'resv', -num(amt))
end
if cost > 0 then
  if num(redis.call('HGET', KEYS[1], 'day')) ~= day then redis.call('HSET', KEYS[1], 'day', day, 'spent', 0) end
  add(KEYS[1], 'spent', cost)
  if prepaid then add(KEYS[1], 'bal', -cost) end
end
return num(redis.call('HGET', KEYS[1], 'bal'))
`;

/**
 * Gives back a ticket's slot, key slot and idempotency key, and its reservation if it was
 * never settled. KEYS: s m r ks i. ARGV: id haskey hasidem.
 */
export const RELEASE = `${PRELUDE}
local id = ARGV[1]
local haskey, hasidem = flag(ARGV[2]), flag(ARGV[3])
if type(id) ~= 'string' or id == '' then return bad('id') end
if haskey == nil or hasidem == nil then return bad('flag') end
redis.call('ZREM', KEYS[1], id)
if haskey then redis.call('ZREM', KEYS[4], id) end
if hasidem and redis.call('GET', KEYS[5]) == id then redis.call('DEL', KEYS[5]) end
local amt = redis.call('HGET', KEYS[3], id)
if amt then
  redis.call('HDEL', KEYS[3], id)
  add(KEYS[2], 'resv', -num(amt))
end
return 1
`;

/** Extends the leases of a live ticket. KEYS: s ks i. ARGV: id lease haskey hasidem. */
export const RENEW = `${PRELUDE}
if type(ARGV[1]) ~= 'string' or ARGV[1] == '' then return bad('id') end
local lease = int(ARGV[2], 1, 86400000)
local haskey, hasidem = flag(ARGV[3]), flag(ARGV[4])
if lease == nil then return bad('lease') end
if haskey == nil or hasidem == nil then return bad('flag') end
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
if haskey and redis.call('ZADD', KEYS[2], 'XX', 'CH', now + lease, ARGV[1]) == 1 then redis.call('PEXPIRE', KEYS[2], lease * 2) end
if hasidem and redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('PEXPIRE', KEYS[3], lease) end
return 1
`;

/**
 * Adds credit. KEYS: m c. ARGV: amount mode token. Mode 'once': the one-time initial credit,
 * given only if the account never had it; `credited` holds the token of the attempt that gave
 * it, so a retry of that attempt (its first answer lost to a timeout) learns it was given and
 * records it. Mode 'id': an admin credit, applied once per credit (key c: its Idempotency-Key,
 * or its entry id); it does not touch `credited`. Returns {credited (1/0), balance}, or
 * 'restore'. ARGV[4]: needsrc.
 */
export const CREDIT = `${PRELUDE}
local amount, needsrc = int(ARGV[1], 0, SAFE), flag(ARGV[4])
if amount == nil then return bad('amount') end
if needsrc == nil then return bad('flag') end
if unsourced(needsrc, KEYS[1]) then return 'restore' end
if ARGV[2] == 'once' then
  local token = ARGV[3]
  if type(token) ~= 'string' or token == '' then return bad('token') end
  if redis.call('HSETNX', KEYS[1], 'credited', token) == 0 then
    local bal = num(redis.call('HGET', KEYS[1], 'bal'))
    if redis.call('HGET', KEYS[1], 'credited') == token then return {1, bal} end
    return {0, bal}
  end
elseif ARGV[2] == 'id' then
  -- Kept 8 days: longer than the ledger remembers credits to give again (7), whatever the clocks.
  -- KEYS[3], when given: the name the same credit had before (its entry id), also 'applied'.
  if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then return {0, num(redis.call('HGET', KEYS[1], 'bal'))} end
  if not redis.call('SET', KEYS[2], 1, 'NX', 'PX', 691200000) then return {0, num(redis.call('HGET', KEYS[1], 'bal'))} end
else
  return bad('mode')
end
return {1, add(KEYS[1], 'bal', amount)}
`;

/** KEYS: m s r. ARGV: needsrc. Returns {bal, spent today, resv, in flight, now}, or 'restore'. */
export const SNAPSHOT = `${PRELUDE}
local needsrc = flag(ARGV[1])
if needsrc == nil then return bad('flag') end
if unsourced(needsrc, KEYS[1]) then return 'restore' end
expireLeases(KEYS[2], KEYS[1], KEYS[3])
local m = redis.call('HMGET', KEYS[1], 'day', 'spent', 'bal', 'resv')
local spent = 0
if num(m[1]) == day then spent = num(m[2]) end
return {num(m[3]), spent, num(m[4]), redis.call('ZCARD', KEYS[2]), now}
`;

/**
 * Sets an account's money from the shared ledger, unless another instance did first (src
 * set): once, atomically. Reservations of calls in flight are kept. The day's spend counts
 * only if it is Redis's today. The admin credits the ledger already holds are marked applied
 * (KEYS[2..]: their credit markers), so giving them again at start adds nothing. KEYS: m, markers.
 * ARGV: bal day spent credited. Returns 1 if it set it.
 */
export const RESTORE = `${PRELUDE}
local bal, d, spent, credited = int(ARGV[1], -SAFE, SAFE), int(ARGV[2], 0, SAFE), int(ARGV[3], 0, SAFE), flag(ARGV[4])
if bal == nil then return bad('balance') end
if d == nil then return bad('day') end
if spent == nil then return bad('spent') end
if credited == nil then return bad('flag') end
if redis.call('HGET', KEYS[1], 'src') == '1' then return 0 end
if d ~= day then spent = 0 end
redis.call('HSET', KEYS[1], 'bal', string.format('%.0f', bal), 'day', day, 'spent', string.format('%.0f', spent), 'src', '1')
if credited then redis.call('HSETNX', KEYS[1], 'credited', 'ledger') end
for i = 2, #KEYS do redis.call('SET', KEYS[i], 1, 'NX', 'PX', 691200000) end
return 1
`;
