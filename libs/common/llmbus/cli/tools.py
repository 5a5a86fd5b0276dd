"""Commands the CLI hands to an offline tool's `python -m` entry point, so that it imports no service."""

from __future__ import annotations

import subprocess
import sys

import typer

# Every argument, --help included, goes to the tool as it was typed.
TOOL_COMMAND = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def run_tool(module: str, *args: str) -> None:
    """Run `python -m <module> <args>` in this interpreter and exit with its status."""
    raise typer.Exit(subprocess.call([sys.executable, "-m", module, *args]))
