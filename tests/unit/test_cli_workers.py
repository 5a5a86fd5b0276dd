"""`llmbus workers start`'s pure parts: the worker id a version gets and the environment it starts with."""

from __future__ import annotations

import re

import pytest

from llmbus.cli.workers import worker_env, worker_id_for
from llmbus.contract.topics import Topics

KAFKA_TOPIC_NAME = r"[A-Za-z0-9._-]{1,249}"  # what a Kafka topic may be called


def test_a_version_s_worker_id_names_a_dispatch_topic() -> None:
    assert worker_id_for("tiny", "2", "vllm") == "tiny-v2-vllm"
    worker_id = worker_id_for("org/llama 3.1", "2024-06-01+fix", "sim")
    assert worker_id == "org-llama-3.1-v2024-06-01-fix-sim"
    assert re.fullmatch(KAFKA_TOPIC_NAME, Topics("").dispatch(worker_id))


def test_the_worker_gets_its_version_and_the_given_settings_last() -> None:
    env = worker_env("tiny@2", "w", "vllm", ["OMP_NUM_THREADS=1", "LLMBUS_WORKER_ENGINE=sim", "A=b=c"])
    assert env == {
        "LLMBUS_WORKER_WORKER_ID": "w",
        "LLMBUS_WORKER_ENGINE": "sim",  # what the user gave wins
        "LLMBUS_WORKER_MODEL_REF": "tiny@2",
        "OMP_NUM_THREADS": "1",
        "A": "b=c",
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        worker_env("tiny@2", "w", "vllm", ["OMP_NUM_THREADS"])
