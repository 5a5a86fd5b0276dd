# llmbus — `make help` lists the targets. Every target installs what it needs first.
SHELL := /bin/bash
VENV ?= $(HOME)/.cache/llmbus/venv
PY := $(VENV)/bin/python
export LLMBUS_VENV := $(VENV)
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

# `make up AUTH=1`: the stack on a secured broker (SASL/SCRAM, catalog ACLs, one principal per service,
# a TLS listener on 9094 for clients outside);
# its own data dir, so `make down` first when a dev broker runs. docs/security.md.
AUTH ?= 0
ifeq ($(AUTH),1)
export KAFKA_AUTH := scram
export KAFKA_TLS := 1
export KAFKA_DATA_DIR := $(HOME)/.cache/llmbus/kafka-data-secured
export LLMBUS_STACK_AUTH := 1
endif
.PHONY: help setup infra up down demo test test-unit test-integration lint schemas schemas-check schemas-release bench plan \
        readme-check compose-check compose-up compose-smoke compose-down clean reliability reliability-cluster soak test-long test-analytics bench-autoscaler bench-peer bench-hops test-security gpu-check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

setup: ## install Python packages (venv), vLLM CPU build, Java/Maven, Redis, the object store's jars; idempotent
	@scripts/setup.sh

infra: setup ## start local Kafka (KRaft, 127.0.0.1:9092), Redis (127.0.0.1:6379) and the object store (S3 API, 127.0.0.1:9000)
	@deploy/kafka/kafka.sh start
	@deploy/redis/redis.sh start
	@deploy/objectstore/objectstore.sh start

up: infra ## the whole stack: Kafka, Redis (AOF), topics, the services, a sim worker per policy tier, a streamed demo
	@$(VENV)/bin/llmbus up

demo: ## stream one answer through the running stack
	@$(VENV)/bin/llmbus chat "What does a control plane for LLM inference do?" --max-tokens 48

readme-check: setup ## run the README's examples as written against the stack `make up` started (kcat from Debian)
	@command -v kcat >/dev/null || (apt-get update -qq && apt-get install -y -qq kcat >/dev/null)
	@$(PY) -m pytest -q -p no:cacheprovider -s -m readme tests/readme $(PYTEST_ARGS)

down: ## stop the services (they drain), then Kafka, Redis and the object store
	@if [ -x $(VENV)/bin/llmbus ]; then $(VENV)/bin/llmbus down; else deploy/kafka/kafka.sh stop; deploy/redis/redis.sh stop; \
	  deploy/objectstore/objectstore.sh stop; fi

# make test runs the tests on TEST_WORKERS pytest-xdist processes. Tests that share one resource (the
# vLLM engine, the secured broker, a module's stack) stay on one worker, and the slow ones start first
# (tests/xdist_groups.py). TEST_WORKERS=0 runs them in one process. Many tests wait (consumer session
# timeouts, restarts): with 4 workers the two cores were busy 68 % of a 358 s run, with 6 the same tests
# took 281 s (8: 273 s). PYTEST_ARGS="-p tests.cpu_usage" records the CPU per test (`python -m
# tests.cpu_usage` sums it per module). The services the tests start come
# from one fork server per worker, which has imported them once (llmbus_tools/harness/forkserver.py;
# LLMBUS_FORKSERVER=0 starts each with its own interpreter). Bytecode is written even where
# PYTHONDONTWRITEBYTECODE is set: without its cache each worker rewrites every test module's asserts
# again at each run's collection (12 instead of 5 CPU-s per worker once the cache is there); on a fresh
# clone the controller writes that cache once before its workers collect (tests/assert_cache.py).
TEST_WORKERS ?= 6
# A test that fails runs once more (pytest-rerunfailures), as Apache Kafka's own CI retries a failed test
# once: on 2 cores under 6 workers a timing-bound test against the real broker can miss its deadline once
# in hundreds of runs. Every rerun is named in the summary (RERUN lines, "N rerun" in the last line), so
# a flaky test stays visible and gets fixed; a test that fails twice fails the run. TEST_RERUNS=0: none.
TEST_RERUNS ?= 1
# The broker make test starts (when none runs yet) compiles with C1 alone: in a run of the suite C2's
# compiles took 45 of the broker's 150 CPU-s; C1 alone halved its CPU on a part of the suite run side
# by side (23 against 44 CPU-s, the same wall time). make up and make bench keep the default flags.
test: export KAFKA_BROKER_JVM_FLAGS ?= -Xms256m -Xmx768m -XX:+UseG1GC -XX:TieredStopAtLevel=1
test: infra schemas-check ## everything CI runs: schema drift check, unit, integration (real Kafka+Redis+object store), vLLM CPU
	@LLMBUS_TEST_SWEEP=1 env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -p no:cacheprovider -m "not reliability and not long and not analytics and not readme" \
	  -n $(TEST_WORKERS) --dist loadgroup --durations=30 --reruns $(TEST_RERUNS) -rfER $(PYTEST_ARGS)

