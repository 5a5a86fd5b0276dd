"""bench/gpu_check.py's parts that run without a GPU: it says clearly that there is none, parses its
arguments, and on a GPU that NVML reports (a fake NVML here) profiles it and writes the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import gpu_check
from tests.fixtures.fake_nvml import FakeGpu, make_fake_nvml


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpu_check.md"
    assert gpu_check.main(["--out", str(out)], nvml=make_fake_nvml([])) == gpu_check.NO_GPU_EXIT
    assert "no NVIDIA GPU" in capsys.readouterr().err
    assert not out.exists()


def test_this_machine_has_no_gpu_and_the_script_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The real NVML path: no driver here (CI and the dev machines are CPU-only).
    assert gpu_check.main(["--out", str(tmp_path / "r.md")]) == gpu_check.NO_GPU_EXIT
    assert "nothing checked" in capsys.readouterr().err


def test_arguments() -> None:
    args = gpu_check.parse_args([])
    assert not (args.skip_tests or args.skip_graphs or args.skip_bench) and args.repeats == 1
    assert args.out == gpu_check.REPORTS / "gpu_check.md"
    args = gpu_check.parse_args(["--skip-bench", "--repeats", "3", "--out", "/tmp/x.md"])
    assert args.skip_bench and args.repeats == 3 and args.out == Path("/tmp/x.md")


def test_on_a_gpu_the_node_profile_step_reports_it(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.md"
    nvml = make_fake_nvml([FakeGpu()])
    code = gpu_check.main(["--skip-tests", "--skip-graphs", "--skip-bench", "--out", str(out)], nvml=nvml)
    assert code == 0
    report = out.read_text()
    assert "| node profile (NVML) | pass | 1 x NVIDIA H100 80GB HBM3" in report
    assert '"llama_8b_format": "bf16' in report  # 16 GB of bf16 weights fit an 80 GB H100
    assert out.with_suffix(".json").exists()
