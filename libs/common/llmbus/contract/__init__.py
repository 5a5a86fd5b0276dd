"""The contract: the messages on the bus, the topic catalog, what each service reads and writes, and
the rules by which all of them evolve (tolerant readers, schema compatibility, CloudEvents headers).

Pure: imports nothing else of llmbus (tests/unit/test_library_layers.py)."""