test-security: setup ## the security tests alone (they start a private SASL/SCRAM broker with ACLs)
	@$(PY) -m pytest -q -p no:cacheprovider tests/integration/test_security.py tests/integration/test_contract_acls.py \
	  tests/integration/test_redis_auth.py \
	  tests/unit/test_tenancy.py tests/unit/test_acls.py tests/unit/test_router_authorise.py $(PYTEST_ARGS)

test-unit: setup ## fast unit tests only (no broker)
	@$(PY) -m pytest -q -p no:cacheprovider tests/unit $(PYTEST_ARGS)

test-long: infra ## the long end-to-end runs (experiment lifecycle on the real broker), outside make test
	@$(PY) -m pytest -q -p no:cacheprovider -m long tests $(PYTEST_ARGS)

test-analytics: infra ## the Flink SQL job (deploy/analytics) vs `llmbus costs` on the real broker; writes its report
	@deploy/analytics/setup.sh
	@LLMBUS_ANALYTICS_REPORT=bench/reports/analytics_flink.md $(PY) -m pytest -q -p no:cacheprovider -m analytics \
	  tests/analytics $(PYTEST_ARGS)

test-integration: infra ## integration, e2e and reliability tests against the real broker and Redis
	@$(PY) -m pytest -q -p no:cacheprovider $(wildcard tests/integration tests/e2e tests/reliability) $(PYTEST_ARGS)

lint: setup ## ruff (lint + format check) and mypy
	@$(VENV)/bin/ruff check libs services llmbus_tools tests bench
	@$(VENV)/bin/ruff format --check libs services llmbus_tools tests bench
	@$(VENV)/bin/mypy

schemas: setup ## regenerate schemas/ (JSON Schema, AsyncAPI per service, topic catalog) from the models
	@$(PY) -m llmbus.contract.schemagen --out schemas

schemas-check: setup ## fail if schemas/ drifted from the models, or broke the released ones (schemas/README.md)
	@$(PY) -m llmbus.contract.schemagen --out schemas --check
	@$(PY) -m llmbus.contract.compat --schemas schemas

schemas-release: setup ## record schemas/messages as the released contract (schemas/previous/), if compatible
	@$(PY) -m llmbus.contract.compat --schemas schemas --accept

