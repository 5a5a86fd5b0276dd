"""The gateway's pure parts: OpenAI bodies to requests, response shapes, errors (retries: test_gateway_retries.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmbus.contract.engine_features import missing_features
from llmbus.contract.messages import (
    ErrorCode,
    ErrorInfo,
    FinishReason,
    InferenceRequest,
    ModelSpec,
    TokenLogprob,
    TopLogprob,
    Usage,
    WorkerState,
    WorkerStatus,
)
from llmbus_services.gateway.adapters.catalog import ModelCatalog
from llmbus_services.gateway.core import errors
from llmbus_services.gateway.core.hints import BadHint, routing_hints
from llmbus_services.gateway.core.openai_types import ChatCompletionBody, CompletionBody, Unsupported
from llmbus_services.gateway.core.translate import ChoiceOut, ResponseShape, to_request


def test_chat_body_becomes_a_request_of_the_keys_tenant() -> None:
    body = ChatCompletionBody.model_validate(
        {
            "model": "sim-llama-8b",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
            ],
            "max_completion_tokens": 12,
            "temperature": 0,
            "stop": "END",
            "user": "u1",
            "tenant": "evil",  # not an OpenAI field: ignored, the tenant comes from the key
        }
    )
    req = to_request(body, request_id="r1", tenant="acme", reply_topic="llm.replies.gw-1", auto_model="auto")
    assert req.tenant == "acme" and req.reply_topic == "llm.replies.gw-1" and req.request_id == "r1"
    # `developer` travels as sent: each engine passes it on or turns it into `system` (its README's table)
    assert [(m.role, m.content) for m in req.messages] == [("developer", "be brief"), ("user", "hi there")]
    assert req.max_tokens == 12 and req.temperature == 0.0 and req.stop == ["END"] and req.user_id == "u1"
    assert req.model == "sim-llama-8b"
    assert req.top_p is None and req.n is None and req.presence_penalty is None  # unset stays unset


def test_every_parameter_the_body_sets_reaches_the_request_and_no_other() -> None:
    body = ChatCompletionBody.model_validate(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                    ],
                }
            ],
            "n": 2,
            "logprobs": True,
            "top_logprobs": 3,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "logit_bias": {"50256": -100},
            "reasoning_effort": "low",
            "top_k": 20,
            "min_p": 0.1,
            "repetition_penalty": 1.1,
        }
    )
    body.check_supported()
    req = to_request(body, request_id="r", tenant="t", reply_topic="llm.replies.x", auto_model="auto")
    assert (req.n, req.logprobs, req.top_logprobs) == (2, True, 3)
    assert (req.presence_penalty, req.frequency_penalty, req.logit_bias) == (0.5, -0.5, {"50256": -100.0})
    assert (req.reasoning_effort, req.top_k, req.min_p, req.repetition_penalty) == ("low", 20, 0.1, 1.1)
    assert req.temperature is None and req.top_p is None and req.seed is None
    [message] = req.messages
    assert message.content == "what is this?" and message.images == 1
    assert req.engine_features() == {
        "n", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "reasoning_effort", "top_k",
        "min_p", "repetition_penalty", "image_url",
    }  # fmt: skip
    # neutral values ask for nothing an engine must honour
    neutral = InferenceRequest(prompt="x", n=1, logprobs=False, presence_penalty=0.0, top_k=-1, min_p=0.0)
    assert neutral.engine_features() == set()


def test_completions_logprobs_is_the_count_of_alternatives() -> None:
    body = CompletionBody.model_validate({"model": "m", "prompt": "x", "logprobs": 2, "best_of": 3, "n": 3})
    body.check_supported()
    req = to_request(body, request_id="r", tenant="t", reply_topic="llm.replies.x", auto_model="auto")
    assert (req.logprobs, req.top_logprobs, req.n) == (True, 2, 3)


def test_auto_model_lets_the_router_choose_and_completion_defaults() -> None:
    body = CompletionBody.model_validate({"model": "auto", "prompt": ["once upon"]})
    body.check_supported()
    req = to_request(body, request_id="r2", tenant="t", reply_topic="llm.replies.x", auto_model="auto")
    assert req.model is None and req.prompt == "once upon" and req.max_tokens == 16


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"top_logprobs": 2}, "top_logprobs"),  # OpenAI's rule: only with logprobs
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),  # only with tools
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "messages"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_unsupported_parameters_are_refused_by_name(body: dict[str, object], param: str) -> None:
    parsed = ChatCompletionBody.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]} | body)
    with pytest.raises(Unsupported) as caught:
        parsed.check_supported()
    assert caught.value.param == param


def test_limits_of_the_bus_surface_as_validation_errors() -> None:
    body = ChatCompletionBody.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5_000_000}
    )
    with pytest.raises(ValidationError):
        to_request(body, request_id="r", tenant="t", reply_topic="llm.replies.x", auto_model="auto")
    with pytest.raises(ValidationError):
        ChatCompletionBody.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}
        )


def test_stream_shapes_follow_openai() -> None:
    shape = ResponseShape("chat", "abc", 1700000000, "sim")
    first = shape.stream_chunk(ChoiceOut(0, "Hel"), first=True, include_usage=True)
    assert first["id"] == "chatcmpl-abc" and first["object"] == "chat.completion.chunk" and first["usage"] is None
    assert first["choices"] == [
        {"index": 0, "delta": {"content": "Hel", "role": "assistant"}, "logprobs": None, "finish_reason": None}
    ]
    usage = shape.usage_chunk(Usage(prompt_tokens=5, completion_tokens=3, cached_prompt_tokens=2))
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    text = ResponseShape("completion", "abc", 1, "sim").full([ChoiceOut(0, "hi", finish="length")], None)
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "hi"  # type: ignore[index]
    second = shape.stream_chunk(ChoiceOut(1, "lo", finish="stop"), first=True, include_usage=False)
    assert second["choices"] == [
        {"index": 1, "delta": {"content": "lo", "role": "assistant"}, "logprobs": None, "finish_reason": "stop"}
    ]


def test_logprobs_take_the_shape_of_each_api() -> None:
    entry = TokenLogprob(token="Hi", logprob=-0.5, bytes=[72, 105], top_logprobs=[TopLogprob(token="Hi", logprob=-0.5)])
    chat = ResponseShape("chat", "a", 1, "m", logprobs=True).full([ChoiceOut(0, "Hi", None, [entry], "stop")], None)
    [choice] = chat["choices"]  # type: ignore[misc]
    alternative = {"token": "Hi", "logprob": -0.5, "bytes": None}
    assert choice["logprobs"] == {  # type: ignore[index]
        "content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": [alternative]}],
        "refusal": None,
    }
    legacy = ResponseShape("completion", "a", 1, "m", logprobs=True).full(
        [ChoiceOut(0, "Hi", None, [entry, entry])], None
    )
    assert legacy["choices"][0]["logprobs"] == {  # type: ignore[index]
        "tokens": ["Hi", "Hi"],
        "token_logprobs": [-0.5, -0.5],
        "top_logprobs": [{"Hi": -0.5}, {"Hi": -0.5}],
        "text_offset": [0, 2],
    }


def test_error_codes_map_to_openai_statuses_with_retry_after() -> None:
    limited = errors.from_error_info(ErrorInfo.of(ErrorCode.RATE_LIMITED, "slow down", retry_after_ms=2500))
    assert limited.status == 429 and limited.headers() == {"Retry-After": "3"} and limited.code == "rate_limit_exceeded"
    no_worker = errors.from_error_info(ErrorInfo.of(ErrorCode.MODEL_UNAVAILABLE, "nobody"))
    assert no_worker.status == 503 and no_worker.headers() == {"Retry-After": "5"}  # the contract's default
    assert errors.from_error_info(ErrorInfo.of(ErrorCode.PROMPT_TOO_LONG, "long")).status == 400
    assert errors.from_error_info(ErrorInfo.of(ErrorCode.WORKER_LOST, "gone")).status == 503
    body = errors.model_not_found("nope").body()
    assert body == {
        "error": {
            "message": "The model `nope` does not exist.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def test_catalog_lists_declared_and_served_models() -> None:
    catalog = ModelCatalog(worker_stale_s=30)
    catalog.specs["declared"] = ModelSpec(name="declared", version="7", tier="mid")

    def status(wid: str, model: str, sent_at_ms: int, state: WorkerState = WorkerState.READY) -> WorkerStatus:
        return WorkerStatus(
            worker_id=wid, node_id="n", state=state, engine="sim", models=[model], sent_at_ms=sent_at_ms
        )

    catalog.workers = {
        "a": status("a", "served", 100_000),
        "b": status("b", "gone", 10_000),
        "c": status("c", "stopped", 100_000, WorkerState.STOPPED),
        "d": status("d", "failed-start", 100_000, WorkerState.FAILED),  # its start failed: it exited
    }
    listing = {m["id"]: m for m in catalog.listing(at_ms=101_000)}
    assert set(listing) == {"declared", "served"}
    assert listing["declared"]["llmbus"]["version"] == "7"  # type: ignore[index]
    assert listing["served"]["llmbus"]["workers_ready"] == 1  # type: ignore[index]
    assert catalog.knows("gone") and not catalog.knows("never-heard-of")


def test_finish_reason_is_kept() -> None:
    from llmbus_services.gateway.core.translate import finish_reason

    assert finish_reason(FinishReason.LENGTH) == "length" and finish_reason(FinishReason.STOP) == "stop"


def _chat(**more: object) -> ChatCompletionBody:
    return ChatCompletionBody.model_validate({"model": "auto", "messages": [{"role": "user", "content": "x"}]} | more)


def _request(body: ChatCompletionBody | CompletionBody, headers: dict[str, str] | None = None) -> InferenceRequest:
    hints = routing_hints(body, headers or {})
    return to_request(body, request_id="r", tenant="t", reply_topic="llm.replies.x", auto_model="auto", hints=hints)


def test_routing_hints_from_extra_body_fields_and_headers() -> None:
    req = _request(_chat(category="quick_edit", token_budget=4000, session_id="s-1", priority=2))
    assert (req.category, req.token_budget, req.session_id, req.priority) == ("quick_edit", 4000, "s-1", 2)
    headers = {
        "x-llmbus-category": "tab_completion",
        "x-llmbus-token-budget": "900",
        "x-llmbus-session-id": "s-2",
        "x-llmbus-priority": "1",
        "x-llmbus-complexity": "0.9",
    }
    req = _request(_chat(), headers)
    assert (req.category, req.token_budget, req.session_id, req.priority) == ("tab_completion", 900, "s-2", 1)
    assert req.complexity == 0.9
    assert _request(_chat(category="quick_edit"), headers).category == "quick_edit"  # the body wins
    with pytest.raises(BadHint) as bad:
        _request(_chat(), {"x-llmbus-token-budget": "lots"})
    assert bad.value.header == "x-llmbus-token-budget"
    with pytest.raises(ValidationError):
        _request(_chat(), {"x-llmbus-priority": "12"})  # InferenceRequest's own range (0-9)


def test_a_clients_migration_limit_reaches_the_request_from_the_body_or_its_header() -> None:
    assert _request(_chat()).migration_limit is None  # the worker's default
    assert _request(_chat(migration_limit=1)).migration_limit == 1  # never continued
    assert _request(_chat(), {"x-llmbus-migration-limit": "6"}).migration_limit == 6
    with pytest.raises(ValidationError):
        _request(_chat(), {"x-llmbus-migration-limit": "17"})  # InferenceRequest's own range (1-16)


def test_chat_without_max_tokens_leaves_the_cap_to_the_router() -> None:
    req = _request(_chat())
    assert req.max_tokens_auto is True  # the router sets the model's output cap
    assert _request(_chat(max_tokens=7)).max_tokens_auto is None


def test_response_format_tools_and_suffix_travel_on_the_request() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    req = _request(
        _chat(
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            tool_choice="auto",
        )
    )
    assert req.response_format is not None and req.response_format.json_schema == {"name": "r", "schema": schema}
    assert req.tools and req.tool_choice == "auto" and req.engine_features() == {"response_format", "tools"}
    with pytest.raises(ValidationError):
        _chat(response_format={"type": "json_schema"})  # a schema is required
    with pytest.raises(ValidationError):
        _chat(response_format={"type": "xml"})
    fim = _request(CompletionBody.model_validate({"model": "auto", "prompt": "def f(", "suffix": "\n    return x"}))
    assert fim.suffix == "\n    return x" and fim.engine_features() == {"suffix"}
    assert _request(_chat(response_format={"type": "text"})).engine_features() == set()


def test_engine_features_decide_who_refuses() -> None:
    assert missing_features("sim", {"response_format", "suffix"}) == ["response_format"]
    assert missing_features("vllm", {"response_format"}) == []
    assert missing_features("vllm", {"tools", "suffix"}) == ["suffix"]
    assert missing_features("openai-http", {"response_format", "tools", "suffix"}) == []
    assert missing_features("unknown", {"suffix"}) == ["suffix"]
    catalog = ModelCatalog(worker_stale_s=30)
    catalog.workers = {
        "a": WorkerStatus(worker_id="a", node_id="n", state=WorkerState.READY, engine="sim", models=["m"]),
        "b": WorkerStatus(worker_id="b", node_id="n", state=WorkerState.READY, engine="vllm", models=["m", "v"]),
    }
    assert {w.engine for w in catalog.serving("m")} == {"sim", "vllm"}
    assert [w.worker_id for w in catalog.serving("v")] == ["b"]


def test_a_workers_advertised_features_override_its_engine_kinds() -> None:
    # vLLM answers suffix only with a FIM format configured: its heartbeat says so.
    assert missing_features("vllm", {"suffix"}, advertised=["response_format", "suffix", "tools"]) == []
    assert missing_features("vllm", {"suffix"}, advertised=["response_format", "tools"]) == ["suffix"]
    assert missing_features("sim", {"suffix"}, advertised=[]) == ["suffix"]
