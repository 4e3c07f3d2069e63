/**
 * Lua run inside Redis. The hot path is one script, BATCH: the admissions (each checks
 * everything in the contract's order and writes only when every check passes), settlements and
 * releases one instance made for one account in one event-loop turn, in one call (FCALL of it
 * as a Redis function where Redis can, EVALSHA otherwise). Credits,
 * snapshots, lease renewals and rebuilds have scripts of their own. All keys of an account
 * share the hash tag `{accountId}`, and a script call never mixes accounts, so the scripts
 * also run on Redis Cluster. Time is Redis's own (TIME), so instances with skewed clocks agree.
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
 *   P{A}:x:T      ticket T's lease ran out: 'r' (its reservation was taken back, and no settlement
 *                 has come since) or 'l' (none left: a settlement took it); see resettle. Each note
 *                 expires after a day. (Named from the x key a script is given: the same hash tag,
 *                 so the same Cluster slot; found in review, one hash of notes either grew for
 *                 ever or, bounded, lost the notes that mattered)
 *   P{A}:kwt:K, P{A}:kwn:K  per-key RPM window of key K;  P{A}:ks:K  per-key leases of key K
 *   P{A}:i:X      Idempotency-Key X in flight: string = ticket id, expires with the lease
 *   P{A}:c:E      admin credit E applied (E: its Idempotency-Key, or its entry id); expires after 8 days
 */

/** Redis's clock: \`now\` in ms and its UTC day, read once per call (the helpers below use them). */
const CLOCK = `
local t = redis.call('TIME')
now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
day = math.floor(now / 86400000)
`;

const HELPERS = `
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
-- Leases of a crashed instance run out: drops them and their reservations; returns the sum
-- of those reservations, which the caller gives back to the money hash's resv. Each is noted
-- in x: its instance may have been cut off, not crashed, and come back to send its settlement
-- again (resettle). An 'r' note stays 'r' when the lease, taken again, runs out again.
local function expireLeases(s, r, x)
  local expired = redis.call('ZRANGEBYSCORE', s, '-inf', now)
  if #expired == 0 then return 0 end
  redis.call('ZREMRANGEBYSCORE', s, '-inf', now)
  local back = 0
  for _, tid in ipairs(expired) do
    local amt = redis.call('HGET', r, tid)
    if amt then
      redis.call('HDEL', r, tid)
      back = back + num(amt)
      redis.call('SET', x .. ':' .. tid, 'r', 'PX', 86400000)
    else
      redis.call('SET', x .. ':' .. tid, 'l', 'PX', 86400000, 'NX')
    end
  end
  return back
end
`;

const PRELUDE = `local now, day${HELPERS}${CLOCK}`;

/**
 * Extends the leases of a live ticket. KEYS: s ks i r m x. ARGV: id lease haskey hasidem reserved needsrc.
 * A lease that is gone while its call still runs (this instance could not reach Redis for a
 * whole lease, and another admission took the lease back, as a crashed instance's; or Redis
 * lost its data) is taken again: the slot, the reservation it still holds (ARGV[5]: 0 once its
 * settlement went out, which may have taken it) and the Idempotency-Key unless another call
 * holds it now (found in review: the running call was never counted again, so concurrency, a
 * cap or a balance could be passed by it). The instance never sends a renewal again (after a
 * NOSCRIPT, say), so none reaches Redis after its ticket's release. With a shared ledger whose
 * money Redis lost (no src), nothing is taken and 'restore' answered: the instance reads the
 * account's money from the ledger and renews again, except a call whose settlement went out
 * (a settlement sent again must find the lease gone as it is: see resettle).
 */