bench: infra ## all benchmarks; reports (JSON, Markdown with the command, PNG) land in bench/reports/
	@for b in $$(ls bench/*_bench.py | sed 's#bench/\(.*\)\.py#\1#'); do echo "== bench.$$b"; $(PY) -m bench.$$b || exit 1; done

RELIABILITY_CMD := make reliability
reliability: infra ## fault-injection scenarios, long sizes (thousands of requests each); report in bench/reports/reliability.*
	@LLMBUS_RELIABILITY=long LLMBUS_RELIABILITY_REPORT=bench/reports/reliability LLMBUS_RELIABILITY_COMMAND="$(RELIABILITY_CMD)" \
	  $(PY) -m pytest -q -p no:cacheprovider -m reliability tests/reliability $(PYTEST_ARGS)

# The heavy scenarios alone (also part of `make reliability`): leader_sigkill on a private 3-broker KRaft
# cluster (tests/fixtures/kafka_cluster.py), redis_cluster_failover on a private 6-node Redis Cluster,
# comparator_autoscaler_broker_restart on a private broker; long sizes; report in bench/reports/reliability_cluster.*
RELIABILITY_CLUSTER_CMD := make reliability-cluster
reliability-cluster: infra ## the heavy fault scenarios (3-broker leader SIGKILL, Redis Cluster failover, comparator+autoscaler through a broker restart), long sizes; report in bench/reports/reliability_cluster.*
	@LLMBUS_RELIABILITY=long LLMBUS_RELIABILITY_REPORT=bench/reports/reliability_cluster LLMBUS_RELIABILITY_COMMAND="$(RELIABILITY_CLUSTER_CMD)" \
	  $(PY) -m pytest -q -p no:cacheprovider -s -m kafka_cluster tests/reliability $(PYTEST_ARGS)

SOAK_MINUTES ?= 30
soak: infra ## steady load (a quarter over the gateway) at half the measured maximum for SOAK_MINUTES (30): RSS, Redis keys, lag, HTTP answers, billing once → bench/reports/soak.*
	@$(PY) -m bench.reliability_soak --minutes $(SOAK_MINUTES)

plan: setup ## the capacity planner's case study (report + PNG in bench/reports/)
	@$(PY) -m llmbus.cli.main plan --out bench/reports

bench-autoscaler: setup ## the autoscaler's benchmark alone: three traces on tidal days (virtual time, no broker; about 35 min on 2 cores)
	@$(PY) -m bench.autoscaler_bench

# PEER_ARGS: e.g. --quick (CI-size), --baseline-tree ../other-checkout, --profile, --requests 2000.
PEER_ARGS ?=
bench-peer: setup ## llmbus vs TensorZero, LiteLLM and the upstream itself (own broker+Redis; peers in venvs under ~/.cache/llmbus/peer) → bench/reports/peer.*
	@$(PY) -m bench.peer_bench $(PEER_ARGS)

# HOPS_ARGS: e.g. --requests 1000, --infra private (a broker and Redis of its own instead of the running ones).
HOPS_ARGS ?=
bench-hops: infra ## the llmbus path's first token at c=1 hop by hop, from Kafka record timestamps → bench/reports/peer_hops.*
	@$(PY) -m bench.peer_hops $(HOPS_ARGS)

# Not on `setup`: that installs the CPU build of vLLM. scripts/gpu_check.sh checks for a GPU first (exit 2 without
# one, nothing installed), installs vLLM's GPU build at the tested release (LLMBUS_VLLM=gpu scripts/setup.sh), then
# starts Kafka and Redis where they do not answer and runs every step within 540 s. GPU_CHECK_ARGS=--plan lists them.
GPU_CHECK_ARGS ?=
gpu-check: ## on an NVIDIA GPU host: Kafka+Redis, NVML profile, engine tests on the GPU, CUDA graphs, worker vs AsyncLLM → bench/reports/gpu_check.md
	@scripts/gpu_check.sh $(GPU_CHECK_ARGS)

compose-check: ## validate deploy/compose/docker-compose.yml with Debian's docker-compose 1.29 and compose v2 (when built)
	@command -v docker-compose >/dev/null || (apt-get update -qq && apt-get install -y -qq docker-compose >/dev/null)
	@for compose in docker-compose $(wildcard $(HOME)/.cache/llmbus/bin/docker-compose); do \
	  LLMBUS_SECRETS_DIR=/nonexistent $$compose -f deploy/compose/docker-compose.yml -f deploy/compose/local-images.yml \
	    --profile gpu --profile window --profile tools --profile init config -q || exit 1; \
	  echo "compose file valid ($$($$compose version --short 2>/dev/null || $$compose version | head -1))"; done

# The compose stack on a Docker engine (deploy/compose/stack.py): uses the running engine or, as root,
# starts dockerd without bridge or firewall rules; builds the images from Debian, PyPI and Maven Central.
compose-up: setup ## the whole secured stack in Docker (images built here), healthy, left running (127.0.0.1:2xxxx)
	@$(PY) deploy/compose/stack.py up

compose-smoke: setup ## compose stack up on free ports, OpenAI SDK chats, status, costs, Redis restart, Prometheus, down -v
	@$(PY) deploy/compose/stack.py smoke

compose-down: ## remove the compose-up stack and its volumes; stop the engine if compose-up started it
	@$(PY) deploy/compose/stack.py down

clean: ## remove caches in the tree (not the venv, Kafka data or downloads)
	@find . -name __pycache__ -prune -exec rm -rf {} + ; rm -rf .mypy_cache .ruff_cache .pytest_cache
