"""The routing core: one InferenceRequest in, what to publish out. No broker imports.

Order of the steps, and why:
 1. features (prompt tokens, complexity) — everything below reads them;
 2. hard prompt cap — refuse absurd inputs before spending Redis calls on them;
 3. budget (llm.budgets) — over budget either refuses or forces the cheaper model;
 4. rules → model + fallback chain; an unavailable target walks its chain;
 5. A/B — the first enabled experiment on that model may swap it for the user's variant (a release:
    the version of the model); the request carries its release (the release in progress, else the
    one its serving version came with), which the scheduler places it by;
 6. output cap and context trimming for the chosen model (the window it will really get);
 7. tenant rate limits (requests/s, tokens/min; tokens = prompt + max_tokens, like
    hosted providers count) — every request counts, cache hits too: the limit is on
    what the tenant asks, not on what it costs us;
 8. exact cache — a hit ends the request here; then the semantic cache (off by default: a similar
    enough earlier prompt of the same tenant and model); a miss may join an identical request already
    in flight (coalescing: it is answered from that one's generation, core/coalesce.py);
 9. shadow copies of the routed request for matching shadow experiments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus.contract.messages import (
    BudgetState,
    ErrorCode,
    ErrorInfo,
    FinishReason,
    InferenceRequest,
    InferenceResult,
    ReleaseContext,
    RequestFacts,
    ResultStatus,
    RoutedRequest,
    Timings,
    TokenChunk,
    now_ms,
)
from llmbus.domain.adapters import AdapterNotServed, named_adapter
from llmbus.domain.fallback import next_model
from llmbus.domain.lifecycle import CONTROL
from llmbus.domain.release import context_for
from llmbus.security.tenancy import user_ref
from llmbus.tokens import estimate_tokens
from llmbus_services.router.core.cache_key import cache_key, cacheable
from llmbus_services.router.core.catalog import ModelCatalog
from llmbus_services.router.core.complexity import ComplexityScorer
from llmbus_services.router.core.config import OverBudget, OverCap, RouterPolicy, UnknownModel
from llmbus_services.router.core.experiments import ExperimentBook, in_shadow, pick, shadow_copy, unit_of
from llmbus_services.router.core.latency import TARGET_KEY, TIER_KEY, TierLatencyWatch, avoid_missing_tier
from llmbus_services.router.core.ports import (
    BudgetView,
    CachedAnswer,
    Coalescer,
    RateLimiter,
    ResponseCache,
    SemanticCache,
)
from llmbus_services.router.core.rules import RouteDecision, RouteFeatures, decide_route
from llmbus_services.router.core.semantic import SEMANTIC_HIT
from llmbus_services.router.core.semantic import eligible as semantic_eligible
from llmbus_services.router.core.trimming import trim_to_window

PRODUCED_BY = "router"


@dataclass
class RouteOutcome:
    """Either `routed` (+ shadows) to publish on llm.routed, or a final `result` for the client."""

    routed: RoutedRequest | None = None
    shadows: list[RoutedRequest] = field(default_factory=list)
    result: InferenceResult | None = None
    content_chunks: list[TokenChunk] = field(default_factory=list)  # a cache hit's text, before the final chunk
    parked_behind: str | None = None  # coalesced: the leader whose generation answers this request; publish nothing

    @property
    def last_seq(self) -> int:
        return self.content_chunks[-1].seq if self.content_chunks else -1


class Refused(Exception):
    def __init__(self, code: ErrorCode, message: str, retry_after_ms: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.error = ErrorInfo.of(code, message, retry_after_ms)
        self.reason = reason or f"refused:{code.value}"
        self.release: ReleaseContext | None = None  # known once the target is: the refusal belongs to it


@dataclass
class _Fitted:
    request: InferenceRequest
    prompt_tokens: int
    trimmed_tokens: int
    max_tokens_requested: int | None  # set when max_tokens was lowered to the output cap
    tokenizer: str | None = None  # what counted prompt_tokens (None: the per-script estimate)


class RouterCore:
    def __init__(
        self,
        policy: RouterPolicy,
        scorer: ComplexityScorer,
        catalog: ModelCatalog | None = None,
        experiments: ExperimentBook | None = None,
        limiter: RateLimiter | None = None,
        cache: ResponseCache | None = None,
        budgets: BudgetView | None = None,
        latency: TierLatencyWatch | None = None,
        coalescer: Coalescer | None = None,
        semantic: SemanticCache | None = None,
        user_id_salt: str = "",
    ) -> None:
        if not user_id_salt and any(tenant.hash_user_ids for tenant in policy.tenants.values()):
            raise ValueError("a tenant's policy says hash_user_ids: set the router's user_id_salt")
        self.policy = policy
        self.user_id_salt = user_id_salt
        self.scorer = scorer
        self.catalog = catalog or ModelCatalog(policy)
        self.experiments = experiments or ExperimentBook()
        self.limiter = limiter
        self.cache = cache
        self.budgets = budgets
        self.latency = latency
        self.coalescer = coalescer
        self.semantic = semantic

    def tier_of(self, model: str) -> str:
        return self.catalog.entry(model).tier if self.catalog.knows(model) else "unknown"

    def user_ref_of(self, request: InferenceRequest) -> str | None:
        hashed = self.policy.tenant(request.tenant).hash_user_ids
        return user_ref(request.user_id, hashed=hashed, salt=self.user_id_salt)

    def request_facts(self, request: InferenceRequest, route_reason: str | None = None) -> RequestFacts:
        """The facts of a request answered before it was routed (refused, unroutable): no tier."""
        facts = RoutedRequest(request=request, model="", user_ref=self.user_ref_of(request)).facts(route_reason)
        facts["route_reason"] = route_reason
        return facts

    async def route(self, request: InferenceRequest, received_at_ms: int | None = None) -> RouteOutcome:
        received_at_ms = received_at_ms or now_ms()
        try:
            return await self._route(request, received_at_ms)
        except Refused as refused:
            return RouteOutcome(result=self._final_error(request, refused, received_at_ms))

    def features(self, request: InferenceRequest) -> RouteFeatures:
        tenant = self.policy.tenant(request.tenant)
        complexity = request.complexity if request.complexity is not None else self.scorer.score(request)
        return RouteFeatures(
            complexity=complexity,
            prompt_tokens=estimate_tokens(request.prompt_text()),
            token_budget=request.token_budget,
            category=request.category,
            tenant=request.tenant,
            tenant_tier=request.tenant_tier or tenant.tier,
            requested_model=request.model,
        )

    def decide(self, request: InferenceRequest, f: RouteFeatures) -> RouteDecision:
        """Steps 3-4: budget, rules, availability (no I/O)."""
        tenant = self.policy.tenant(request.tenant)
        budget = self.budgets.state_of(request.tenant) if self.budgets else BudgetState.OK
        if budget == BudgetState.OVER:
            if tenant.over_budget == OverBudget.REJECT:
                resets_ms = self.budgets.resets_in_ms(request.tenant, now_ms()) if self.budgets else None
                raise Refused(ErrorCode.OVER_BUDGET, f"tenant {request.tenant!r} is over its budget", resets_ms)
            model = tenant.degrade_model or self.policy.cheapest_model()
            decision = RouteDecision(model=model, route_reason="budget_degrade")
        else:
            decision = decide_route(self.policy, f)
        unknown = decision.rule and f.requested_model == decision.model and not self.catalog.knows(decision.model)
        if unknown and self.policy.limits.unknown_model == UnknownModel.REJECT:
            raise Refused(ErrorCode.MODEL_UNAVAILABLE, f"model {decision.model!r} is not in the catalog")
        if not self.catalog.is_available(decision.model):
            picked = next_model(decision.fallback_chain, decision.model, self.catalog.is_available)
            if picked is None:
                raise Refused(
                    ErrorCode.MODEL_UNAVAILABLE, f"model {decision.model!r} and its fallbacks are unavailable"
                )
            to_model, rest = picked
            reason = f"fallback:{decision.model}->{to_model}:{ErrorCode.MODEL_UNAVAILABLE.value}"
            decision = RouteDecision(model=to_model, fallback_chain=rest, route_reason=reason, rule=decision.rule)
        return decision

    def fit(self, request: InferenceRequest, model: str) -> _Fitted:
        """Step 6: cap max_tokens to the model's output limit, trim the conversation to its window."""
        entry = self.catalog.entry(model)
        count, tokenizer = self.catalog.counter(model)  # the model's own tokenizer where it is known
        template_tokens = self.catalog.template_tokens(model, request, count)  # chat template, tool definitions
        if request.max_tokens_auto:
            # No limit asked: as much as the model may write in the window the prompt leaves (at least 1, so
            # that a prompt filling the window is trimmed or refused below, not here). It stays marked unset:
            # the scheduler and the worker bound it to the window of the worker that serves it.
            room_tokens = entry.max_model_len - count(request.prompt_text()) - template_tokens
            request = request.model_copy(update={"max_tokens": max(1, min(entry.max_output_tokens, room_tokens))})
        capped_from = request.max_tokens if request.max_tokens > entry.max_output_tokens else None
        if capped_from is not None:
            if self.policy.limits.over_output_cap == OverCap.REJECT:
                raise Refused(
                    ErrorCode.MAX_TOKENS_TOO_LARGE,
                    f"max_tokens {request.max_tokens} > {entry.max_output_tokens} for {model}",
                )
            request = request.model_copy(
                update={
                    "max_tokens": entry.max_output_tokens,
                    "metadata": request.metadata | {"llmbus.max_tokens_requested": str(request.max_tokens)},
                }
            )
        window = min(entry.max_model_len, self.catalog.max_prompt_tokens(model) + request.max_tokens)
        trimmed = trim_to_window(request, window, request.max_tokens, count, template_tokens)
        if not trimmed.fits:
            counted_by = f"counted with {tokenizer}" if tokenizer else "estimated"
            whole_tokens = trimmed.prompt_tokens + trimmed.trimmed_tokens  # before trimming
            raise Refused(
                ErrorCode.PROMPT_TOO_LONG,
                f"prompt of {whole_tokens} tokens ({counted_by}) does not fit {model} "
                f"(window {entry.max_model_len}, max_tokens {request.max_tokens})",
            )
        if trimmed.trimmed_tokens:
            request = request.model_copy(update={"messages": trimmed.messages})
        return _Fitted(request, trimmed.prompt_tokens, trimmed.trimmed_tokens, capped_from, tokenizer)

    async def _route(self, request: InferenceRequest, received_at_ms: int) -> RouteOutcome:
        request = self._adapter_as_model(request)
        f = self.features(request)
        if f.prompt_tokens > self.policy.limits.max_prompt_tokens:
            raise Refused(
                ErrorCode.PROMPT_TOO_LONG,
                f"prompt of ~{f.prompt_tokens} tokens > limit {self.policy.limits.max_prompt_tokens}",
            )
        decision = self.decide(request, f)
        model, reason, chain = decision.model, decision.route_reason, decision.fallback_chain
        if self.latency is not None:
            avoided = avoid_missing_tier(model, chain, self.tier_of, self.latency, received_at_ms / 1000)
            if avoided is not None:
                model, chain, reason = avoided
        experiment_id = variant = None
        release: ReleaseContext | None = None
        for experiment in self.experiments.ab_for(model)[:1]:  # one A/B per request: effects stay attributable
            picked = pick(experiment, unit_of(request))
            if picked is not None:
                variant, model = picked.name, picked.model
                experiment_id = experiment.experiment_id
                chain = [m for m in chain if m != model]
                release = context_for(experiment, picked.name)
        if release is None:
            release = self.release_of(model)

        try:
            fitted = self.fit(request, model)
            request = self._stamp_target(fitted.request, model)
            if self.limiter is not None:
                tenant = self.policy.tenant(request.tenant)
                verdict = await self.limiter.take(request.tenant, tenant, fitted.prompt_tokens + request.max_tokens)
                if not verdict.allowed:
                    raise Refused(
                        ErrorCode.RATE_LIMITED,
                        f"tenant {request.tenant!r} over its {verdict.limit} limit",
                        verdict.retry_after_ms,
                    )
        except Refused as refused:
            refused.release = release
            raise

        routed = RoutedRequest(
            request=request,
            model=model,
            route_reason=reason,
            fallback_chain=chain,
            experiment_id=experiment_id,
            variant=variant,
            prompt_tokens_est=fitted.prompt_tokens,
            prompt_tokenizer=fitted.tokenizer,
            trimmed_tokens=fitted.trimmed_tokens,
            max_tokens_requested=fitted.max_tokens_requested,
            received_at_ms=received_at_ms,
            tier=self.tier_of(model),
            user_ref=self.user_ref_of(request),
            cache_group=self.policy.tenant(request.tenant).cache_group,
            release=release,
            adapter=self.catalog.adapter_of(model, release),
        )
        if self.cache is not None and self.policy.cache.enabled and cacheable(request):
            # One version's answers never answer another's requests.
            key = cache_key(request, model if release is None else f"{model}@{release.model_version}")
            hit = await self.cache.lookup(key, pending_id=request.request_key)
            if hit is not None:
                return answered_from(routed, hit, f"cache_hit:{routed.route_reason}")
            if self.semantic is not None and semantic_eligible(request, self.policy):
                probe = await self.semantic.lookup(request, model)
                if probe.answer is not None:
                    reason = f"{SEMANTIC_HIT}:{probe.similarity:.3f}:{routed.route_reason}"
                    return answered_from(routed, probe.answer, reason)
                await self.semantic.remember_pending(request.request_key, key, request.tenant, model, probe.vector)
            if self.coalescer is not None and self.policy.coalesce.enabled:
                leader_id = await self.coalescer.join(key, routed)
                if leader_id is not None:
                    return RouteOutcome(parked_behind=leader_id)
        shadows = self._shadows(routed)
        # The primary's result names the experiments that mirrored it, so the comparator holds it for their
        # copies whatever it has read of those experiments since (a copy whose id was hashed joins nothing).
        joinable = [e for s in shadows if (e := s.experiment_id) and s.request_id.endswith(f".shadow.{e}")]
        routed = routed.model_copy(update={"shadowed_by": joinable})
        return RouteOutcome(routed=routed, shadows=shadows)

    def _adapter_as_model(self, request: InferenceRequest) -> InferenceRequest:
        """`model` = base and `adapter` = a LoRA adapter of it is the same request as `model` = the adapter."""
        try:
            served = named_adapter(request.model, request.adapter, self.catalog.adapters)
        except AdapterNotServed as refused:
            raise Refused(ErrorCode.MODEL_UNAVAILABLE, str(refused)) from refused
        return request if served is None else request.model_copy(update={"model": served})

    def release_of(self, model: str) -> ReleaseContext | None:
        """A request's release outside an A/B split: a release in its shadow step (the request is on the
        control's side of it), else the release the model's serving version came with."""
        ongoing = self.experiments.release_for(model)
        in_progress = context_for(ongoing, CONTROL) if ongoing is not None else None
        return in_progress or self.catalog.release_of(model)

    def _stamp_target(self, request: InferenceRequest, model: str) -> InferenceRequest:
        """Record the tier and its TTFT target on the routed request (metadata, read by dashboards and tests)."""
        if self.latency is None:
            return request
        tier = self.tier_of(model)
        target = self.latency.target_ms(tier)
        stamp = {TIER_KEY: tier} | ({TARGET_KEY: str(int(target))} if target is not None else {})
        return request.model_copy(update={"metadata": request.metadata | stamp})

    def _shadows(self, routed: RoutedRequest) -> list[RoutedRequest]:
        copies = []
        for experiment in self.experiments.shadows_for(routed.model):
            if experiment.shadow_model is None or not in_shadow(experiment, unit_of(routed.request)):
                continue
            try:
                fitted = self.fit(routed.request, experiment.shadow_model)
            except Refused:
                continue  # the candidate can't take this one; the primary is unaffected
            counted = {"prompt_tokens_est": fitted.prompt_tokens, "prompt_tokenizer": fitted.tokenizer}
            base = routed.model_copy(update={"request": fitted.request} | counted)
            copy = shadow_copy(base, experiment, self.tier_of(experiment.shadow_model))
            copies.append(copy.model_copy(update={"adapter": self.catalog.adapter_of(copy.model, copy.release)}))
        return copies

    def _final_error(self, request: InferenceRequest, refused: Refused, received_at_ms: int) -> InferenceResult:
        return InferenceResult(
            request_id=request.request_id,
            tenant=request.tenant,
            status=ResultStatus.ERROR,
            error=refused.error,
            finish_reason=FinishReason.ERROR,
            model=request.model,
            timings=Timings(received_at_ms=received_at_ms, total_ms=float(now_ms() - received_at_ms)),
            produced_by=PRODUCED_BY,
            **self.request_facts(request, refused.reason) | {"release": refused.release},
        )


