-- The holder renews the leases of its in-flight tickets and reports their usage so far.
-- KEYS: 1 holds zset
-- ARGV: 1 lease_ms, 2 hold key prefix, then per ticket: ticket, its running zset ("" while
--       waiting), prompt tokens so far, completion tokens so far
-- Returns the tickets whose Hold was already gone (expired and settled by someone else).

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lease_ms = tonumber(ARGV[1])
local lost = {}
for i = 3, #ARGV, 4 do
  local ticket = ARGV[i]
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', now_ms + lease_ms, ticket) == 0
      and not redis.call('ZSCORE', KEYS[1], ticket) then
    lost[#lost + 1] = ticket
  else
    redis.call('HSET', ARGV[2] .. ticket, 'pp', ARGV[i + 2], 'po', ARGV[i + 3])
    if ARGV[i + 1] ~= '' then
      redis.call('ZADD', ARGV[i + 1], 'XX', now_ms + lease_ms, ticket)
      redis.call('PEXPIRE', ARGV[i + 1], lease_ms * 4)
    end
  end
end
return lost
