"""The README's examples as data: every fenced block, how CI runs it, and what its shown output promises.

A block's fate is the HTML comment on the line above its opening fence:

    <!-- readme: run -->              run against the stack `make up` started (`make readme-check`, in CI)
    <!-- readme: run within 600 s --> the same, for a block that takes longer than a command's usual limit
    <!-- readme: compose -->          run against the compose stack by `make compose-smoke` (the smoke
                                      runs its own up and down; see deploy/compose/user_commands.py)
    <!-- readme: not run: REASON -->  not run, for the reason given (e.g. `make up` itself, which CI runs)

A block without a comment is run when it is a shell block (`bash`, `sh`) or a `text` block of `$ `
prompts; other blocks (JSON, diagrams) are not commands. tests/unit/test_readme_examples.py holds
every README block to one of these fates, so a command added to the README is run by CI or says why not.

In a `text` block, the lines after a `$ ` command are the output the README shows for it: the head of
each (up to its first " · " or ", ") must be in what the command prints, so an example's claims — the model
a hint routes to, the rule that chose it — are checked too. A request id shown in a later command
(`llmbus trace <id>`) stands for the request of the block's first `llmbus chat`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(
    r"^<!--\s*readme:\s*(run(?:\s+within\s+(?P<limit>\d+)\s*s)?|compose|not run:\s*(?P<reason>.+?))\s*-->$"
)
COMMAND_TIMEOUT_S = 180  # what one command of a block may take, unless its marker gives the block more
_SHELL = {"bash", "sh", "shell"}
REQUEST_ID = re.compile(r"\b[0-9a-f]{32}\b")
# What a failed command prints even when it exits 0: the OpenAI error shape, the CLI's error line.
_ERROR_OUTPUT = re.compile(r'"error"\s*:|^error \w+:', re.MULTILINE)


@dataclass(frozen=True)
class Step:
    """One command of a block and the output lines the README shows under it (text blocks only)."""

    command: str
    shown: tuple[str, ...] = ()

    def promised(self) -> list[str]:
        """The heads of the shown lines, which the real output must contain."""
        return [line.split(" · ")[0].split(", ")[0].strip() for line in self.shown if line.strip()]


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    fate: str  # "run" | "compose" | "not run" | "not a command"
    reason: str = ""
    steps: list[Step] = field(default_factory=list)
    timeout_s: float = COMMAND_TIMEOUT_S  # per command (a shell block is one)


def read_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        body = "\n".join(lines[i + 1 : end])
        blocks.append(_block(i + 1, opening.group(1), body, lines[i - 1].strip() if i else ""))
        i = end + 1
    return blocks


def _block(line: int, lang: str, body: str, above: str) -> Block:
    steps = _text_steps(body) if lang == "text" else [Step(body)] if lang in _SHELL else []
    marker = _MARKER.match(above)
    if marker is not None:
        reason = (marker.group("reason") or "").strip()
        fate = "not run" if reason else marker.group(1).split()[0]
        limit = float(marker.group("limit") or COMMAND_TIMEOUT_S)
        return Block(line, lang, body, fate, reason, steps, limit)
    return Block(line, lang, body, "run" if steps else "not a command", "", steps)


def _text_steps(body: str) -> list[Step]:
    """`$ command` lines (with `\\` continuations), each with the output lines shown under it."""
    steps: list[Step] = []
    command: list[str] = []
    shown: list[str] = []
    continuing = False
    for line in body.splitlines():
        if continuing:
            command.append(line)
            continuing = line.endswith("\\")
        elif line.startswith("$ "):
            if command:
                steps.append(Step("\n".join(command), tuple(shown)))
            command, shown = [line[2:]], []
            continuing = line.endswith("\\")
        elif command:
            shown.append(line)
    if command:
        steps.append(Step("\n".join(command), tuple(shown)))
    return steps


def blocks_to_run(text: str | None = None) -> list[Block]:
    return [b for b in read_blocks(README.read_text(encoding="utf-8") if text is None else text) if b.fate == "run"]


def failure_in(output: str) -> str | None:
    """The first line of `output` that reports an error although its command exited 0, else None."""
    found = _ERROR_OUTPUT.search(output)
    if found is None:
        return None
    start = output.rfind("\n", 0, found.start()) + 1
    end = output.find("\n", found.end())
    return output[start : end if end >= 0 else len(output)]


def missing_promises(step: Step, output: str) -> list[str]:
    return [head for head in step.promised() if head not in output]
