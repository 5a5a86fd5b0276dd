"""What the user is told to run, run as written on the smoke's stack.

- The README's compose example (its block marked `<!-- readme: compose -->`): every line but the stack's own
  lifecycle (build, secrets-init, up, down), which the smoke runs itself. Its `COMPOSE_FILE` becomes this
  stack's files (the local images), and the compose project, port prefix and secrets come from the
  environment, as compose reads them; the gateway's port is the smoke's.
- The command `make compose-up` prints for the next step, built by the same function that prints it.
"""

from __future__ import annotations

import os
import re
import subprocess

from project import FILES, Stack
from steps import StepFailed, say, step

from llmbus_tools.readme_examples import README, failure_in, read_blocks

STATUS_COMMAND = ("run", "--rm", "cli", "llmbus", "status")  # what `make compose-up` tells the user to run next
# Lines of the README's example that bring the stack up or down, or choose its files: the smoke does those.
_LIFECYCLE = re.compile(
    r"^(export COMPOSE_FILE=|docker compose (build|up|down)\b|docker compose run --rm secrets-init)"
)


def _shell(stack: Stack, script: str, timeout_s: float = 300) -> str:
    env = stack.env | {
        "COMPOSE_FILE": os.pathsep.join(FILES[1::2]),
        "COMPOSE_PROJECT_NAME": stack.project,
        "COLUMNS": "160",
    }
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        env=env,
        cwd=README.parent,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    output = done.stdout + done.stderr
    if done.returncode != 0 or (error := failure_in(done.stdout)) is not None:
        reason = f"exit status {done.returncode}" if done.returncode else f"an error in its output: {error}"
        raise StepFailed(f"{reason}\n$ {script}\n{output}")
    return output


def readme_compose_example(stack: Stack) -> None:
    [block] = [b for b in read_blocks(README.read_text(encoding="utf-8")) if b.fate == "compose"]
    lines = [line for line in block.body.splitlines() if not _LIFECYCLE.match(line)]
    script = "\n".join(lines).replace("127.0.0.1:28000", f"127.0.0.1:{stack.port('8000')}")
    with step(f"README.md:{block.line}: the compose example as written (status, a key, curl, costs)"):
        output = _shell(stack, script)
        if '"choices"' not in output:
            raise StepFailed(f"the example's curl got no completion:\n{output}")
        say("    " + "\n    ".join(output.strip().splitlines()[-6:]))


def printed_next_command(stack: Stack) -> None:
    command = stack.command_line(*STATUS_COMMAND)
    with step(f"the command make compose-up prints: {command}"):
        _shell(stack, command)
