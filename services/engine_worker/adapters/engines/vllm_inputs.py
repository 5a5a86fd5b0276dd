"""What the vLLM engine hands to AsyncLLM: a chat rendered by the model's template, warm-up prompts.

The chat goes through vLLM's own renderer with the parameters `LLM.chat` uses (vllm/entrypoints/
common/offline.py): the tokenizer's chat template with the generation prompt, rendered to text,
then tokenized without adding special tokens again (the template writes BOS itself). So a chat
reaches the model as exactly `tokenizer.apply_chat_template(messages, add_generation_prompt=True)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from llmbus.contract.messages import ChatMessage

WARMUP_OUTPUT_TOKENS = 8  # decode steps per warm-up iteration, after its prefill


def chat_conversation(messages: Sequence[ChatMessage], developer_role: bool = True) -> list[dict[str, Any]]:
    """Every field the message carries (role, content, and names or tool calls where the model has them):
    system and tool turns reach the template as the client sent them. A `developer` turn reaches a
    template that does not know the role as `system` (`developer_role` False), which is what it is for
    such models; the text-only engine never sees image parts (the worker refuses them)."""
    turns = [m.model_dump(mode="json", exclude_none=True, exclude={"content_parts"}) for m in messages]
    if not developer_role:
        for turn in turns:
            if turn["role"] == "developer":
                turn["role"] = "system"
    return turns


async def render_chat(
    renderer: Any,
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
    reasoning_effort: str | None = None,
    developer_role: bool = True,
) -> Any:
    """The engine input (with `prompt_token_ids`) of a chat, rendered by the model's chat template.

    `tools` (OpenAI's tool definitions) reach the template as its `tools` variable, as vLLM's
    OpenAI server passes them (vllm/renderers/online_renderer.py, preprocess_chat); `reasoning_effort`
    as its variable of that name and `enable_thinking` (effort other than "none"), as vLLM's server
    passes them (ChatCompletionRequest.build_chat_params)."""
    from vllm.renderers.params import ChatParams

    kwargs: dict[str, Any] = {"add_generation_prompt": True, "continue_final_message": False, "tokenize": False}
    if tools:
        kwargs["tools"] = tools
    if reasoning_effort is not None:
        kwargs |= {"reasoning_effort": reasoning_effort, "enable_thinking": reasoning_effort != "none"}
    params = ChatParams(chat_template_kwargs=kwargs)
    # No length limit here: the engine's admission check judges the rendered length, as for a prompt.
    tok_params = dataclasses.replace(renderer.default_chat_tok_params, max_total_tokens=None)
    conversation = chat_conversation(messages, developer_role)
    _, (engine_input,) = await renderer.render_chat_async([conversation], params, tok_params)
    return engine_input


def warmup_plan(tokenizer: Any, iterations: int, prompt_tokens: int, max_model_len: int) -> list[list[int]]:
    """`iterations` prompts of `prompt_tokens` ordinary token ids each, no two sharing a first KV block
    (so none is served from the prefix cache of another).

    Capped so that prompt + the warm-up's output fits the model length.
    """
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    ordinary = [i for i in range(len(tokenizer)) if i not in special]
    n = max(1, min(prompt_tokens, max_model_len - WARMUP_OUTPUT_TOKENS))
    # A different stride per iteration: the prompts differ from their first tokens on.
    return [[ordinary[(j * (it + 1) + it) % len(ordinary)] for j in range(n)] for it in range(iterations)]
