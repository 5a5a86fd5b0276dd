"""Context trimming to the target model's window (pure).

Budget = max_model_len - max_tokens (the answer must fit too). The prompt is the turns, the
generation prompt and what the model's chat template and tool definitions add (`fixed_tokens`, never
trimmed). When it is over budget, the rule is:

1. every system and developer message is kept (instructions outrank history), in place;
2. then the newest non-system turns are kept, walking back from the last one, while
   they fit; the first turn that does not fit ends the walk — older turns are never
   kept past a gap, so the kept history is a contiguous, most-recent suffix;
3. leading assistant / tool turns of that suffix are dropped, so the model sees the
   history start at a user turn (an answer without its question misleads);
4. if the system messages plus the last turn alone do not fit, nothing sensible is
   left to send: the request is refused with prompt_too_long. A plain `prompt` is
   never cut (there are no turns to drop); it is refused the same way.

Token counts use the model's tokenizer where the catalog knows it, else llmbus.tokens'
per-script estimate, on each turn as rendered by InferenceRequest.prompt_text (the per-turn sum
is an upper bound of the whole for the estimate, and within a token per turn for a BPE tokenizer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmbus.contract.messages import GENERATION_PROMPT, ChatMessage, InferenceRequest
from llmbus.tokens import estimate_tokens


def turn_tokens(message: ChatMessage, count: Callable[[str], int] = estimate_tokens) -> int:
    return count(message.rendered())


@dataclass(frozen=True)
class TrimResult:
    messages: list[ChatMessage]
    trimmed_tokens: int
    prompt_tokens: int
    fits: bool


def trim_to_window(
    request: InferenceRequest,
    max_model_len: int,
    max_tokens: int,
    count: Callable[[str], int] = estimate_tokens,
    fixed_tokens: int = 0,
) -> TrimResult:
    """`fixed_tokens`: what the model reads besides the turns (chat template, tool definitions)."""
    budget_tokens = max_model_len - max_tokens
    if request.prompt is not None:
        tokens = count(request.prompt) + fixed_tokens
        return TrimResult([], 0, tokens, tokens <= budget_tokens)
    counts = [turn_tokens(m, count) for m in request.messages]
    generation_prompt_tokens = count(GENERATION_PROMPT) + fixed_tokens
    total = sum(counts) + generation_prompt_tokens
    if total <= budget_tokens:
        return TrimResult(list(request.messages), 0, total, True)

    used = sum(c for m, c in zip(request.messages, counts, strict=True) if m.instructs)
    used += generation_prompt_tokens
    keep = [m.instructs for m in request.messages]
    for i in range(len(request.messages) - 1, -1, -1):
        if keep[i]:
            continue
        if used + counts[i] > budget_tokens:
            break
        keep[i] = True
        used += counts[i]
    # Drop leading assistant/tool turns of the kept history (rule 3).
    for i, m in enumerate(request.messages):
        if not keep[i] or m.instructs:
            continue
        if m.role == "user":
            break
        keep[i] = False
        used -= counts[i]
    kept = [m for m, k in zip(request.messages, keep, strict=True) if k]
    has_turn = any(not m.instructs for m in kept)
    return TrimResult(kept, total - used, used, has_turn and used <= budget_tokens)
