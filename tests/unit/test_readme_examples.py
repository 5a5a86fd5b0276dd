"""Every block of the README has a fate (llmbus_tools/readme_examples.py): run by `make readme-check`, run by the
compose smoke, or not run with a reason. A command added to the README without one fails here."""

from __future__ import annotations

from llmbus_tools.readme_examples import (
    COMMAND_TIMEOUT_S,
    README,
    Step,
    blocks_to_run,
    failure_in,
    missing_promises,
    read_blocks,
)


def test_every_readme_block_has_a_fate() -> None:
    blocks = read_blocks(README.read_text(encoding="utf-8"))
    for block in blocks:
        assert block.fate in ("run", "compose", "not run", "not a command"), block
        if block.fate == "not run":
            assert block.reason, f"README.md:{block.line}: a block that is not run says why"
        if block.lang in ("bash", "sh", "shell"):
            assert block.fate != "not a command", f"README.md:{block.line}: a shell block is run or says why not"
    assert [b for b in blocks if b.fate == "compose"], "the compose example is run by the compose smoke"
    assert len(blocks_to_run()) >= 4, "the CLI, kcat and gateway examples run against make up's stack"


def test_text_blocks_split_into_commands_and_their_shown_output() -> None:
    text = (
        "```text\n$ llmbus chat hi \\\n  --max-tokens 4\nmodel-a (rule:x) · usage 3\n"
        "$ llmbus trace ab\n  routed: -> m, y\n```"
    )
    [block] = read_blocks(text)
    assert block.fate == "run"
    assert block.steps == [
        Step("llmbus chat hi \\\n  --max-tokens 4", ("model-a (rule:x) · usage 3",)),
        Step("llmbus trace ab", ("  routed: -> m, y",)),
    ]
    assert block.steps[0].promised() == ["model-a (rule:x)"]
    assert missing_promises(block.steps[1], "  routed: -> m, shadow no") == []
    assert missing_promises(block.steps[0], "model-b (default) · usage 3") == ["model-a (rule:x)"]


def test_markers_decide_the_fate() -> None:
    text = (
        "<!-- readme: not run: needs a GPU -->\n```bash\nmake gpu-check\n```\n\n"
        "<!-- readme: compose -->\n```bash\nx\n```"
    )
    first, second = read_blocks(text)
    assert (first.fate, first.reason) == ("not run", "needs a GPU")
    assert second.fate == "compose"
    plain, longer = read_blocks(
        "<!-- readme: run -->\n```bash\nx\n```\n<!-- readme: run within 600 s -->\n```bash\ny\n```"
    )
    assert (plain.fate, plain.timeout_s) == ("run", COMMAND_TIMEOUT_S)
    assert (longer.fate, longer.timeout_s) == ("run", 600)
    assert read_blocks('```json\n{"a": 1}\n```')[0].fate == "not a command"


def test_errors_printed_with_exit_status_zero_are_failures() -> None:
    assert failure_in('data: {"error": {"message": "no"}}\n') == 'data: {"error": {"message": "no"}}'
    assert failure_in("x\nerror model_unavailable: nobody serves it\n") == "error model_unavailable: nobody serves it"
    assert failure_in("data: [DONE]\n") is None
