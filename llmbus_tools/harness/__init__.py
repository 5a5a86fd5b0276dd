"""What benchmarks and tests both stand on: namespaces and service processes, the tiny vLLM model and
its engine settings, a fake OpenAI upstream, and the fault scenarios' stack and effect checkers.

Benchmarks import these from here, never from tests/ (tests/unit/test_layout.py checks it).
"""
