-- One start of a key's starts-per-minute window, alone: a job's submit (RedisCounters.take_start).
-- The job is admitted later without a start (admit.lua with count_start "0"), so the window
-- counts it once, here. Same window and retry as admit.lua's, on Redis's clock.
-- KEYS: 1 starts zset
-- ARGV: 1 start id (unique), 2 starts_per_minute
-- Returns {"ok"} | {"rate", retry_ms}

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - 60000)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {'rate', tonumber(oldest[2]) + 60000 - now_ms + 1}
end
redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 61000)
return {'ok'}
