"""Synthetic labelled prompts: template families crossed with slot fillers, labelled by the family's rule.

Labelling rule (the same for every source, see llmbus_tools/router_training/data/README.md):
- "high": answering well needs several dependent steps of reasoning — a design under
  constraints, a proof or derivation, debugging from symptoms, a trade-off analysis, a plan
  with ordering and risks, code whose correctness hinges on concurrency/complexity bounds.
- "low": recall, a mechanical edit, a short rewrite, or a single obvious step.

Each family is one template; held-out splits are by family, so a test prompt never shares
its template with a training prompt. Some families are deliberately adversarial: "low"
prompts that use reasoning words ("explain what X is") and "high" prompts that avoid them.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

_LANGS = ["Python", "Go", "Rust", "TypeScript", "Java", "C++"]
_THINGS = ["a linked list", "a binary heap", "a trie", "an LRU cache", "a ring buffer", "a bloom filter"]
_SYSTEMS = [
    "a URL shortener",
    "a chat service",
    "a payment ledger",
    "a feature-flag service",
    "a job queue",
    "a metrics pipeline",
    "a search autocomplete",
    "a multi-tenant billing system",
]
_WORDS = ["ephemeral", "ubiquitous", "serendipity", "idempotent", "latency", "quorum", "entropy", "heuristic"]
_CITIES = ["France", "Japan", "Kenya", "Peru", "Canada", "Norway", "Egypt", "Vietnam"]
_TARGET_LANGS = ["French", "German", "Spanish", "Japanese", "Italian", "Portuguese"]
_IDENTS = ["tmp", "x", "data", "res", "val", "cnt", "buf", "obj"]
_NEW_IDENTS = ["retry_count", "user_ids", "payload", "result_rows", "timeout_s", "page_size"]
_STORES = ["Postgres", "MySQL", "Redis", "Kafka", "Cassandra", "DynamoDB", "Elasticsearch"]
_SYMPTOMS = [
    "p99 latency doubled",
    "memory grows until OOM",
    "requests time out every night at 02:00",
    "duplicate messages appear after a broker restart",
    "the service deadlocks under load",
    "CPU is pegged at 100% with low traffic",
]
_CHANGES = [
    "we enabled TLS",
    "we moved to read replicas",
    "we upgraded the client library",
    "we switched to async I/O",
    "we added a connection pool",
    "we doubled the replicas",
]
_MATH_N = ["n", "2n+1", "n^2", "3n", "n(n+1)/2"]
_NUMS = ["12", "48", "365", "1024", "7", "99"]
_TOPICS = ["photosynthesis", "TCP", "inflation", "a hash map", "DNS", "garbage collection", "the CAP theorem"]
_DOCS = ["incident postmortem", "quarterly report", "RFC", "design doc", "contract", "research paper"]


@dataclass(frozen=True)
class Family:
    name: str
    label: str
    category: str
    template: str
    slots: tuple[list[str], ...]
    turns: int = 1  # user turns in the conversation


FAMILIES: list[Family] = [
    # ---- low ----
    Family("typo", "low", "quick_edit", "Fix the typo in this comment: `# retrun the {0} value`", (_WORDS,)),
    Family(
        "rename",
        "low",
        "quick_edit",
        "Rename `{0}` to `{1}` in this snippet:\n\ndef f({0}):\n    return {0} + 1",
        (_IDENTS, _NEW_IDENTS),
    ),
    Family("translate_word", "low", "writing", "Translate '{0}' into {1}.", (_WORDS, _TARGET_LANGS)),
    Family("capital", "low", "qa", "What is the capital of {0}?", (_CITIES,)),
    Family("define", "low", "qa", "Define the word {0} in one sentence.", (_WORDS,)),
    Family("explain_simple", "low", "qa", "Explain what {0} is to a ten-year-old, briefly.", (_TOPICS,)),
    Family("convert", "low", "qa", "Convert {0} minutes to hours and minutes.", (_NUMS,)),
    Family("tab", "low", "tab_completion", "for i in range({0}):\n    total += ", (_NUMS,)),
    Family("tab2", "low", "tab_completion", "def get_{0}(self):\n    return self.", (_NEW_IDENTS,)),
    Family(
        "docstring",
        "low",
        "quick_edit",
        "Add a docstring to this {0} function that returns {1}.",
        (_LANGS, _NEW_IDENTS),
    ),
    Family("hello", "low", "chat", "Hi! Can you say hello in {0}?", (_TARGET_LANGS,)),
    Family(
        "thanks",
        "low",
        "chat",
        "Thanks, that worked for {0}. Anything else I should {1}?",
        (_THINGS, ["know", "check", "read"]),
    ),
    Family("one_line_code", "low", "code", "Write a one-line {0} expression that reverses a string.", (_LANGS,)),
    Family(
        "simple_code",
        "low",
        "code",
        "Write a {0} function that returns the maximum of a list of {1} numbers.",
        (_LANGS, _NUMS),
    ),
    Family("summary_short", "low", "summarization", "Summarize this paragraph about {0} in one sentence.", (_TOPICS,)),
    Family("uppercase", "low", "quick_edit", "Make every constant in this {0} file uppercase.", (_LANGS,)),
    Family("sql_simple", "low", "code", "Write a SQL query that counts rows in the `{0}` table.", (_NEW_IDENTS,)),
    Family("why_simple", "low", "qa", "Why is {0} called that? One sentence is enough.", (_TOPICS,)),
    Family("followup_low", "low", "chat", "And what about {0}?", (_CITIES,), turns=3),
    Family("list_ideas", "low", "writing", "Give me three names for {0}.", (_SYSTEMS,)),
    Family(
        "format_json",
        "low",
        "quick_edit",
        'Reformat this JSON with two-space indentation: {{"{0}": {1}}}',
        (_NEW_IDENTS, _NUMS),
    ),
    Family("synonym", "low", "writing", "Give a synonym for {0}.", (_WORDS,)),
    # ---- high ----
    Family(
        "design",
        "high",
        "analysis",
        "Design {0} backed by {1}. Requirements: multi-region, at most 100 ms p99 reads, "
        "no lost writes on failover. Explain the trade-offs of your choices.",
        (_SYSTEMS, _STORES),
    ),
    Family(
        "debug_symptom",
        "high",
        "code",
        "Since {1}, {0} in our {2} service. Find the root cause and propose a fix we can roll out safely.",
        (_SYMPTOMS, _CHANGES, _LANGS),
    ),
    Family(
        "impl_constrained",
        "high",
        "code",
        "Implement {0} in {1} that is thread-safe, runs in O(log n) per operation, and must not allocate "
        "on the hot path. Include tests for the edge cases.",
        (_THINGS, _LANGS),
    ),
    Family(
        "prove",
        "high",
        "math",
        "Prove by induction that the sum of the first {0} odd numbers is a perfect square, then derive "
        "a closed form for the sum of {1} terms.",
        (_MATH_N, _NUMS),
    ),
    Family(
        "probability",
        "high",
        "math",
        "A fair die is rolled until {0} sixes appear in a row. What is the expected number of rolls? "
        "Derive it step by step.",
        (["two", "three", "four"],),
    ),
    Family(
        "compare_stores",
        "high",
        "analysis",
        "Compare {0} and {1} for {2}: consistency, failure modes, cost at 50k writes/s, and operational "
        "burden. Recommend one and justify it.",
        (_STORES, _STORES, _SYSTEMS),
    ),
    Family(
        "migration",
        "high",
        "analysis",
        "Write a migration plan to move {0} from {1} to {2} without downtime. Cover ordering, dual writes, "
        "backfill, rollback and how to verify each step.",
        (_SYSTEMS, _STORES, _STORES),
    ),
    Family(
        "review_diff",
        "high",
        "code",
        "Review this {0} pull request for bugs, security issues and race conditions, and suggest concrete "
        "changes:\n\n```diff\n- lock.acquire()\n+ if not cache.get(key):\n+     cache.set(key, load({1}))\n```",
        (_LANGS, _NEW_IDENTS),
    ),
    Family(
        "recurrence",
        "high",
        "math",
        "Solve the recurrence T(n) = {0}T(n/{1}) + n log n, state which case of the master theorem applies "
        "and why, then verify with a recursion tree.",
        (["2", "3", "4", "8"], ["2", "3", "4"]),
    ),
    Family(
        "long_summary",
        "high",
        "summarization",
        "Summarize the attached {1}-page {0} for executives: the decisions it forces, the risks, "
        "and what we must do first, second and third.",
        (_DOCS, _NUMS),
    ),
    Family(
        "translate_hard",
        "high",
        "writing",
        "Translate this {0}-paragraph legal notice into {1}, keeping defined terms consistent, adapting "
        "dates and currency to local conventions, and flag any clause that has no equivalent.",
        (["three", "five", "eight"], _TARGET_LANGS),
    ),
    Family(
        "capacity",
        "high",
        "analysis",
        "We serve {0} requests per second with {1} replicas; each replica is available 99.5% of the time "
        "and we need 6 up. What is the probability of an outage per month, and how many replicas do we "
        "need for 99.99%? Show your working.",
        (_NUMS, ["8", "10", "12"]),
    ),
    Family(
        "no_keywords_high",
        "high",
        "code",
        "Our {0} cache in {1} returns stale entries for a few seconds after a deploy, only on some pods, "
        "and only when traffic is high. Walk me through what could cause that and how you would confirm each idea.",
        (_STORES, _LANGS),
    ),
    Family(
        "arch_review",
        "high",
        "analysis",
        "Here is our architecture for {0}: API gateway, three services, {1} for state, a cron job for "
        "reconciliation. Where will it break first at 10x load, and what should we change in which order?",
        (_SYSTEMS, _STORES),
    ),
    Family(
        "optimize_sql",
        "high",
        "code",
        "This query over 300M rows in {0} takes 40 s; the table has an index on (tenant_id, created_at). "
        "Explain the plan, why it is slow, and rewrite it so it runs under 200 ms.",
        (_STORES,),
    ),
    Family(
        "followup_high",
        "high",
        "analysis",
        "Given everything above about {0}, now redesign it so that a region can fail without losing "
        "writes, and tell me what that costs us in latency.",
        (_SYSTEMS,),
        turns=4,
    ),
    Family(
        "algorithm",
        "high",
        "code",
        "Given an array of n integers and k={0}, count the contiguous subarrays whose sum is divisible by k "
        "in O(n) time and O(k) memory. Explain why the approach is correct, then implement it in {1}.",
        (_NUMS, _LANGS),
    ),
    Family(
        "strategy",
        "high",
        "analysis",
        "Should we build or buy {0}? We have {1} engineers, strict EU data residency and a 6-month deadline. "
        "Evaluate the options and the risks.",
        (_SYSTEMS, _NUMS),
    ),
    Family(
        "linear_algebra",
        "high",
        "math",
        "Let A be a real symmetric matrix with eigenvalues 1, {0} and {1}. Show that A is positive definite "
        "and compute det(A^-1) and trace(A^2).",
        (["2", "3", "5"], ["4", "7", "9"]),
    ),
]


def family_rows(family: Family, seed: int, cap: int = 48) -> list[dict]:
    combos = list(itertools.product(*family.slots))
    random.Random(f"{seed}:{family.name}").shuffle(combos)
    rows = []
    for i, combo in enumerate(combos[:cap]):
        rows.append(
            {
                "id": f"syn-{family.name}-{i:03d}",
                "prompt": family.template.format(*combo),
                "label": family.label,
                "category": family.category,
                "turns": family.turns,
                "group": f"syn:{family.name}",
                "source": "synthetic",
            }
        )
    return rows


def synthetic_rows(seed: int = 0, cap_per_family: int = 48) -> list[dict]:
    return [row for family in FAMILIES for row in family_rows(family, seed, cap_per_family)]
