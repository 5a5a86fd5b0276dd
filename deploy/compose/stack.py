"""`make compose-up` and `make compose-smoke`: the compose stack on a real Docker engine.

    python deploy/compose/stack.py up      engine, images, the whole secured stack, healthy; left running
    python deploy/compose/stack.py smoke   the same under its own project and free ports, then through the
                                           gateway with the official `openai` SDK a streamed and a plain
                                           chat, `llmbus trace`, `llmbus status`, `llmbus costs` (the
                                           requests billed), Redis SIGKILLed losing no key, a model
                                           version released (two versions pushed into its object store, a
                                           worker each, shadow to 100 %, `llmbus trace` and `llmbus models
                                           history` showing the release), Prometheus scraping every
                                           target, its alert rules and consoles (on the stack's
                                           Prometheus 2 and on Prometheus 3 beside it), a scale-up by the
                                           autoscaler under a burst and back down; then `down -v`
    python deploy/compose/stack.py down    `down -v` of the `up` stack, and the engine if this script started it

Every step prints its duration; a failed step prints the state and logs of the services that failed.
Runs with the project's venv (openai, redis); needs root only when no Docker engine runs yet.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import prometheus_v3
from checks import (
    billed,
    burst_scales_up_and_down,
    chats,
    consoles_render,
    prometheus_scrapes,
    redis_restart_keeps_keys,
    session_turn_and_feedback,
    spans_reach_the_collector,
    traced,
)
from model_release import release_a_model_version
from project import HERE, PORT_SUFFIXES, WORKER_METRICS, Stack, free_prefix, prepare
from steps import StepFailed, port_free, report, run, say, step
from user_commands import STATUS_COMMAND, printed_next_command, readme_compose_example

# The stack's Prometheus (Debian's 2.x in the local images) and Prometheus 3 beside it (the official
# image's major), by their port suffixes: the scrapes, rules, KEDA queries and consoles are checked on both.
PROMETHEUS = {"the stack's Prometheus (2.x)": "9090", f"Prometheus {prometheus_v3.VERSION}": prometheus_v3.PORT_SUFFIX}


def checks(stack: Stack) -> None:
    with step("API key for tenant acme (llmbus keys create)"):
        api_key = stack.cli("keys", "create", "--tenant", "acme", "--name", "smoke").strip().splitlines()[-1]
    request_id = chats(stack, api_key)
    traced(stack, request_id)
    spans_reach_the_collector(stack, api_key)
    with step("llmbus status: every tier's worker ready"):
        status = stack.cli("status")
        if missing := [w for w in WORKER_METRICS if w not in status]:
            raise StepFailed(f"workers missing from llmbus status: {missing}\n{status}")
    billed(stack, "acme", 2)
    readme_compose_example(stack)
    printed_next_command(stack)
    redis_restart_keeps_keys(stack, api_key)
    session_turn_and_feedback(stack, api_key)
    release_a_model_version(stack, api_key)
    for which, port_suffix in PROMETHEUS.items():
        prometheus_scrapes(stack, port_suffix, which)
        consoles_render(stack, port_suffix, which)
    burst_scales_up_and_down(stack, api_key, PROMETHEUS)


def smoke() -> None:
    started_engine = prepare()
    prometheus_v3.build()
    secrets_dir = Path(tempfile.mkdtemp(prefix="llmbus-smoke-secrets."))
    # The autoscaler's policy in seconds and a small batch on the sim worker, so a burst shows scaling.
    os.environ |= {"LLMBUS_AUTOSCALER_POOLS": "burst", "LLMBUS_SIM_MAX_NUM_SEQS": "2"}
    stack = Stack("llmbus-smoke", free_prefix(), secrets_dir)
    say(f"    compose: {' '.join(stack.compose[: stack.compose.index('-p')])}; ports 127.0.0.1:{stack.prefix}xxxx")
    try:
        stack("config", "-q")
        stack.up()
        with prometheus_v3.beside(stack):
            checks(stack)
    except BaseException:
        say("!!! smoke failed; state and logs of the failed services:")
        with contextlib.suppress(Exception):
            stack.print_failures()
        raise
    finally:
        with contextlib.suppress(Exception):
            stack.down()
        shutil.rmtree(secrets_dir, ignore_errors=True)
        if started_engine:
            run([str(HERE / "engine.sh"), "stop"], check=False)
    report()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "smoke", "down"])
    action = parser.parse_args().action
    try:
        if action == "smoke":
            smoke()
            return
        prefix = os.environ.get("LLMBUS_PORT_PREFIX", "2")
        stack = Stack("llmbus", prefix, Path(os.environ.get("LLMBUS_SECRETS_DIR", HERE / "secrets")))
        if action == "down":
            stack.down()
            run([str(HERE / "engine.sh"), "stop"], check=False)
            return
        prepare()
        running = stack("ps", "-q").split()
        if not running and (busy := [p for p in PORT_SUFFIXES if not port_free(int(prefix + p))]):
            raise StepFailed(f"ports 127.0.0.1:{prefix}{busy[0]} and others in use; set LLMBUS_PORT_PREFIX (2-5)")
        try:
            stack.up()
        except BaseException:
            stack.print_failures()
            raise
        report()
        say(
            f"\nthe stack is up: gateway http://127.0.0.1:{stack.port('8000')}/v1, Prometheus "
            f"http://127.0.0.1:{stack.port('9090')}, Kafka 127.0.0.1:{stack.port('9092')} (SASL/SCRAM).\n"
            f"  {stack.command_line(*STATUS_COMMAND)}\n"
            "  make compose-down   (removes the stack and its volumes)"
        )
    except StepFailed as failure:
        say(f"FAILED: {failure}")
        sys.exit(1)


if __name__ == "__main__":
    main()
