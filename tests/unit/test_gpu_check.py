"""`make gpu-check` without a GPU: the parts of scripts/gpu_check.sh and bench/gpu_check.py that run anywhere.

No GPU is needed, and none is assumed absent: NVML is a fake (tests/fixtures/fake_nvml.py), the steps' commands
go to a recording runner, and the services' ports to a fake. What a GPU run does is checked up to the commands
it runs, their time limits and the report it writes from their output.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench import gpu_check
from llmbus_services.engine_worker.adapters.engines.vllm_version import TESTED_VLLM_VERSION, InstalledVllm
from tests.fixtures.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeGpu, make_fake_nvml

REPO = Path(__file__).resolve().parents[2]


class FakeHost:
    """Runs nothing: records each command with its time limit and answers as the real step would have."""

    def __init__(self, reports: Path, infra_up: bool = False, infra_starts: bool = True) -> None:
        self.calls: list[tuple[list[str], float]] = []
        self.envs: list[dict[str, str]] = []
        self.up = {9092: infra_up, 6379: infra_up}
        self.infra_starts = infra_starts
        self.reports = reports
        self.killed: set[str] = set()

    def run(self, cmd: list[str], env: dict[str, str], timeout_s: float) -> gpu_check.Ran:
        self.calls.append((cmd, timeout_s))
        self.envs.append(env)
        joined = " ".join(cmd)
        if any(name in joined for name in self.killed):
            return gpu_check.Ran(None, "", "still running")
        if cmd[-1] == "start":
            port = 9092 if "kafka" in cmd[0] else 6379
            self.up[port] = self.infra_starts
            return gpu_check.Ran(0 if self.infra_starts else 1, "", "" if self.infra_starts else "no java")
        if "bench.gpu_graphs" in joined:
            run = {
                "decode_tokens": 2048,
                "cold_start_phases_s": {"weights": 1.0, "kv_pool": 2.0, "kernels": 9.0, "warmup": 1.0},
            }
            graphs = {"eager": run | {"enforce_eager": True, "decode_tokens_per_s": 900.0}}
            graphs["cuda_graphs"] = run | {"enforce_eager": False, "decode_tokens_per_s": 2700.0}
            Path(cmd[cmd.index("--out") + 1]).write_text(json.dumps(graphs))
        if "bench.worker_vllm_bench" in joined:
            row = {"side": "worker", "shape": "long", "output_tokens_per_s_mean": 5000.0, "ratio_to_direct": 0.97}
            (self.reports / "worker_vllm_bench_gpu.json").write_text(json.dumps({"summary": [row]}))
        return gpu_check.Ran(0, "40 passed in 95.00s", "")

    def check(self) -> gpu_check.Check:
        tested = InstalledVllm("vllm", TESTED_VLLM_VERSION)
        return gpu_check.Check(
            run=self.run, answers=lambda port: self.up[port], reports=self.reports, installed_vllm=lambda: tested
        )


def test_without_a_gpu_it_says_so_runs_nothing_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gpu_check.md"
    for nvml in (make_fake_nvml([]), make_fake_nvml([], init_error=NVML_ERROR_LIBRARY_NOT_FOUND)):  # none; no driver
        host = FakeHost(tmp_path)
        assert gpu_check.main(["--out", str(out)], nvml=nvml, check=host.check()) == gpu_check.NO_GPU_EXIT
        assert "no NVIDIA GPU" in capsys.readouterr().err
        assert not out.exists() and host.calls == []


def test_the_plan_lists_every_step_within_the_budget_and_runs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--plan"], nvml=make_fake_nvml([])) == 0  # any machine: no GPU needed for the plan
    printed = capsys.readouterr().out
    assert [line.split()[0] for line in printed.splitlines()[:-1]] == ["infra", "node", "tests", "graphs", "bench"]
    assert "deploy/kafka/kafka.sh start unless :9092 answers" in printed
    assert "bench.worker_vllm_bench --model tiny --repeats 1 --report-suffix _gpu" in printed
    assert sum(limit for _, limit, _ in gpu_check.plan(gpu_check.parse_args([]))) <= gpu_check.BUDGET_S <= 570
    skipped = gpu_check.plan(gpu_check.parse_args(["--skip-tests", "--skip-bench"]))
    assert [name for name, _, _ in skipped] == ["infra", "node", "graphs"]


def test_on_a_gpu_it_starts_kafka_and_redis_and_runs_every_step(tmp_path: Path) -> None:
    out, host = tmp_path / "gpu_check.md", FakeHost(tmp_path)
    code = gpu_check.main(["--out", str(out)], nvml=make_fake_nvml([FakeGpu()]), check=host.check())

    assert code == 0
    commands = [" ".join(cmd) for cmd, _ in host.calls]
    assert commands[:2] == ["deploy/kafka/kafka.sh start", "deploy/redis/redis.sh start"]
    assert "pytest" in commands[2] and all(test in commands[2] for test in gpu_check.ENGINE_TESTS)
    assert host.envs[2]["LLMBUS_TEST_GPU_MEMORY_UTILIZATION"] == gpu_check.TEST_GPU_SHARE
    assert "bench.gpu_graphs" in commands[3] and "bench.worker_vllm_bench" in commands[4]
    assert all(limit <= gpu_check.LIMITS_S["infra"] for _, limit in host.calls[:2])
    assert [limit for _, limit in host.calls[2:]] == [gpu_check.LIMITS_S[s] for s in ("tests", "graphs", "bench")]
    report = out.read_text()
    assert "| Kafka and Redis | pass |" in report and "started Kafka and Redis" in report
    assert "| node profile (NVML) | pass |" in report and "1 x NVIDIA H100 80GB HBM3" in report
    assert '"llama_8b_format": "bf16: ' in report  # 16 GB of bf16 weights fit an 80 GB H100
    assert "| vLLM engine tests on the GPU | pass |" in report and "40 passed" in report
    assert "| CUDA-graph warm-up | pass |" in report and "(x3.00); kernels (compile + graph capture) 9.0 s" in report
    assert "| worker vs AsyncLLM | pass |" in report and "worker long: 5000 tok/s (ratio 0.97)" in report
    assert len(json.loads(out.with_suffix(".json").read_text())) == 5


def test_running_services_are_left_alone(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, infra_up=True)
    gpu_check.main(["--skip-tests", "--skip-graphs", "--skip-bench", "--out", str(tmp_path / "r.md")],
                   nvml=make_fake_nvml([FakeGpu()]), check=host.check())  # fmt: skip
    assert host.calls == [] and "both answering already" in (tmp_path / "r.md").read_text()


def test_services_that_do_not_start_fail_the_check_and_the_bench_is_not_run(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, infra_starts=False)
    out = tmp_path / "r.md"
    assert (
        gpu_check.main(
            ["--skip-tests", "--skip-graphs", "--out", str(out)], nvml=make_fake_nvml([FakeGpu()]), check=host.check()
        )
        == 1
    )
    report = out.read_text()
    assert "| Kafka and Redis | FAIL |" in report and "Kafka did not start" in report and "no java" in report
    assert "| worker vs AsyncLLM | FAIL |" in report and "not run: Kafka and Redis are not up" in report
    assert not any("worker_vllm_bench" in " ".join(cmd) for cmd, _ in host.calls)


def test_a_step_past_its_limit_is_a_failure_and_the_rest_still_runs(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, infra_up=True)
    host.killed = {"pytest"}
    out = tmp_path / "r.md"
    assert gpu_check.main(["--out", str(out)], nvml=make_fake_nvml([FakeGpu()]), check=host.check()) == 1
    report = out.read_text()
    assert "| vLLM engine tests on the GPU | FAIL |" in report and "killed at its limit of 180 s" in report
    assert "| worker vs AsyncLLM | pass |" in report


def test_an_untested_vllm_is_refused_before_any_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = FakeHost(tmp_path)
    check = host.check()
    check.installed_vllm = lambda: InstalledVllm("vllm", "0.33.1")
    out = tmp_path / "r.md"
    assert (
        gpu_check.main(["--out", str(out)], nvml=make_fake_nvml([FakeGpu()]), check=check)
        == gpu_check.UNTESTED_VLLM_EXIT
    )
    err = capsys.readouterr().err
    assert "vLLM 0.33.1 (vllm) is installed" in err and f"tested with vLLM {TESTED_VLLM_VERSION}" in err
    assert host.calls == [] and not out.exists()


def test_the_make_target_stops_before_installing_anything_without_a_gpu(tmp_path: Path) -> None:
    # An nvidia-smi that lists no GPU (whatever this machine has): the script must not reach setup.sh.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    env = os.environ | {"PATH": f"{fake_bin}:{os.environ['PATH']}", "LLMBUS_VENV": str(tmp_path / "no-venv")}
    proc = subprocess.run([str(REPO / "scripts/gpu_check.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "no NVIDIA GPU on this machine" in proc.stderr and "nothing installed" in proc.stderr
    assert not (tmp_path / "no-venv").exists()
    makefile = (REPO / "Makefile").read_text()
    assert "\t@scripts/gpu_check.sh $(GPU_CHECK_ARGS)" in makefile
