-- The Hold, a start (unless count_start is "0") and a slot in one atomic step (RedisCounters).
-- KEYS: 1 running zset, 2 waiting zset (score: arrival), 3 waiting leases zset, 4 starts zset,
--       5 arrival sequence, 6 holds zset (all holds of the deployment), 7 this ticket's hold hash
-- ARGV: 1 ticket, 2 lease_ms, 3 max_running, 4 max_waiting, 5 starts_per_minute,
--       6 prompt_tokens, 7 choices, 8 max_tokens, 9 hold key prefix, 10 number of budget lines,
--       11 count_start ("1": check and take a start; "0": a job, which took it at submit),
--       12 allow_clamp ("1": lower max_tokens to what fits; "0": a job, refused unless all fits),
--       then per line: counter (no period), granularity (month|day), kind, limit, name
-- Returns {"ok", applied, "run"|"wait"} | {"budget", name, fits} | {"rate", retry_ms} |
--   {"full", retry_ms} | {"seed", counter...} (counters Redis does not hold: seed them, call again)
-- Budget counters carry the UTC period of the server's clock, so they reset without any job.

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ticket = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local prompt = tonumber(ARGV[6])
local choices = tonumber(ARGV[7])
local max_tokens = tonumber(ARGV[8])
local count_start = ARGV[11] == '1'
local allow_clamp = ARGV[12] == '1'

local function civil(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m, d
end

-- An activation unit ('requests') stays used once the engine worked on the request.
local function reservation(kind, p, o)
  if kind == 'requests' then return (p + o > 0) and 1 or 0 end
  if kind == 'input' then return p end
  if kind == 'output' then return o end
  return p + o
end

-- Expired holds of any key settle at the usage their holder last reported.
local expired = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now_ms, 'LIMIT', 0, 50)
for _, old in ipairs(expired) do
  local hold_key = ARGV[9] .. old
  local fields = redis.call('HGETALL', hold_key)
  local h = {}
  for i = 1, #fields, 2 do h[fields[i]] = fields[i + 1] end
  local pp = tonumber(h['pp'] or '0')
  local po = tonumber(h['po'] or '0')
  for name, value in pairs(h) do
    if string.sub(name, 1, 2) == 'c:' then
      local counter = string.sub(name, 3)
      local reserved = tonumber(value)
      local charged = math.min(reserved, reservation(h['k:' .. counter], pp, po))
      redis.call('DECRBY', counter, reserved - charged)
      redis.call('DECRBY', counter .. '|held', reserved)
    end
  end
  redis.call('DEL', hold_key)
  redis.call('ZREM', KEYS[6], old)
end

-- Expired slot and queue leases belong to processes that stopped renewing them.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms)
for _, old in ipairs(gone) do
  redis.call('ZREM', KEYS[2], old)
  redis.call('ZREM', KEYS[3], old)
end

local y, m, d = civil(math.floor(tonumber(now[1]) / 86400))
local month = string.format('%04d-%02d', y, m)
local day = string.format('%04d-%02d-%02d', y, m, d)

local n_lines = tonumber(ARGV[10])
local lines = {}
local missing = {}
local applied = max_tokens
for i = 0, n_lines - 1 do
  local base = 13 + i * 5
  local gran = ARGV[base + 1]
  local line = {
    counter = ARGV[base] .. ':' .. (gran == 'day' and day or month),
    gran = gran, kind = ARGV[base + 2], limit = tonumber(ARGV[base + 3]), name = ARGV[base + 4],
  }
  local settled = redis.call('GET', line.counter)
  if not settled then missing[#missing + 1] = line.counter end
  local available = line.limit - tonumber(settled or '0')
  local fits
  if line.kind == 'requests' then
    fits = (available >= 1) and max_tokens or 0
  elseif line.kind == 'input' then
    fits = (prompt <= available) and max_tokens or 0
  elseif line.kind == 'output' then
    fits = math.floor(math.max(0, available) / choices)
  else
    fits = math.floor(math.max(0, available - prompt) / choices)
  end
  -- The first budget short of the full max_tokens refuses a request that may not be clamped.
  local short = fits < 1 or (not allow_clamp and fits < max_tokens)
  if short and #missing == 0 then return {'budget', line.name, fits} end
  if fits < applied then applied = fits end
  lines[#lines + 1] = line
end
-- Nothing is decided on a counter Redis lost or never had: the caller starts it from SQL first.
if #missing > 0 then
  return {'seed', unpack(missing)}
end

if count_start then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_ms - 60000)
  if redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[5]) then
    local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
    return {'rate', tonumber(oldest[2]) + 60000 - now_ms + 1}
  end
end

local running = redis.call('ZCARD', KEYS[1])
local waiting = redis.call('ZCARD', KEYS[2])
local state
if running < tonumber(ARGV[3]) and waiting == 0 then
  state = 'run'
elseif waiting < tonumber(ARGV[4]) then
  state = 'wait'
else
  return {'full', 1000}
end

if count_start then
  redis.call('ZADD', KEYS[4], now_ms, ticket)
  redis.call('PEXPIRE', KEYS[4], 61000)
end
if state == 'run' then
  redis.call('ZADD', KEYS[1], now_ms + lease_ms, ticket)
else
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[5]), ticket)
  redis.call('ZADD', KEYS[3], now_ms + lease_ms, ticket)
  redis.call('PEXPIRE', KEYS[2], lease_ms * 4)
  redis.call('PEXPIRE', KEYS[3], lease_ms * 4)
end
redis.call('PEXPIRE', KEYS[1], lease_ms * 4)

local output = choices * applied
local hold = {'pp', 0, 'po', 0}
for _, line in ipairs(lines) do
  local amount = (line.kind == 'requests') and 1 or reservation(line.kind, prompt, output)
  redis.call('INCRBY', line.counter, amount)
  -- What requests in flight hold of the counter (GET /v1/usage); settle takes it back.
  redis.call('INCRBY', line.counter .. '|held', amount)
  -- Outlive the period (a month is at most 31 days) so late settles still find the counter.
  redis.call('PEXPIRE', line.counter, (line.gran == 'day' and 3 or 62) * 86400000)
  redis.call('PEXPIRE', line.counter .. '|held', (line.gran == 'day' and 3 or 62) * 86400000)
  hold[#hold + 1] = 'c:' .. line.counter
  hold[#hold + 1] = amount
  hold[#hold + 1] = 'k:' .. line.counter
  hold[#hold + 1] = line.kind
end
redis.call('HSET', KEYS[7], unpack(hold))
redis.call('ZADD', KEYS[6], now_ms + lease_ms, ticket)
return {'ok', applied, state}
