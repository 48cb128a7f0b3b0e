-- Settles a ticket: charges the real usage (never above the Hold), frees the rest and the slot.
-- KEYS: 1 running zset, 2 waiting zset, 3 waiting leases zset, 4 holds zset, 5 the hold hash
-- ARGV: 1 ticket, 2 prompt tokens, 3 completion tokens, 4 prompt the engine worked on (an
--       activation unit settles at it: an error answer reports no usage but used the engine)
-- Returns 1, or 0 when the Hold had already expired (and was settled at the reported progress).

local function reservation(kind, p, o)
  if kind == 'requests' then return (p + o > 0) and 1 or 0 end
  if kind == 'input' then return p end
  if kind == 'output' then return o end
  return p + o
end

local ticket = ARGV[1]
redis.call('ZREM', KEYS[1], ticket)
redis.call('ZREM', KEYS[2], ticket)
redis.call('ZREM', KEYS[3], ticket)
if redis.call('ZREM', KEYS[4], ticket) == 0 then
  redis.call('DEL', KEYS[5])
  return 0
end
local fields = redis.call('HGETALL', KEYS[5])
local h = {}
for i = 1, #fields, 2 do h[fields[i]] = fields[i + 1] end
local prompt = tonumber(ARGV[2])
local output = tonumber(ARGV[3])
for name, value in pairs(h) do
  if string.sub(name, 1, 2) == 'c:' then
    local counter = string.sub(name, 3)
    local reserved = tonumber(value)
    local kind = h['k:' .. counter]
    local p = (kind == 'requests') and tonumber(ARGV[4] or '0') or prompt
    local charged = math.min(reserved, reservation(kind, p, output))
    redis.call('DECRBY', counter, reserved - charged)
    redis.call('DECRBY', counter .. '|held', reserved)
  end
end
redis.call('DEL', KEYS[5])
return 1
