-- A waiting ticket asks for its turn and renews its queue lease and Hold (RedisCounters).
-- KEYS: 1 running zset, 2 waiting zset, 3 waiting leases zset, 4 holds zset
-- ARGV: 1 ticket, 2 lease_ms, 3 max_running
-- Returns {"run"} | {"wait", position} | {"lost"} (the lease expired: the queue place is gone)

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ticket = ARGV[1]
local lease_ms = tonumber(ARGV[2])

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms)
for _, old in ipairs(gone) do
  redis.call('ZREM', KEYS[2], old)
  redis.call('ZREM', KEYS[3], old)
end
if not redis.call('ZSCORE', KEYS[3], ticket) then return {'lost'} end

redis.call('ZADD', KEYS[4], 'XX', now_ms + lease_ms, ticket)
local free = tonumber(ARGV[3]) - redis.call('ZCARD', KEYS[1])
local position = redis.call('ZRANK', KEYS[2], ticket)
-- FIFO: only as many of the first waiters as there are free slots may start.
if position < free then
  redis.call('ZREM', KEYS[2], ticket)
  redis.call('ZREM', KEYS[3], ticket)
  redis.call('ZADD', KEYS[1], now_ms + lease_ms, ticket)
  redis.call('PEXPIRE', KEYS[1], lease_ms * 4)
  return {'run'}
end
redis.call('ZADD', KEYS[3], now_ms + lease_ms, ticket)
redis.call('PEXPIRE', KEYS[2], lease_ms * 4)
redis.call('PEXPIRE', KEYS[3], lease_ms * 4)
return {'wait', position}
