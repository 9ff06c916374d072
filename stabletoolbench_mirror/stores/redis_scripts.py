"""The Redis store's Lua scripts: storage only, the rules are :mod:`.rules`'.

A write reads what the store holds, asks :mod:`.rules` for a plan, and sends the plan to
:data:`APPLY` together with what it read (the SHA-1 of each value, or ``""`` for none).  Redis
runs a script atomically: the script applies the plan only while every value is still the one
read, and answers :data:`CHANGED` otherwise, so the writer reads again and asks again.  No script
decodes a record or decides anything about one.

Layout under a key prefix ``P`` (see :mod:`.redis_store`): ``P:e:<api>`` (key -> record JSON),
``P:c:<api>`` (canonical key -> key), ``P:namespaces`` (the APIs), ``P:counts`` (counters).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stabletoolbench_mirror.core.records import Record
    from stabletoolbench_mirror.stores import rules

#: what :data:`APPLY` and :data:`DELETE` answer when what the writer read has changed meanwhile
CHANGED = -1

_CHECK = """
local function seen(hash, field, expected)
  local raw = redis.call('HGET', hash, field)
  if not raw then return expected == '' end
  return redis.sha1hex(raw) == expected
end
"""

# KEYS: entries hash, canonical hash, apis set, counts hash.
# ARGV: key, its value's sha1 as read ("" none), canonical ("" none), the pointer's value as read
# ("" none), the target's key ("" none) and its value's sha1 as read, write ("1"/"0"), record JSON,
# point ("1"/"0"), api, then counter name / change pairs.
APPLY = _CHECK + """
if not seen(KEYS[1], ARGV[1], ARGV[2]) then return -1 end
if ARGV[3] ~= '' then
  local pointer = redis.call('HGET', KEYS[2], ARGV[3]) or ''
  if pointer ~= ARGV[4] then return -1 end
end
if ARGV[5] ~= '' and not seen(KEYS[1], ARGV[5], ARGV[6]) then return -1 end
if redis.call('SCARD', KEYS[3]) == 0 then
  redis.call('HSETNX', KEYS[4], 'counted', 1)
end
if ARGV[7] == '1' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[8])
  redis.call('SADD', KEYS[3], ARGV[10])
end
if ARGV[9] == '1' then
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[1])
end
for i = 11, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[4], ARGV[i], tonumber(ARGV[i + 1]))
end
return 1
"""

# KEYS: entries hash, canonical hash, apis set, counts hash.
# ARGV: api, the number n of keys, then n keys, then their values' sha1 as read, then counter
# name / change pairs.  The records go, every pointer naming one of them goes, an API left
# without records leaves the set.
DELETE = _CHECK + """
local n = tonumber(ARGV[2])
for i = 1, n do
  if not seen(KEYS[1], ARGV[2 + i], ARGV[2 + n + i]) then return -1 end
end
local removed = {}
for i = 1, n do
  redis.call('HDEL', KEYS[1], ARGV[2 + i])
  removed[ARGV[2 + i]] = true
end
local cursor = '0'
repeat
  local page = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', 1000)
  cursor = page[1]
  local items = page[2]
  for j = 1, #items, 2 do
    if removed[items[j + 1]] then redis.call('HDEL', KEYS[2], items[j]) end
  end
until cursor == '0'
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[3], ARGV[1]) end
for i = 3 + 2 * n, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[4], ARGV[i], tonumber(ARGV[i + 1]))
end
return n
"""

# a lock is renewed or deleted only by the holder of its token
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def sha1(raw: str | None) -> str:
    """What the scripts compare a value with: its SHA-1 as Redis computes it (``""`` for none)."""
    return "" if raw is None else hashlib.sha1(raw.encode("utf-8")).hexdigest()


def seen(key: str, raw: str | None, canonical: str | None, target: str | None) -> list[str]:
    """What a write read, as :data:`APPLY` checks it (the target's key and SHA-1 blank: see :meth:`~.redis_store.RedisStore._read_holding`)."""
    return [key, sha1(raw), canonical or "", target or "", "", ""]


def apply_args(read: list[str], record: Record, plan: rules.Plan) -> list[str]:
    """:data:`APPLY`'s ARGV: what was read (:func:`seen`), then the plan for ``record``."""
    write = "1" if plan.write else "0"
    return [*read, write, record.to_json() if plan.write else "", "1" if plan.point else "0", record.api, *_counts(plan.counts)]


def delete_args(api: str, there: list[tuple[str, str]], counts: rules.Counts) -> list[str]:
    """:data:`DELETE`'s ARGV: the keys found (``(key, value)``), their values' SHA-1s, the counter changes."""
    return [api, str(len(there)), *[key for key, _ in there], *[sha1(raw) for _, raw in there], *_counts(counts)]


def _counts(counts: rules.Counts) -> list[str]:
    """The rules' counter changes as the scripts take them: ``name``, ``n`` pairs (names joined by ``:``)."""
    return [part for name, n in counts.items() if n for part in (":".join(name), str(n))]
