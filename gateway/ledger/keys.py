"""The ledger's Redis key schema and its record script, shared by the writer (`RedisLedger`) and the
readers (`costs_report`, `BudgetGuard`). Pure: no I/O. `gateway.ledger.store` re-exports `LedgerKeys` and
`rollup_slot`; the layout written before this one is `gateway.ledger.layouts.LegacyLedgerKeys` (read only).

Redis Cluster: every key one record's script touches carries the hash tag of its tenant,
`{prefix}ledger:{<tenant>}:...`, so the record's script (idempotency key, stream, both rollups, both
indexes, spend) runs in one slot and stays one atomic, idempotent step. The tenant is the tag because it is
what the readers read together: the budget guard reads one tenant's spend (one HMGET, one slot), a report
reads per tenant and day. A tag per UTC day would send every write of a day to one master (all of the
cluster's write load on one node); a tag per request would split the record over slots (no atomic step,
so a replay could count half a record twice). The cost of the tenant tag: one tenant's write load stays on
one master (as its rate-limit keys, `rl:{<tenant>}`, already do), so a single huge tenant does not spread.

Readers find the tenants through registries outside any tag: `{prefix}ledger:tenants:{day}` (tenants with
a record that started that UTC day: reports) and `{prefix}ledger:tenants` (every tenant: stream readers).
The writer adds a tenant to both before the first record script of that tenant and day (once per process),
so a record that counts is always in a registry. The prefix must not hold `{` or `}` (it would take the tag).

Days are `YYYY-MM-DD` and months `YYYY-MM`, both UTC, taken from a record's `started_at`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

from gateway.ledger.holds import RELEASE_FN, release_lua
from gateway.ledger.record import CostRecord

__all__ = ["RECORD_LUA", "SPEND_MONTH_FIELD", "SPEND_TTL_EXTRA_S", "LedgerKeys", "rollup_slot", "utc_periods"]

SPEND_MONTH_FIELD = "month"  # field of the spend hash holding the whole month; day fields are `YYYY-MM-DD`
SPEND_TTL_EXTRA_S = 31 * 86_400  # a spend hash lives retention + 31 days after its last write


@dataclass(frozen=True, slots=True)
class LedgerKeys:
    """The Redis key schema, shared by the writer and the readers. Days are `YYYY-MM-DD` (UTC), hours
    `YYYY-MM-DDTHH`; index members are `tenant:pool:model` (day) and `HH:tenant:pool:model` (hour), as in
    the layout before; every per-record key is in its tenant's slot (see the module docstring)."""

    prefix: str = "cascade:"

    def __post_init__(self) -> None:
        if "{" in self.prefix or "}" in self.prefix:
            raise ValueError(f"ledger key prefix {self.prefix!r} must not contain '{{' or '}}' (Redis hash tags)")

    def _tenant(self, tenant: str) -> str:
        return f"{self.prefix}ledger:{{{tenant}}}:"

    @property
    def tenants(self) -> str:
        """Set of every tenant with a record (stream readers walk their streams)."""
        return f"{self.prefix}ledger:tenants"

    def tenants_of_day(self, day: str) -> str:
        """Set of the tenants with a record that started on UTC day `day` (reports read it first)."""
        return f"{self.prefix}ledger:tenants:{day}"

    def stream(self, tenant: str) -> str:
        return f"{self._tenant(tenant)}records"

    def request(self, tenant: str, request_id: str) -> str:
        return f"{self._tenant(tenant)}req:{request_id}"

    def day(self, day: str, member: str) -> str:
        tenant, rest = member.split(":", 1)
        return f"{self._tenant(tenant)}day:{day}:{rest}"

    def hour(self, day: str, hour_member: str) -> str:
        hour, tenant, rest = hour_member.split(":", 2)
        return f"{self._tenant(tenant)}hour:{day}T{hour}:{rest}"

    def day_index(self, tenant: str, day: str) -> str:
        return f"{self._tenant(tenant)}idx:{day}"

    def hour_index(self, tenant: str, day: str) -> str:
        return f"{self._tenant(tenant)}hidx:{day}"

    def spend(self, tenant: str, month: str) -> str:
        """Hash of one tenant's spend in one UTC month `YYYY-MM`, integer micro-USD: field `month` (the
        whole month) and one field per UTC day `YYYY-MM-DD`. Written only by the record script."""
        return f"{self._tenant(tenant)}spend:{month}"

    def holds(self, tenant: str) -> str:
        """Hash of one tenant's budget holds: request id → micro-USD (`gateway.ledger.holds`)."""
        return f"{self._tenant(tenant)}holds"

    def key_spend(self, tenant: str, day: str) -> str:
        """Hash of one tenant's spend per API key on UTC day `day`: fields `<key id>:requests`,
        `<key id>:prompt_tokens`, `<key id>:completion_tokens`, `<key id>:cost_micro_usd` (records with a key id
        only). Written only by the record script; read by per-key budgets and `cascade costs report --by key`."""
        return f"{self._tenant(tenant)}keys:{day}"

    def hold_expiry(self, tenant: str) -> str:
        """Sorted set of one tenant's budget holds by expiry (`gateway.ledger.holds`)."""
        return f"{self._tenant(tenant)}holds:exp"

    def key_holds(self, tenant: str, key_id: str) -> str:
        """Hash of one API key's budget holds (as `holds`, for the key's own daily budget), in its tenant's slot."""
        return f"{self._tenant(tenant)}keyholds:{key_id}"

    def key_hold_expiry(self, tenant: str, key_id: str) -> str:
        """Sorted set of one API key's budget holds by expiry (as `hold_expiry`)."""
        return f"{self._tenant(tenant)}keyholds:{key_id}:exp"