export const RENEW = `${PRELUDE}
local id = ARGV[1]
if type(id) ~= 'string' or id == '' then return bad('id') end
local lease = int(ARGV[2], 1, 86400000)
local haskey, hasidem = flag(ARGV[3]), flag(ARGV[4])
local est = int(ARGV[5], 0, SAFE)
local needsrc = flag(ARGV[6])
if lease == nil then return bad('lease') end
if haskey == nil or hasidem == nil or needsrc == nil then return bad('flag') end
if est == nil then return bad('est') end
if unsourced(needsrc, KEYS[5]) then return 'restore' end
if redis.call('ZADD', KEYS[1], now + lease, id) == 1 and est > 0 and redis.call('HSETNX', KEYS[4], id, est) == 1 then
  add(KEYS[5], 'resv', est)
  redis.call('DEL', KEYS[6] .. ':' .. id) -- reserved again: its settlement will find it
end
if haskey then
  redis.call('ZADD', KEYS[2], now + lease, id)
  redis.call('PEXPIRE', KEYS[2], lease * 2)
end
if hasidem then
  local holder = redis.call('GET', KEYS[3])
  if holder == id then redis.call('PEXPIRE', KEYS[3], lease)
  elseif not holder then redis.call('SET', KEYS[3], id, 'PX', lease) end
end
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

/** KEYS: m s r x. ARGV: needsrc. Returns {bal, spent today, resv, in flight, now}, or 'restore'. */
export const SNAPSHOT = `${PRELUDE}
local needsrc = flag(ARGV[1])
if needsrc == nil then return bad('flag') end
if unsourced(needsrc, KEYS[1]) then return 'restore' end
local back = expireLeases(KEYS[2], KEYS[3], KEYS[4])
if back > 0 then add(KEYS[1], 'resv', -back) end
local m = redis.call('HMGET', KEYS[1], 'day', 'spent', 'bal', 'resv')
local spent = 0
if num(m[1]) >= day then spent = num(m[2]) end
return {num(m[3]), spent, num(m[4]), redis.call('ZCARD', KEYS[2]), now}
`;

/**
 * Sets an account's money from the shared ledger, unless another instance did first (src
 * set): once, atomically. Reservations of calls in flight are kept: \`resv\` is summed again
 * from the reservations hash (the money hash alone may have been lost, and its settlements will
 * give those back). The day's spend counts only if it is Redis's today. The admin credits the
 * ledger already holds are marked applied (KEYS[3..]: their credit markers), so giving them
 * again at start adds nothing. KEYS: m, r, markers. ARGV: bal day spent credited. Returns 1 if
 * it set it.
 */
export const RESTORE = `${PRELUDE}
local bal, d, spent, credited = int(ARGV[1], -SAFE, SAFE), int(ARGV[2], 0, SAFE), int(ARGV[3], 0, SAFE), flag(ARGV[4])
if bal == nil then return bad('balance') end
if d == nil then return bad('day') end
if spent == nil then return bad('spent') end
if credited == nil then return bad('flag') end
if redis.call('HGET', KEYS[1], 'src') == '1' then return 0 end
if d < day then spent = 0 end
local resv = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do resv = resv + num(v) end
if resv > SAFE then resv = SAFE end
redis.call('HSET', KEYS[1], 'bal', string.format('%.0f', bal), 'day', math.max(d, day), 'spent', string.format('%.0f', spent),
  'resv', string.format('%.0f', resv), 'src', '1')
