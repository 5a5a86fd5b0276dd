"""The README's examples, run as written against the stack `make up` started (`make readme-check`).

Outside `make test`: these need `make up`'s stack on the default ports and topics, which the suite's
namespaced stacks never use. `.ci/run` runs `make up`, then this, then `make down`, so a command the
README shows can never break with CI green. Which blocks run, and why the others don't, is in
llmbus_tools/readme_examples.py.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from llmbus_tools.readme_examples import REQUEST_ID, Block, Step, blocks_to_run, failure_in, missing_promises

pytestmark = pytest.mark.readme

VENV = Path(os.environ.get("LLMBUS_VENV", Path.home() / ".cache" / "llmbus" / "venv"))
_CHAT_REQUEST = re.compile(r"^request ([0-9a-f]{32}) ", re.MULTILINE)


def _bash(script: str, timeout_s: float) -> tuple[int, str]:
    """Run `script` as a user's shell would, from the repository root, with the venv's bin on PATH (as the README's
    first example sets it); stdout and stderr together, as the user sees them."""
    env = os.environ | {"PATH": f"{VENV / 'bin'}:{os.environ['PATH']}", "COLUMNS": "160"}
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def _check(step: Step, status: int, output: str) -> None:
    shown = f"$ {step.command}\n{output}"
    assert status == 0, f"exit status {status}:\n{shown}"
    assert (error := failure_in(output)) is None, f"an error in the output: {error}\n{shown}"
    assert not (missing := missing_promises(step, output)), f"the README shows {missing}, the command did not:\n{shown}"


def _cases() -> list[object]:
    """Each block, with pytest's own limit above what its commands may take together."""
    return [
        pytest.param(
            block, id=f"README.md:{block.line}", marks=pytest.mark.timeout(block.timeout_s * len(block.steps) + 60)
        )
        for block in blocks_to_run()
    ]


@pytest.mark.parametrize("block", _cases())
def test_readme_block_runs_as_written(block: Block) -> None:
    first_request: str | None = None
    for step in block.steps:
        command = step.command
        if first_request is not None:  # `llmbus trace <id>`: the id of this block's first chat
            command = REQUEST_ID.sub(first_request, command)
        status, output = _bash(command, block.timeout_s)
        print(f"$ {command}\n{output}")
        _check(step, status, output)
        if first_request is None and (chat := _CHAT_REQUEST.search(output)):
            first_request = chat.group(1)
