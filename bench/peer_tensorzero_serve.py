"""TensorZero's Rust gateway served over local HTTP from its PyPI wheel, until SIGTERM.

    <tensorzero venv>/bin/python bench/peer_tensorzero_serve.py CONFIG.toml

Runs in the TensorZero venv the peer benchmark makes (it imports nothing of llmbus). The wheel
embeds the gateway; `tensorzero._start_http_gateway` (what its `patch_openai_client` uses) binds it
to a free loopback port in this process, on tokio threads of its own. Prints
`base_url <url>` (the OpenAI-compatible root, `.../openai/v1`) once it serves.
"""

from __future__ import annotations

import signal
import sys
import threading

import tensorzero


def main() -> None:
    gateway = tensorzero._start_http_gateway(
        config_file=sys.argv[1], clickhouse_url=None, postgres_url=None, valkey_url=None, async_setup=False
    )
    print(f"base_url {gateway.base_url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    gateway.close()


if __name__ == "__main__":
    main()
