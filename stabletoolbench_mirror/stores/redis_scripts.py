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