def answered_from(routed: RoutedRequest, hit: CachedAnswer, route_reason: str) -> RouteOutcome:
    """The request answered with text generated for another one (cache hit, coalesced): one content
    chunk, then the final one; billed as a cache hit (`cached`), never as a generation."""
    request = routed.request
    elapsed_ms = float(now_ms() - routed.received_at_ms)
    chunk = TokenChunk(
        request_id=request.request_id,
        tenant=request.tenant,
        seq=0,
        delta=hit.text,
        tokens=hit.usage.completion_tokens,
        model=hit.model,
    )
    result = InferenceResult(
        request_id=request.request_id,
        tenant=request.tenant,
        status=ResultStatus.OK,
        model=hit.model,
        text=hit.text,
        finish_reason=hit.finish_reason,
        usage=hit.usage,  # the tokens this hit saved: nothing was generated for them
        timings=Timings(received_at_ms=routed.received_at_ms, ttft_ms=elapsed_ms, total_ms=elapsed_ms),
        cached=True,
        experiment_id=routed.experiment_id,
        variant=routed.variant,
        trimmed_tokens=routed.trimmed_tokens,
        max_tokens_requested=routed.max_tokens_requested,
        produced_by=PRODUCED_BY,
        **routed.facts(route_reason),
    )
    return RouteOutcome(result=result, content_chunks=[chunk])
