"""What an openai-http upstream receives: what the request sets, nothing it leaves unset, each as the
upstream takes it (its max_tokens parameter, the developer role, the parameters it refuses)."""

from __future__ import annotations

from llmbus.contract.engine_features import ENGINE_FEATURES
from llmbus.contract.messages import ChatMessage, Continuation, ImageContent, ImageUrl, TextContent
from llmbus_services.engine_worker.adapters.engines.openai_body import request_body
from llmbus_services.engine_worker.adapters.engines.openai_continuation import continued_body
from llmbus_services.engine_worker.adapters.engines.openai_http import OpenAIHttpEngine
from llmbus_services.engine_worker.adapters.engines.openai_http_config import Continuation as Mode
from llmbus_services.engine_worker.adapters.engines.openai_http_config import OpenAIHttpConfig
from llmbus_services.engine_worker.core.continuation import continued
from llmbus_services.engine_worker.core.engine import EngineRequest

CONFIG = OpenAIHttpConfig(base_url="http://upstream/v1", model="m")
CHAT = (ChatMessage(role="developer", content="terse"), ChatMessage(role="user", content="hi"))


def test_unset_parameters_are_not_sent_and_an_unset_bound_neither() -> None:
    body = request_body(EngineRequest("r", "p", max_tokens=16_384, max_tokens_auto=True, messages=CHAT), True, CONFIG)
    assert set(body) == {"model", "stream", "stream_options", "messages"}
    bounded = request_body(EngineRequest("r", "p", max_tokens=7, messages=CHAT), True, CONFIG)
    assert bounded["max_tokens"] == 7


def test_each_parameter_as_the_api_names_it_and_as_the_upstream_takes_it() -> None:
    request = EngineRequest(
        "r", "p", max_tokens=7, messages=CHAT, n=2, logprobs=True, top_logprobs=3, top_k=4, presence_penalty=0.1
    )
    chat = request_body(request, True, CONFIG.model_copy(update={"max_tokens_param": "max_completion_tokens"}))
    assert chat["max_completion_tokens"] == 7 and "max_tokens" not in chat
    assert (chat["n"], chat["logprobs"], chat["top_logprobs"], chat["top_k"], chat["presence_penalty"]) == (
        2,
        True,
        3,
        4,
        0.1,
    )
    assert [m["role"] for m in chat["messages"]] == ["system", "user"]  # developer_role off: as system
    passed = request_body(request, True, CONFIG.model_copy(update={"developer_role": True}))
    assert [m["role"] for m in passed["messages"]] == ["developer", "user"]
    legacy = request_body(EngineRequest("r", "p", max_tokens=7, logprobs=True, top_logprobs=2), False, CONFIG)
    assert legacy["logprobs"] == 2 and legacy["max_tokens"] == 7  # the completions API: a count


def test_image_parts_go_as_the_content_and_refused_parameters_are_not_offered() -> None:
    image = ImageContent(image_url=ImageUrl(url="https://example.invalid/cat.png"))
    look = ChatMessage(role="user", content="what?", content_parts=[TextContent(text="what?"), image])
    body = request_body(EngineRequest("r", "p", max_tokens=2, messages=(look,)), True, CONFIG)
    assert body["messages"][0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "https://example.invalid/cat.png"},
    }
    engine = OpenAIHttpEngine(CONFIG.model_copy(update={"refuses": ["top_k", "min_p"]}))
    assert engine.features == ENGINE_FEATURES["openai-http"] - {"top_k", "min_p"}


def test_a_cut_answer_goes_upstream_as_its_continuation_setting_says() -> None:
    """The next leg sends the answer so far for the upstream to go on from, the rest of max_tokens, the same
    sampling parameters and seed; a chat upstream set to `none` does not continue (the next attempt restarts)."""
    so_far = Continuation(text=" the answer so", completion_tokens=3, next_seq=2, continues_attempt=1)
    request = EngineRequest("r", "p", max_tokens=10, messages=CHAT, temperature=0.8, seed=5)
    leg = continued(request, so_far)

    def body(how: Mode, chat: bool = True) -> dict:  # type: ignore[type-arg]
        sent = request_body(leg, chat, CONFIG)
        continued_body(sent, so_far.text, how, chat)
        return sent

    served = body("continue_final_message")
    assert served["messages"][-1] == {"role": "assistant", "content": " the answer so"}
    assert served["continue_final_message"] is True and served["add_generation_prompt"] is False
    assert (served["max_tokens"], served["temperature"], served["seed"]) == (7, 0.8, 5)
    assert body("prefix")["messages"][-1] == {"role": "assistant", "content": " the answer so", "prefix": True}
    assert body("none", chat=False)["prompt"] == "p the answer so"  # a completions API always can: after the prompt
    assert not OpenAIHttpEngine(CONFIG).can_continue(leg)
    assert OpenAIHttpEngine(CONFIG.model_copy(update={"continuation": "prefix"})).can_continue(leg)


def test_the_tenants_cache_salt_goes_only_to_an_upstream_configured_as_salted() -> None:
    """By the upstreams file (`prompt_cache`) or by environment (LLMBUS_WORKER_OPENAI_PROMPT_CACHE)."""
    from llmbus_services.engine_worker.adapters.engines.openai_http_config import openai_config
    from llmbus_services.engine_worker.config import WorkerSettings

    request = EngineRequest("r", "p", max_tokens=7, messages=CHAT, cache_salt="salt-of-acme")
    assert "cache_salt" not in request_body(request, True, CONFIG)  # shared (a hosted provider's cache)
    salted = WorkerSettings(model="m", engine="openai-http", openai_prompt_cache="salted")
    assert request_body(request, True, openai_config(salted))["cache_salt"] == "salt-of-acme"
    assert openai_config(WorkerSettings(model="m", engine="openai-http")).prompt_cache == "shared"
