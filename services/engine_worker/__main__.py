"""`python -m llmbus_services.engine_worker` (the guard matters: vLLM spawns processes)."""

from llmbus.bus import run_service
from llmbus.contract import topics as t
from llmbus_services.engine_worker.app import main

if __name__ == "__main__":
    run_service(t.WORKER, main)