if credited then redis.call('HSETNX', KEYS[1], 'credited', 'ledger') end
for i = 3, #KEYS do redis.call('SET', KEYS[i], 1, 'NX', 'PX', 691200000) end
return 1
`;

/**
 * The admissions, settlements and releases one instance made for one account in one turn of its
 * event loop, in one call, in the order they were made: each op decides exactly as it would in
 * a script call of its own (they were three scripts, ADMIT, SETTLE and RELEASE, before the
 * batching). An op checks its own arguments before its first write, and a bad
 * op (or one whose Redis call fails) answers its own error without affecting the others. What the ops share is done once per call: TIME (every op sees the same `now`), the
 * expiry of the account's leases and of each RPM window, and the reads and writes of the money
 * hash, of the windows' counts and of their expiries, which are kept in Lua and written once at
 * the end. (With one `now`, that is what the ops would have written one after the other.)
 *
 * KEYS: wt wn s m r x (the account's), then each op's own, as its kind says.
 * ARGV: needsrc lease, then per op its kind and arguments (few and packed: Redis makes a Lua
 * string of every argument, and that, with parsing them, was most of a call's cost):
 *   'a' id "rpm,conc,krpm,kconc,cap" estimate flags   admit. The limits and the estimate are
 *        -1 for "none" (the limits are one argument, the same for every admission of an
 *        account and key, so a call parses them once); flags: 2 characters, prepaid and
 *        instant (an admission that holds nothing, /v1/models), each '0' or '1'. 'ak' when the key has limits (KEYS kwt kwn ks
 *        follow), 'ai' with an Idempotency-Key (KEYS i), 'aki' with both.
 *   's' id cost prepaid reserved   settle: the reservation becomes the charge; slot and key
 *        stay held. `reserved`: what the admission reserved (the gateway sends it back, so the
 *        script need not look it up). 'S': the same settlement sent again (its first answer was
 *        lost): applied only if it was not already (see resettle).
 *   'r' id reserved       release: slot, idempotency key, and a reservation never settled
 *        (`reserved` 0 when its settlement answered: nothing left to give back);
 *        'rk' (KEYS ks), 'ri' (KEYS i), 'rki' (KEYS ks i) as for an admission
 *   'u' id estimate cap prepaid   raise: the reservation becomes `estimate` (the provider
 *        counted the input above the admission's estimate), checked as an admission is, with
 *        the others' reservations and not its own; checked the same, but nothing written, when
 *        its reservation is gone (its lease ran out: the next renewal takes the raised amount
 *        again; or it was settled). Once a raise was sent, the ticket's settlement and
 *        release send `reserved` -1: the amount is looked up (the raise's answer may not be in).
 * Returns one reply per op, short in the common case (every reply is built by Redis and parsed by
 * the gateway): admit and raise 'ok' or {reason, wait, resetsAt} (reason 'restore' too), settle the
 * balance after it or {'restore'}, release 1; an op that failed: {'error', message}.
 *
 * This is BATCH's code without its call: `batch(KEYS, ARGV)` runs one call. It runs as a
 * Redis function (see batchFunction), or as a script (BATCH, below).
 */
export const BATCH_LIBRARY = `local now, day${HELPERS}
-- A call's state, set again at the start of every call (as a Redis function, the functions
-- below are defined once, when the library loads):
local needsrc, lease, W, N, S, M, R, X -- its arguments, and the account's keys
local money, dirty                  -- the money hash (mget)
local cards                         -- sorted-set sizes, counted once and then kept up to date
local leases, leaseSets             -- the leases this call's admissions took (zadd)
local reserved, reservedIds         -- the reservations they made: id -> amount, and the ids in order
local expired, cleaned              -- the account's leases expired; the keys' sets cleaned
local wins, winlist                 -- RPM windows (window)
local parsed                        -- admissions' limits, parsed (limits)

-- The money hash, read once (on first use) and written once at the end (only what changed).
local function mget(field)
  if money == nil then
    local v = redis.call('HMGET', M, 'day', 'spent', 'bal', 'resv', 'src')
    money = { day = num(v[1]), spent = num(v[2]), bal = num(v[3]), resv = num(v[4]), src = v[5] }
  end
  return money[field]
end
local function mset(field, n)
  mget(field)
  money[field] = n
  dirty[field] = true
end
local function madd(field, delta)
  local n = mget(field) + delta
  if n > SAFE then n = SAFE elseif n < -SAFE then n = -SAFE end
  mset(field, n)
  return n
end
local function nosrc()
  return needsrc and mget('src') ~= '1'
end

-- Leases taken by this call's admissions (all expiring at now + lease), written at the end in
-- one ZADD per set (a redis.call costs more than the command it runs): a lease's id is new (an
-- admission checks), so it is always one more member; card() counts them before they are
-- written, and a release later in the same call takes its lease back before it is.
local function pending(k, id)
  local l = leases[k]
  return l ~= nil and l.at[id] ~= nil
