/**
 * Lua run inside Redis: each admission is one EVALSHA that checks everything in the
 * contract's order and writes only when every check passes; settlement and release are
 * another. All keys of an account share the hash tag `{accountId}`, so the scripts also run
 * on Redis Cluster. Time is Redis's own (TIME), so instances with skewed clocks agree.
 *
 * Keys of account A under prefix P:
 *   P{A}:w        RPM window: sorted set, score = admission time (ms), member = unique id
 *   P{A}:s        concurrency leases: sorted set, score = lease expiry, member = ticket id
 *   P{A}:m        money: hash day, spent (today), bal (prepaid balance), resv (sum of reservations), credited
 *   P{A}:r        reservations: hash ticket id -> micro-dollars
 *   P{A}:kw:K     per-key RPM window of key K;  P{A}:ks:K  per-key leases of key K
 *   P{A}:i:X      Idempotency-Key X in flight: string = ticket id, expires with the lease
 */

const NOW = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local day = math.floor(now / 86400000)
`;

/** KEYS: w s m r kw ks i. ARGV: id rpm conc krpm kconc haskey cap prepaid estimate lease hasidem instant. */
export const ADMIT = `${NOW}
local id = ARGV[1]
local rpm, conc, krpm, kconc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local haskey = ARGV[6] == '1'
local cap, prepaid, est = tonumber(ARGV[7]), ARGV[8] == '1', tonumber(ARGV[9])
local lease = tonumber(ARGV[10])
local hasidem = ARGV[11] == '1'
local instant = ARGV[12] == '1'

-- Leases of a crashed instance run out: drop them and give their reservations back.
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, tid in ipairs(expired) do
    local amt = redis.call('HGET', KEYS[4], tid)
    if amt then
      redis.call('HDEL', KEYS[4], tid)
      redis.call('HINCRBY', KEYS[3], 'resv', -tonumber(amt))
    end
  end
end
if haskey then redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now) end

if hasidem and redis.call('EXISTS', KEYS[7]) == 1 then return {'idempotency_conflict', 0, 0} end

if est >= 0 then
  local m = redis.call('HMGET', KEYS[3], 'day', 'spent', 'bal', 'resv')
  local spent = tonumber(m[2]) or 0
  if tonumber(m[1]) ~= day then spent = 0 end
  local resv = tonumber(m[4]) or 0
  if cap >= 0 and spent + resv >= cap then return {'daily_cap_exceeded', 0, (day + 1) * 86400000} end
  if prepaid and (tonumber(m[3]) or 0) - resv <= 0 then return {'insufficient_balance', 0, 0} end
end

local function rpmwait(key, limit)
  if limit < 0 then return 0 end
  if limit == 0 then return 60000 end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - 60000)
  local n = redis.call('ZCARD', key)
  if n < limit then return 0 end
  local oldest = redis.call('ZRANGE', key, n - limit, n - limit, 'WITHSCORES')
  return tonumber(oldest[2]) + 60000 - now
end
local wait = rpmwait(KEYS[1], rpm)
if haskey then wait = math.max(wait, rpmwait(KEYS[5], krpm)) end
if wait > 0 then return {'rate_limit_exceeded', wait, 0} end

if conc >= 0 and redis.call('ZCARD', KEYS[2]) >= conc then return {'concurrency_limit_exceeded', 1000, 0} end
if haskey and kconc >= 0 and redis.call('ZCARD', KEYS[6]) >= kconc then return {'concurrency_limit_exceeded', 1000, 0} end

-- Every check passed: only now write.
if rpm > 0 then
  redis.call('ZADD', KEYS[1], now, id)
  redis.call('PEXPIRE', KEYS[1], 60000)
end
if haskey and krpm > 0 then
  redis.call('ZADD', KEYS[5], now, id)
  redis.call('PEXPIRE', KEYS[5], 60000)
end
if not instant then
  redis.call('ZADD', KEYS[2], now + lease, id)
  redis.call('PEXPIRE', KEYS[2], lease * 2)
  if haskey then
    redis.call('ZADD', KEYS[6], now + lease, id)
    redis.call('PEXPIRE', KEYS[6], lease * 2)
  end
  if hasidem then redis.call('SET', KEYS[7], id, 'PX', lease) end
  if est > 0 then
    redis.call('HSET', KEYS[4], id, est)
    redis.call('HINCRBY', KEYS[3], 'resv', est)
  end
end
return {'ok', 0, 0}
`;

/**
 * Settles and releases a ticket in one round trip. KEYS: s m r ks i. ARGV: id cost prepaid haskey hasidem.
 * Returns the balance after (prepaid) or 0.
 */
export const FINISH = `${NOW}
local id = ARGV[1]
local cost = tonumber(ARGV[2])
redis.call('ZREM', KEYS[1], id)
if ARGV[4] == '1' then redis.call('ZREM', KEYS[4], id) end
if ARGV[5] == '1' and redis.call('GET', KEYS[5]) == id then redis.call('DEL', KEYS[5]) end
local amt = redis.call('HGET', KEYS[3], id)
if amt then
  redis.call('HDEL', KEYS[3], id)
  redis.call('HINCRBY', KEYS[2], 'resv', -tonumber(amt))
end
if cost > 0 then
  if tonumber(redis.call('HGET', KEYS[2], 'day')) ~= day then redis.call('HSET', KEYS[2], 'day', day, 'spent', 0) end
  redis.call('HINCRBY', KEYS[2], 'spent', cost)
  if ARGV[3] == '1' then redis.call('HINCRBY', KEYS[2], 'bal', -cost) end
end
return tonumber(redis.call('HGET', KEYS[2], 'bal')) or 0
`;

/** Extends the leases of a live ticket. KEYS: s ks i. ARGV: id lease haskey hasidem. */
export const RENEW = `${NOW}
local lease = tonumber(ARGV[2])
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease, ARGV[1]) == 1 then redis.call('PEXPIRE', KEYS[1], lease * 2) end
if ARGV[3] == '1' and redis.call('ZADD', KEYS[2], 'XX', 'CH', now + lease, ARGV[1]) == 1 then redis.call('PEXPIRE', KEYS[2], lease * 2) end
if ARGV[4] == '1' and redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('PEXPIRE', KEYS[3], lease) end
return 1
`;

/** KEYS: m. ARGV: amount once. Adds credit (once=1: only if never credited before). Returns {credited, balance}. */
export const CREDIT = `
if ARGV[2] == '1' and redis.call('HSETNX', KEYS[1], 'credited', 1) == 0 then
  return {0, tonumber(redis.call('HGET', KEYS[1], 'bal')) or 0}
end
redis.call('HSET', KEYS[1], 'credited', 1)
return {1, redis.call('HINCRBY', KEYS[1], 'bal', tonumber(ARGV[1]))}
`;

/** KEYS: m s. Returns {bal, spent today, resv, in flight, now}. */
export const SNAPSHOT = `${NOW}
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local m = redis.call('HMGET', KEYS[1], 'day', 'spent', 'bal', 'resv')
local spent = 0
if tonumber(m[1]) == day then spent = tonumber(m[2]) or 0 end
return {tonumber(m[3]) or 0, spent, tonumber(m[4]) or 0, redis.call('ZCARD', KEYS[2]), now}
`;
