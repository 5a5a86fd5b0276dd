"""Which partition a keyed record goes to: aiokafka's default choice, each key hashed once.

Every llmbus record has a key (request id, model, worker id) and aiokafka's default
partitioner hashes it with a pure-Python murmur2 on every record: about 4 µs for a request
id, the largest single cost of a send. A request's records share its key (a worker sends
several chunks, a result and an outcome under it), so the hashes of recent keys are kept.
The partition is exactly the default partitioner's (the Java client's), so a key's records
go where they always went and keep their order.
"""

from __future__ import annotations

import functools

from aiokafka.partitioner import DefaultPartitioner, murmur2

_KEYS_REMEMBERED = 4096
_default = DefaultPartitioner()


@functools.lru_cache(maxsize=_KEYS_REMEMBERED)
def _key_hash(key: bytes) -> int:
    return int(murmur2(key)) & 0x7FFFFFFF


def partition_for(key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
    """aiokafka's `partitioner(key, all_partitions, available)`: what DefaultPartitioner returns."""
    if not isinstance(key, bytes):  # no key (a random partition), or one that cannot be remembered
        return int(_default(key, all_partitions, available))
    return all_partitions[_key_hash(key) % len(all_partitions)]