end
local function zadd(k, id)
  local l = leases[k]
  if l == nil then
    l = { ids = {}, at = {}, n = 0 }
    leases[k] = l
    leaseSets[#leaseSets + 1] = k
  end
  local i = #l.ids + 1
  l.ids[i], l.at[id] = id, i
  l.n = l.n + 1
  if cards[k] ~= nil then cards[k] = cards[k] + 1 end
end
local function card(k)
  local c = cards[k]
  if c == nil then
    c = redis.call('ZCARD', k) + (leases[k] and leases[k].n or 0)
    cards[k] = c
  end
  return c
end
local function zrem(k, id)
  local l = leases[k]
  local i = l and l.at[id]
  if i then
    l.ids[i], l.at[id], l.n = false, nil, l.n - 1
    if cards[k] ~= nil then cards[k] = cards[k] - 1 end
    return 1
  end
  local n = redis.call('ZREM', k, id)
  if cards[k] ~= nil then cards[k] = cards[k] - n end
  return n
end

-- Leases of a crashed instance run out (once per call: with one now, a second pass finds nothing).
local function expire()
  if expired then return end
  expired = true
  cards[S] = nil
  local back = expireLeases(S, R, X)
  if back > 0 then madd('resv', -back) end
end
local function expireKey(ks)
  if cleaned[ks] then return end
  cleaned[ks] = true
  redis.call('ZREMRANGEBYSCORE', ks, '-inf', now)
  cards[ks] = nil
end

-- RPM windows: expired pairs dropped once, the total kept in Lua; this call's admissions (all
-- in the millisecond now) are written at the end. A wait that would reach them is 60000 either way.
local function window(wt, wn)
  local w = wins[wt]
  if w then return w end
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
  w = { wt = wt, wn = wn, total = total, rec = 0 }
  wins[wt] = w
  winlist[#winlist + 1] = w
  return w
end
local function rpmwait(wt, wn, limit)
  if limit < 0 then return 0 end
  if limit == 0 then return 60000 end
  local w = window(wt, wn)
  if w.total < limit then return 0 end
  local leaving = w.total - limit + 1
  -- Far over a limit that was lowered: within a minute every admission in the window has left,
  -- an honest wait found without reading the window (each rejection would read up to 60,000
  -- members, and a client refused in a loop would keep Redis busy for every account).
  if leaving > 100 then return 60000 end
  -- The oldest \`leaving\` members hold at least \`leaving\` admissions (a member counts one or
  -- more): one read of them and of their counts. Fewer members: the rest are this call's own.
  local page = redis.call('ZRANGE', wt, 0, leaving - 1, 'WITHSCORES')
  local ids = {}
  for j = 1, #page, 2 do ids[#ids + 1] = page[j] end
  if #ids == 0 then return 60000 end
  local counts = redis.call('HMGET', wn, unpack(ids))
  for i = 1, #ids do
    leaving = leaving - (counts[i] and num(counts[i]) or 1)
    if leaving <= 0 then return tonumber(page[2 * i]) + 60000 - now end
  end
  return 60000
end
local function rpmrecord(wt, wn)
  local w = window(wt, wn)
  w.total = w.total + 1
  w.rec = w.rec + 1
end

-- An admission's five limits in one argument (one pattern match, not five): each an integer
-- of at most 17 characters in [-1, 2^53 - 1]; nil for any that is not. Parsed once per call:
-- the admissions of one account and key carry the same string (a pattern match with its
-- captures costs more than the rest of an admission's checks).
local function limits(v)
  local r = parsed[v]
  if r ~= nil then return r end
  if type(v) ~= 'string' or #v > 89 then return nil end
  r = { string.match(v, '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)$') }
  if #r ~= 5 then return nil end
  for i = 1, 5 do
    local n = #r[i] <= 17 and tonumber(r[i]) or nil
    if n == nil or n < -1 or n > SAFE then return nil end
    r[i] = n
  end
  parsed[v] = r
  return r
end

-- Why a call reserving \`est\` more is refused, given the reservations \`resv\` (a cap is reached,
-- not predicted: its own estimate is not added), or nil.
local function moneyRefusal(resv, est, cap, prepaid)
  local spent = mget('spent')
  if mget('day') < day then spent = 0 end -- a later day (Redis's clock stepped back) keeps its spend
  if cap >= 0 and spent + resv >= cap then return {'daily_cap_exceeded', 0, (day + 1) * 86400000} end
  if prepaid and mget('bal') - resv <= 0 then return {'insufficient_balance', 0, 0} end
  if resv + est > SAFE then
    if cap >= 0 then return {'daily_cap_exceeded', 0, (day + 1) * 86400000} end
    return {'insufficient_balance', 0, 0}
  end
  return nil
end

local function admit(kwt, kwn, ks, ik, haskey, hasidem, id, a_limits, a_est, a_flags)
  -- Ids are new (the instance's prefix and a counter); one already taken in this call is refused.
  if type(id) ~= 'string' or id == '' or pending(S, id) then return bad('id') end
  local l = limits(a_limits)
  if l == nil then return bad('limits') end
  local rpm, conc, krpm, kconc, cap = l[1], l[2], l[3], l[4], l[5]
  local est = int(a_est, -1, SAFE)
  if est == nil then return bad('est') end
  if a_flags ~= '00' and a_flags ~= '01' and a_flags ~= '10' and a_flags ~= '11' then return bad('flag') end
  local prepaid, instant = string.byte(a_flags, 1) == 49, string.byte(a_flags, 2) == 49
  if est >= 0 and nosrc() then return {'restore', 0, 0} end

  expire()
  if haskey then expireKey(ks) end

  if hasidem and redis.call('EXISTS', ik) == 1 then return {'idempotency_conflict', 0, 0} end

  if est >= 0 then
    local refused = moneyRefusal(mget('resv'), est, cap, prepaid)
    if refused then return refused end
  end

  local wait = rpmwait(W, N, rpm)
  if haskey then wait = math.max(wait, rpmwait(kwt, kwn, krpm)) end
  if wait > 0 then return {'rate_limit_exceeded', wait, 0} end

  if conc >= 0 and card(S) >= conc then return {'concurrency_limit_exceeded', 1000, 0} end
  if haskey and kconc >= 0 and card(ks) >= kconc then return {'concurrency_limit_exceeded', 1000, 0} end

  if rpm > 0 then rpmrecord(W, N) end
  if haskey and krpm > 0 then rpmrecord(kwt, kwn) end
  if not instant then
    zadd(S, id)
    if haskey then zadd(ks, id) end
    if hasidem then redis.call('SET', ik, id, 'PX', lease) end
    if est > 0 then
      reserved[id] = est
      reservedIds[#reservedIds + 1] = id
      madd('resv', est)
    end
  end
  return 'ok'
end

-- A reservation given back by its settlement or its release. The op carries what the admission
-- reserved (0 when nothing is left to give: none was made, or the settlement gave it already),
-- so no lookup is needed: one HDEL, whose answer says whether it was still there (a lease that
-- ran out gave it back already). -1: a raised reservation, looked up.
-- Returns false when the reservation was gone already.
local function giveBack(id, est)
  local made = reserved[id]
  if made then -- made earlier in this call: it never reaches Redis
    reserved[id] = nil
    madd('resv', -made)
  elseif est < 0 then
    local amount = redis.call('HGET', R, id)
    if not amount then return false end
    redis.call('HDEL', R, id)
    madd('resv', -num(amount))
  elseif est > 0 then
    if redis.call('HDEL', R, id) == 0 then return false end
    madd('resv', -est)
  end
  return true
end

local function settle(id, a_cost, a_prepaid, a_est)
  local cost, prepaid, est = int(a_cost, 0, SAFE), flag(a_prepaid), int(a_est, -1, SAFE)
  if type(id) ~= 'string' or id == '' then return bad('id') end
  if cost == nil then return bad('cost') end
  if prepaid == nil then return bad('flag') end
  if est == nil then return bad('est') end
  if cost > 0 and nosrc() then return {'restore'} end
  -- Its reservation gone (a lease that ran out took it back): this settlement counts it, so
  -- one sent again must not, whatever else is gone by then (see resettle; found in review: the
  -- note deleted, a resend with the lease gone too was charged again). Rare: no write on the
  -- common path.
  if not giveBack(id, est) then
    redis.call('SET', X .. ':' .. id, 'l', 'PX', 86400000)
  end
  if cost > 0 then
    if mget('day') < day then -- only forward: a clock stepped back across 00:00 must not forget the spend
      mset('day', day)
      mset('spent', 0)
    end
    madd('spent', cost)
    if prepaid then madd('bal', -cost) end
  end
  return mget('bal')
end

-- A settlement sent again because its first answer was lost (or it was never sent): it must
-- count once. While the ticket's lease is held (the instance renews it until the settlement is
-- confirmed), a reservation gone from the hash means a settlement took it: nothing more to do.
-- With the lease gone too (a long outage, or Redis lost its data) it cannot be told: with a
-- shared ledger, whose books Redis's money is rebuilt from after a loss and which holds the
-- call, it is not charged again; without, it is charged. Unless X noted the lease running out:
-- 'r', it took the reservation back, and no settlement has come since (found in review: such
-- a settlement, lost, was never counted in Redis's money): charged; 'l', the reservation was
-- gone already, a settlement took it: not charged again (found in review of that fix: without
-- a shared ledger, charged twice). Nothing reserved: charged, unless the ledger is shared and
-- the lease is gone (the same rule).
local function resettle(id, a_cost, a_prepaid, a_est)
  if type(id) ~= 'string' or id == '' then return bad('id') end
  local cost, prepaid, est = int(a_cost, 0, SAFE), flag(a_prepaid), int(a_est, -1, SAFE)
  if cost == nil then return bad('cost') end
  if prepaid == nil then return bad('flag') end
  if est == nil then return bad('est') end
  if nosrc() then return {'restore'} end
  if est ~= 0 and reserved[id] == nil and redis.call('HEXISTS', R, id) == 0 then
    local note = redis.call('GET', X .. ':' .. id)
    if note == 'l' or (note ~= 'r' and (needsrc or redis.call('ZSCORE', S, id))) then return mget('bal') end
  end
  if est == 0 and needsrc and not pending(S, id) and not redis.call('ZSCORE', S, id) then return mget('bal') end
  return settle(id, a_cost, a_prepaid, a_est)
end

local function release(ks, ik, haskey, hasidem, id, a_est)
  local est = int(a_est, -1, SAFE)
  if type(id) ~= 'string' or id == '' then return bad('id') end
  if est == nil then return bad('est') end
  -- The reservation first: should a later command fail, the lease still runs out by itself.
  giveBack(id, est)
  -- A lease that ran out: its note goes too (rare: no write on the common path).
  if zrem(S, id) == 0 then redis.call('DEL', X .. ':' .. id) end
  if haskey then zrem(ks, id) end
  if hasidem and redis.call('GET', ik) == id then redis.call('DEL', ik) end
  return 1
end

local function raise(id, a_est, a_cap, a_prepaid)
  local est, cap, prepaid = int(a_est, 0, SAFE), int(a_cap, -1, SAFE), flag(a_prepaid)
  if type(id) ~= 'string' or id == '' then return bad('id') end
  if est == nil then return bad('est') end
  if cap == nil then return bad('cap') end
  if prepaid == nil then return bad('flag') end
  if nosrc() then return {'restore', 0, 0} end
  expire()
  local own = reserved[id]
  local held = own ~= nil
  if not held then
    own = redis.call('HGET', R, id)
    held = own ~= false
    own = held and num(own) or 0
  end
  if held and est <= own then return 'ok' end
  local refused = moneyRefusal(mget('resv') - own, est, cap, prepaid)
  if refused then return refused end
  -- No reservation here: its lease ran out (it went back with it; the instance's next renewal
  -- takes the raised amount again, checked now), or a settlement took it. Nothing to write.
  if not held then return 'ok' end
  if reserved[id] then reserved[id] = est else redis.call('HSET', R, id, string.format('%.0f', est)) end
  madd('resv', est - own)
  return 'ok'
end

-- An admission's or release's kind says which of its own keys follow: k, the key's
-- limits (admit: kwt kwn ks; release: ks), and i, its Idempotency-Key.
local HAS = { a = {false, false}, ak = {true, false}, ai = {false, true}, aki = {true, true},
  r = {false, false}, rk = {true, false}, ri = {false, true}, rki = {true, true} }

local function batch(KEYS, ARGV)${CLOCK}
  needsrc, lease = flag(ARGV[1]), int(ARGV[2], 1, 86400000)
  if needsrc == nil then return bad('flag') end
  if lease == nil then return bad('lease') end
  W, N, S, M, R, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
  money, dirty, cards, leases, leaseSets, reserved, reservedIds = nil, {}, {}, {}, {}, {}, {}
  expired, cleaned, wins, winlist, parsed = false, {}, {}, {}, {}

  local out = {}
  local k, a = 7, 3
  while a <= #ARGV do
    local kind = ARGV[a]
    local has = HAS[kind]
    local ok, res
    if kind == 's' or kind == 'S' then
      ok, res = pcall(kind == 's' and settle or resettle, ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
      a = a + 5
    elseif has ~= nil and string.byte(kind, 1) == 97 then -- a
      local haskey, hasidem = has[1], has[2]
      local kwt, kwn, ks, ik
      if haskey then kwt, kwn, ks, k = KEYS[k], KEYS[k + 1], KEYS[k + 2], k + 3 end
      if hasidem then ik, k = KEYS[k], k + 1 end
      ok, res = pcall(admit, kwt, kwn, ks, ik, haskey, hasidem, ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
      a = a + 5
    elseif kind == 'u' then
      ok, res = pcall(raise, ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
      a = a + 5
    elseif has ~= nil then -- r
      local haskey, hasidem = has[1], has[2]
      local ks, ik
      if haskey then ks, k = KEYS[k], k + 1 end
      if hasidem then ik, k = KEYS[k], k + 1 end
      ok, res = pcall(release, ks, ik, haskey, hasidem, ARGV[a + 1], ARGV[a + 2])
      a = a + 3
    else
      -- The framing itself is wrong: nothing more can be read (the ops before it stand).
      ok, res = false, 'ERR model-gateway: invalid argument op'
      a = #ARGV + 1
    end
    if not ok then
      res = {'error', type(res) == 'table' and res.err or tostring(res)}
    elseif type(res) == 'table' and res.err then
      res = {'error', res.err}
    end
    out[#out + 1] = res
  end

  -- What the ops left in Lua, written once.
  for _, set in ipairs(leaseSets) do
    local ids, args = leases[set].ids, {}
    for i = 1, #ids do
      if ids[i] then
        args[#args + 1] = now + lease
        args[#args + 1] = ids[i]
      end
    end
    if #args > 0 then
      redis.call('ZADD', set, unpack(args))
      -- A key's slots expire with their last lease (the account's set lives as long as the account).
      if set ~= S then redis.call('PEXPIRE', set, lease * 2) end
    end
  end
  local res = {}
  for _, id in ipairs(reservedIds) do
    if reserved[id] then
      res[#res + 1] = id
      res[#res + 1] = string.format('%.0f', reserved[id])
    end
  end
  if #res > 0 then redis.call('HSET', R, unpack(res)) end
  local ms = string.format('%.0f', now)
  for _, w in ipairs(winlist) do
    if w.rec > 0 then
      -- A millisecond's first admission is its member alone; more give it a count.
      if redis.call('ZADD', w.wt, 'NX', now, ms) == 1 then
        if w.rec > 1 then redis.call('HSET', w.wn, ms, w.rec) end
      elseif redis.call('HSETNX', w.wn, ms, w.rec + 1) == 0 then
        redis.call('HINCRBY', w.wn, ms, w.rec)
      end
      redis.call('HINCRBY', w.wn, 'n', w.rec)
      redis.call('PEXPIRE', w.wt, 60000)
      redis.call('PEXPIRE', w.wn, 60000)
    end
  end
  if money ~= nil then
    local set = {}
    for _, f in ipairs({'day', 'spent', 'bal', 'resv'}) do
      if dirty[f] then
        set[#set + 1] = f
        set[#set + 1] = string.format('%.0f', money[f])
      end
    end
    if #set > 0 then redis.call('HSET', M, unpack(set)) end
  end
  return out
end
`;

/** BATCH as a script (EVAL / EVALSHA): every call defines its functions again. */
export const BATCH = `${BATCH_LIBRARY}
return batch(KEYS, ARGV)
`;

/**
 * BATCH as a Redis 7 function library (FUNCTION LOAD, then FCALL with its name): its functions
 * are defined once, when the library loads, not at every call. The name carries a hash of the
 * code, so instances of different versions each call their own.
 */
export function batchFunction(hash: string): { name: string; code: string } {
  const name = `mg_batch_${hash}`;
  return { name, code: `#!lua name=${name}\n${BATCH_LIBRARY}\nredis.register_function('${name}', function(keys, args) return batch(keys, args) end)\n` };
}