def rollup_slot(rec: CostRecord) -> tuple[str, str, str]:
    """(day, day index member, hour index member) of a record, from `started_at` in UTC."""
    day, hour = _utc_hour(int(rec.started_at // 3600))
    member = f"{rec.tenant}:{rec.pool}:{rec.model}"
    return day, member, f"{hour}:{member}"


@lru_cache(maxsize=64)
def _utc_hour(hours: int) -> tuple[str, str]:
    """(`YYYY-MM-DD`, `HH`) of the UTC hour that starts `hours` hours after the epoch (UTC hours are whole
    multiples of 3,600 s): formatted once per hour, not per record."""
    when = datetime.fromtimestamp(hours * 3600, UTC)
    return when.strftime("%Y-%m-%d"), f"{when:%H}"


def utc_periods(epoch_s: float) -> tuple[str, str]:
    """(`YYYY-MM` month, `YYYY-MM-DD` day) in UTC of a UTC epoch time in seconds."""
    when = datetime.fromtimestamp(epoch_s, UTC)
    return when.strftime("%Y-%m"), when.strftime("%Y-%m-%d")


# KEYS (one tenant's slot): idempotency key, stream, day rollup, hour rollup, day index, hour index, spend,
#       budget holds, their expiry (`gateway.ledger.holds`), spend per API key of the day, the API key's budget
#       holds and their expiry (the record's key id; unused without one)
# ARGV: ttl_s, retention_ms, prompt, completion, cost, flagship, day member, hour member, spend ttl_s,
#       day (spend field), n, n pairs (extra counter name, value; the writer leaves out the zeros), hold id (the
#       request id), key id ('' = none), stream fields...
# The request's budget holds (its tenant's, its API key's) are released first, even for a duplicate: its cost is in
# the spend either way.
# Everything below the EXISTS check happens only for a request id not seen before: a retry or an outbox
# replay changes nothing, so rollups and spend stay exact. Counters reach HINCRBY as decimal strings. The
# stream expires a retention after its last record: a tenant that stopped leaves no stream behind.
RECORD_LUA = "#!lua" + RELEASE_FN + "local extra = tonumber(ARGV[11])\n" + release_lua(
    "KEYS[8]", "KEYS[9]", "ARGV[12 + 2 * extra]") + """
if ARGV[13 + 2 * extra] ~= '' and ARGV[12 + 2 * extra] ~= '' then
  release_hold(KEYS[11], KEYS[12], ARGV[12 + 2 * extra])
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local now = redis.call('TIME')
local minid = string.format('%.0f', tonumber(now[1]) * 1000 - tonumber(ARGV[2]))
local id = redis.call('XADD', KEYS[2], 'MINID', '~', minid, '*', unpack(ARGV, 14 + 2 * extra))
redis.call('EXPIRE', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], id, 'EX', ARGV[1])
local fields = {'prompt_tokens', 'completion_tokens', 'cost_micro_usd', 'flagship_cost_micro_usd'}
for k = 3, 4 do
  redis.call('HINCRBY', KEYS[k], 'requests', 1)
  for i, field in ipairs(fields) do redis.call('HINCRBY', KEYS[k], field, ARGV[2 + i]) end
  for j = 1, extra do
    local value = ARGV[11 + 2 * j]
    if value ~= '0' then redis.call('HINCRBY', KEYS[k], ARGV[10 + 2 * j], value) end
  end
end
redis.call('SADD', KEYS[5], ARGV[7])
redis.call('SADD', KEYS[6], ARGV[8])
redis.call('HINCRBY', KEYS[7], 'month', ARGV[5])
redis.call('HINCRBY', KEYS[7], ARGV[10], ARGV[5])
redis.call('EXPIRE', KEYS[7], ARGV[9])
local key = ARGV[13 + 2 * extra]
if key ~= '' then
  redis.call('HINCRBY', KEYS[10], key .. ':requests', 1)
  for i, field in ipairs({'prompt_tokens', 'completion_tokens', 'cost_micro_usd'}) do
    redis.call('HINCRBY', KEYS[10], key .. ':' .. field, ARGV[2 + i])
  end
  redis.call('EXPIRE', KEYS[10], ARGV[9])
end
return 1
"""
