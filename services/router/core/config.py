"""The routing policy file (YAML), validated by pydantic before the router takes any traffic.

A policy holds the model catalog (windows, output caps, tier, cost rank), the ordered
routing rules, the complexity scorer to use, per-tenant limits and budget behaviour,
and the cache settings. A bad file fails at start-up with pydantic's message, never at
request time.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from llmbus.contract.config_file import StrictModel, load_yaml
from llmbus.contract.messages import ErrorCode

DEFAULT_POLICY_PATH = Path(__file__).resolve().parent.parent / "policies" / "default.yaml"


class ModelEntry(StrictModel):
    """What the router must know about a model to route, cap and trim for it."""

    tier: str
    max_model_len: int = Field(default=8192, ge=16)
    max_output_tokens: int = Field(default=4096, ge=1)
    max_prompt_tokens: int | None = Field(default=None, ge=1, description="Defaults to the window minus 1 token.")
    cost_rank: int = Field(default=1, ge=0, description="Relative cost; lowest is where over-budget tenants degrade.")
    hosted: bool = False
    tokenizer: str | None = Field(
        default=None, description="Local tokenizer reference (llmbus.tokens); a ModelSpec's wins. None: the estimate."
    )
    chat_template_tokens: int = Field(
        default=0,
        ge=0,
        description="What the model's chat template adds to a chat beyond its role-tagged turns (BOS, a default "
        "system prompt, headers): counted into every chat's prompt.",
    )
    tools_template_tokens: int = Field(
        default=0,
        ge=0,
        description="What the template adds around tool definitions (its instructions), counted with the "
        "definitions' own tokens when a chat has tools.",
    )


class RuleWhen(StrictModel):
    """Conditions of one rule; all that are set must hold (AND). An empty `when` matches everything."""

    complexity_gt: float | None = Field(default=None, ge=0.0, le=1.0)
    complexity_lt: float | None = Field(default=None, ge=0.0, le=1.0)
    prompt_tokens_gt: int | None = Field(default=None, ge=0)
    prompt_tokens_lt: int | None = Field(default=None, ge=0)
    token_budget_lt: int | None = Field(default=None, ge=0)
    token_budget_gt: int | None = Field(default=None, ge=0)
    categories: list[str] | None = None
    tenant_tiers: list[str] | None = None
    tenants: list[str] | None = None
    model_named: bool | None = Field(default=None, description="True: the request names a model.")
    models: list[str] | None = Field(default=None, description="The request names one of these models.")


class Rule(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    when: RuleWhen = Field(default_factory=RuleWhen)
    target: str | None = None
    use_requested_model: bool = Field(default=False, description="Route to the model the request names.")
    fallback: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _has_target(self) -> Rule:
        if self.use_requested_model == (self.target is not None):
            raise ValueError(f"rule {self.name!r}: set exactly one of `target` or `use_requested_model`")
        if self.use_requested_model and self.when.model_named is False:
            raise ValueError(f"rule {self.name!r}: use_requested_model needs requests that name a model")
        return self


class DefaultRoute(StrictModel):
    target: str
    fallback: list[str] = Field(default_factory=list)


class UnknownModel(StrEnum):
    PASS = "pass"  # an explicitly named model the catalog does not know is routed as asked, with default limits
    REJECT = "reject"  # ... or refused with model_unavailable


class OverCap(StrEnum):
    CAP = "cap"  # max_tokens above the model's output limit is lowered to it (recorded in metadata)
    REJECT = "reject"  # ... or refused with max_tokens_too_large


class OverBudget(StrEnum):
    DEGRADE = "degrade"  # route to the cheapest model (or `degrade_model`)
    REJECT = "reject"  # final result with over_budget


class TenantPolicy(StrictModel):
    tier: str | None = Field(default=None, description="Used when the request carries no tenant_tier.")
    requests_per_s: float = Field(default=50.0, gt=0.0)
    burst_requests: int = Field(default=100, ge=1)
    tokens_per_min: int = Field(default=1_000_000, ge=1)
    over_budget: OverBudget = OverBudget.DEGRADE
    degrade_model: str | None = None
    hash_user_ids: bool = Field(
        default=False,
        description="Results and costs carry the user id as HMAC-SHA256 under the router's user_id_salt setting.",
    )
    cache_group: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Tenants naming the same group share prefix caches (the scheduler's affinity and the "
        "engines' KV caches), so one can see, through cached_tokens, what the others sent; unset: the "
        "tenant's caches are its own.",
    )


class LimitsPolicy(StrictModel):
    max_prompt_tokens: int = Field(default=200_000, ge=1, description="Hard cap before any routing.")
    over_output_cap: OverCap = OverCap.CAP
    unknown_model: UnknownModel = UnknownModel.PASS
    unknown_model_defaults: ModelEntry = Field(default_factory=lambda: ModelEntry(tier="unknown"))


class CachePolicy(StrictModel):
    enabled: bool = True
    ttl_s: int = Field(default=3600, ge=1)
    pending_ttl_s: int = Field(default=900, ge=1, description="How long a routed request may take to finish.")
    max_text_bytes: int = Field(default=256_000, ge=1)


class LatencyPolicy(StrictModel):
    """`latency:` TTFT targets per tier, watched over a window (core/latency.py)."""

    enabled: bool = True
    targets_ms: dict[str, float] = Field(
        default_factory=lambda: {"strong": 5000.0, "mid": 800.0, "small": 100.0, "default": 1500.0},
        description="TTFT target per tier (ms); tiers not listed have none.",
    )
    window_s: float = Field(default=60.0, gt=0)
    min_samples: int = Field(default=20, ge=1)
    quantile: float = Field(default=0.9, gt=0, le=1)
    prefer_fallback_while_missing: bool = False


class CoalescePolicy(StrictModel):
    """`coalesce:` identical cacheable requests in flight share one generation (core/coalesce.py).

    Only for requests the exact cache may answer (same key: same tenant, model, input, parameters).
    """

    enabled: bool = True
    lead_ttl_s: float = Field(
        default=300.0, gt=0, description="How long a leader's generation is awaited by newcomers."
    )
    max_wait_s: float = Field(
        default=330.0, gt=0, description="A follower whose leader gave no result by then generates on its own."
    )
    share_error_codes: list[ErrorCode] = Field(
        default_factory=lambda: [ErrorCode.INVALID_REQUEST, ErrorCode.PROMPT_TOO_LONG, ErrorCode.MAX_TOKENS_TOO_LARGE],
        description="A leader failing with one of these ends its followers with the same error (their input is the"
        " same); any other failure (deadline, worker, cancel) sends each follower to its own generation.",
    )
    sweep_interval_s: float = Field(default=1.0, gt=0, description="How often overdue followers are looked for.")

    @model_validator(mode="after")
    def _waits_for_its_leader(self) -> CoalescePolicy:
        if self.max_wait_s < self.lead_ttl_s:
            raise ValueError("coalesce.max_wait_s must be >= lead_ttl_s: a follower must outwait a live leader")
        return self


class SemanticCachePolicy(StrictModel):
    """`semantic_cache:` answers a cacheable request from a similar earlier one of the same tenant and model.

    Off by default: with the packaged embedder no threshold reaches a usable precision on the
    paraphrase pairs (bench/reports/router_quality.md); a wrong hit answers another question.
    """

    enabled: bool = False
    embedder: str = Field(default="wordllama", description="Registry name (services/router/adapters/embedders.py).")
    threshold: float = Field(default=0.98, gt=0, le=1, description="Cosine similarity at or above which a hit counts.")
    max_entries: int = Field(default=500, ge=1, description="Entries kept per tenant and model (oldest dropped).")
    max_prompt_chars: int = Field(default=4000, ge=1, description="Longer prompts are not embedded (exact cache only).")


class ScorerPolicy(StrictModel):
    name: str = "heuristic"
    params: dict[str, Any] = Field(default_factory=dict)
    fallback: str | None = Field(
        default=None, description="Scorer (default params) used when `name` cannot be built, e.g. a missing model file."
    )


class RouterPolicy(StrictModel):
    version: int = 1
    models: dict[str, ModelEntry]
    scorer: ScorerPolicy = Field(default_factory=ScorerPolicy)
    rules: list[Rule] = Field(default_factory=list)
    default: DefaultRoute
    limits: LimitsPolicy = Field(default_factory=LimitsPolicy)
    tenants: dict[str, TenantPolicy] = Field(default_factory=lambda: {"default": TenantPolicy()})
    cache: CachePolicy = Field(default_factory=CachePolicy)
    latency: LatencyPolicy = Field(default_factory=LatencyPolicy)
    coalesce: CoalescePolicy = Field(default_factory=CoalescePolicy)
    semantic_cache: SemanticCachePolicy = Field(default_factory=SemanticCachePolicy)

    @model_validator(mode="after")
    def _consistent(self) -> RouterPolicy:
        names = [rule.name for rule in self.rules]
        if len(names) != len(set(names)):
            raise ValueError(f"rule names must be unique: {names}")
        for where, model in self._named_models():
            if model not in self.models:
                raise ValueError(f"{where} names model {model!r}, which is not in `models`")
        if "default" not in self.tenants:
            raise ValueError("`tenants` needs a `default` entry")
        return self

    def _named_models(self) -> list[tuple[str, str]]:
        named = [("default.target", self.default.target)]
        named += [("default.fallback", m) for m in self.default.fallback]
        for rule in self.rules:
            if rule.target:
                named.append((f"rule {rule.name}", rule.target))
            named += [(f"rule {rule.name} fallback", m) for m in rule.fallback]
        for tenant, tp in self.tenants.items():
            if tp.degrade_model:
                named.append((f"tenant {tenant}", tp.degrade_model))
        return named

    def tenant(self, tenant: str) -> TenantPolicy:
        return self.tenants.get(tenant) or self.tenants["default"]

    def cheapest_model(self) -> str:
        return min(self.models.items(), key=lambda kv: (kv[1].cost_rank, kv[0]))[0]


def with_default_model(policy: RouterPolicy, model: str) -> RouterPolicy:
    """The policy with `model` as its default target (a deployment override, e.g. a sim-only dev stack)."""
    return policy.model_copy(update={"default": DefaultRoute(target=model)})


def load_policy(path: str | Path | None = None) -> RouterPolicy:
    return load_yaml(path or DEFAULT_POLICY_PATH, RouterPolicy)
