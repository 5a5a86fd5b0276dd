"""The dev stack (`make up`, llmbus/cli/stack.py) serves every model the shipped policy routes to."""

from __future__ import annotations

from llmbus.cli import stack
from llmbus_services.engine_worker.adapters.engines.sim.profiles import load_profiles
from llmbus_services.router.core.config import load_policy


def _routed_models() -> set[str]:
    policy = load_policy()  # services/router/policies/default.yaml, as the router loads it
    named = {policy.default.target, *policy.default.fallback}
    for rule in policy.rules:
        named |= {m for m in (rule.target, *rule.fallback) if m}
    return named


def test_every_model_the_default_policy_routes_to_has_a_sim_worker() -> None:
    served = {
        proc.env["LLMBUS_WORKER_MODEL"]
        for proc in stack.default_services(workers=1)
        if proc.module == "llmbus_services.engine_worker"
    }
    assert _routed_models() <= served, f"nobody serves {_routed_models() - served}"


def test_each_tier_worker_fits_its_model_in_the_policy() -> None:
    policy, profiles = load_policy(), load_profiles()
    for tier in stack.TIER_FLEET:
        assert tier.sim_profile in profiles
        entry = policy.models[tier.model]
        assert tier.max_model_len == entry.max_model_len  # what the router admits, the worker takes
        kv_tokens = profiles[tier.sim_profile].kv_blocks_total * profiles[tier.sim_profile].kv_block_size
        assert kv_tokens >= tier.max_model_len  # one full-window request fits the KV cache


def test_every_process_serves_metrics_on_its_own_loopback_port() -> None:
    procs = stack.default_services(workers=3)
    ports = [proc.env["LLMBUS_METRICS_PORT"] for proc in procs]
    assert len(set(ports)) == len(procs) and all(int(p) > 0 for p in ports)
    assert {proc.env["LLMBUS_METRICS_HOST"] for proc in procs} == {"127.0.0.1"}
    assert not any("LLMBUS_ROUTER_DEFAULT_MODEL" in proc.env for proc in procs)  # the policy decides


def test_the_autoscalers_workers_do_not_inherit_its_metrics_port() -> None:
    """make up gives the autoscaler LLMBUS_METRICS_PORT; a worker it starts would die on EADDRINUSE."""
    from llmbus_services.autoscaler.adapters.actuators.local import LocalActuator
    from llmbus_services.autoscaler.core.config import LocalSpec

    worker = LocalActuator({stack.SIM_MODEL: LocalSpec()}).process(stack.SIM_MODEL, 3)
    assert worker.env["LLMBUS_METRICS_PORT"] == "0"


def test_the_dev_stack_runs_a_node_agent_for_the_workers_node() -> None:
    from llmbus_services.engine_worker.config import WorkerSettings
    from llmbus_services.node_agent.config import NodeAgentSettings

    (agent,) = [proc for proc in stack.default_services(workers=1) if proc.module == "llmbus_services.node_agent"]
    assert agent.env["LLMBUS_METRICS_PORT"] == str(stack.METRICS_PORTS["node-agent"])
    assert NodeAgentSettings().node_id == WorkerSettings().node_id  # both the host name: the workers read its profile
