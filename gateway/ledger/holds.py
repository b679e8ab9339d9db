"""Budget holds: the worst-case cost of a tenant's requests in flight, held against its budget until the ledger
records their real cost. Pure: key names and Lua scripts, no I/O.

Keys, in the tenant's slot beside its spend (`LedgerKeys.holds`, `LedgerKeys.hold_expiry`): a hash of hold id (the
request id) → micro-USD, whose field `" sum"` is the total of its holds (no request id can take that name: ids are
printable ASCII without spaces), and a sorted set of hold id → expiry (Redis server time, ms).

Contract:
- `HOLD_LUA` (run by `gateway.tenancy.budgets.BudgetGuard.reserve`) places a hold only while the tenant's spend plus
  the holds already placed are below each of its limits, in one atomic step. Of any number of concurrent requests,
  only as many are admitted as the budget can carry: spend ends at most one request's worst case above the limit
  (its real cost, when the worst case was not underestimated).
- The ledger's record script (`gateway.ledger.keys.RECORD_LUA`) releases the hold of the request id it records in
  the same atomic step in which it adds the real cost to the spend: the request counts once, as its hold or as
  its cost, never both and never neither. Records of other ids (a cascade probe's `-probe`) leave it alone.
- `RELEASE_LUA` releases the hold of a request refused after admission (no cost to record).
- A hold nobody releases (its process died) expires after its TTL: `HOLD_LUA` first drops expired holds from the
  sum. The keys themselves expire a TTL after the latest hold.
Holds are counted against both the day and the month of the moment a hold is asked for.
"""

from __future__ import annotations

__all__ = ["HOLD_LUA", "HOLD_SUM_FIELD", "RELEASE_FN", "RELEASE_LUA", "release_lua"]

HOLD_SUM_FIELD = " sum"

# Lua: release_hold(holds hash, expiry zset, hold id): drop one hold and take it off the sum; nothing when absent
RELEASE_FN = """
local function release_hold(holds, expiry, id)
  local amount = redis.call('HGET', holds, id)
  if amount then
    redis.call('HDEL', holds, id)
    redis.call('ZREM', expiry, id)
    redis.call('HINCRBY', holds, ' sum', string.format('%d', -tonumber(amount)))
  end
end
"""


def release_lua(holds_key: str, expiry_key: str, hold_id: str) -> str:
    """Lua lines (after `RELEASE_FN`) releasing the hold `hold_id` (a Lua expression) when it is not ''."""
    return f"if {hold_id} ~= '' then release_hold({holds_key}, {expiry_key}, {hold_id}) end\n"


# KEYS: holds hash, expiry zset. ARGV: hold id. Returns 1.
RELEASE_LUA = "#!lua" + RELEASE_FN + release_lua("KEYS[1]", "KEYS[2]", "ARGV[1]") + "return 1\n"

# KEYS: spend hash of the month (`LedgerKeys.spend`), holds hash, expiry zset.
# ARGV: day field (`YYYY-MM-DD`), day limit, month limit ('' = none; micro-USD), amount (micro-USD), hold id,
#       ttl (ms), day and month spend in the layout before (`gateway.ledger.layouts`: not in this slot).
# Returns {day spend, month spend, held before this hold, 1 if placed else 0}.
HOLD_LUA = "#!lua" + RELEASE_FN + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, id in ipairs(gone) do release_hold(KEYS[2], KEYS[3], id) end
local spend = redis.call('HMGET', KEYS[1], 'month', ARGV[1])
local month = (tonumber(spend[1]) or 0) + tonumber(ARGV[8])
local day = (tonumber(spend[2]) or 0) + tonumber(ARGV[7])
local held = tonumber(redis.call('HGET', KEYS[2], ' sum')) or 0
local over = (ARGV[2] ~= '' and day + held >= tonumber(ARGV[2]))
  or (ARGV[3] ~= '' and month + held >= tonumber(ARGV[3]))
local amount, ttl = tonumber(ARGV[4]), tonumber(ARGV[6])
if over or amount <= 0 then return {day, month, held, 0} end
release_hold(KEYS[2], KEYS[3], ARGV[5])
redis.call('HSET', KEYS[2], ARGV[5], ARGV[4])
redis.call('HINCRBY', KEYS[2], ' sum', ARGV[4])
redis.call('ZADD', KEYS[3], string.format('%d', now + ttl), ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('PEXPIRE', KEYS[3], ARGV[6])
return {day, month, held, 1}
"""
