"""The vLLM engine continues a cut answer (the CPU build, tiny random-weight Llama): the prompt's token ids, then
the answer so far, tokenized; greedy decoding then goes on exactly where the uncut answer went, for a prompt
and for a chat (its template's ids with the generation prompt)."""

from __future__ import annotations

from typing import Any

import pytest

from llmbus.contract.messages import ChatMessage, Continuation
from llmbus_services.engine_worker.adapters.engines import vllm_inputs
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from llmbus_services.engine_worker.core.continuation import continued
from llmbus_services.engine_worker.core.engine import EngineOutput, EngineRequest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

PROMPT = "the kafka broker keeps the topic partition offset for each consumer"
ANSWER_TOKENS = 16


async def _greedy_ids(engine: VllmEngine, engine_input: Any) -> list[int]:
    """An uncut greedy answer's token ids, from vLLM directly."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=ANSWER_TOKENS, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
    )
    final = None
    async for out in engine._llm.generate(engine_input, params, f"reference-{id(engine_input)}"):
        final = out
    assert final is not None
    return list(final.outputs[0].token_ids)


def _cut(engine: VllmEngine, ids: list[int]) -> int:
    """A cut whose text the tokenizer gives back as the same ids: from there an uncut and a continued greedy
    answer read the very same tokens, so they must go on alike."""
    tokenizer = engine._tokenizer
    for cut in range(ANSWER_TOKENS // 2, 1, -1):
        if tokenizer.encode(tokenizer.decode(ids[:cut]), add_special_tokens=False) == ids[:cut]:
            return cut
    pytest.skip("no cut of this answer round-trips through the tokenizer")


async def _text(engine: VllmEngine, request: EngineRequest) -> tuple[str, list[EngineOutput]]:
    outs = [out async for out in engine.generate(request)]
    return "".join(out.delta for out in outs), outs


@pytest.mark.parametrize("chat", [False, True], ids=["prompt", "chat"])
async def test_a_continued_answer_goes_on_where_the_uncut_one_went(vllm_engine: VllmEngine, chat: bool) -> None:
    messages = (ChatMessage(role="user", content=PROMPT),) if chat else ()
    request = EngineRequest(
        f"cont-{chat}", PROMPT, max_tokens=ANSWER_TOKENS, temperature=0.0, messages=messages, seed=7
    )
    if chat:
        engine_input = await vllm_inputs.render_chat(vllm_engine._llm.renderer, messages)
    else:
        (engine_input,) = vllm_engine._llm.renderer.render_cmpl([{"prompt_token_ids": vllm_engine._encode(PROMPT)}])
    prompt_tokens = len(engine_input["prompt_token_ids"])
    ids = await _greedy_ids(vllm_engine, engine_input)
    uncut, _ = await _text(vllm_engine, request)
    cut = _cut(vllm_engine, ids)
    so_far = vllm_engine._tokenizer.decode(ids[:cut])
    assert uncut.startswith(so_far)  # what a client was sent of the uncut answer, up to the cut

    so_far_sent = Continuation(text=so_far, completion_tokens=cut, next_seq=3, continues_attempt=1)
    rest, outs = await _text(vllm_engine, continued(request, so_far_sent))
    assert so_far + rest == uncut  # no span repeated, none missing
    last = outs[-1]
    assert last.finished and last.finish_reason == "length"
    assert last.completion_tokens == ANSWER_TOKENS - cut  # what was left of max_tokens
    assert last.prompt_tokens == prompt_tokens + cut  # the prompt, then the answer so far
