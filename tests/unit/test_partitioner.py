"""make_producer's partitioner puts every keyed record where aiokafka's default one does."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from llmbus.bus.partitioner import partition_for
from llmbus.bus.producer import make_producer
from llmbus.settings import BusSettings

partition_lists = st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=64, unique=True).map(sorted)


@given(st.binary(max_size=64), partition_lists)
def test_a_keyed_record_goes_where_the_default_partitioner_sends_it(key: bytes, partitions: list[int]) -> None:
    expected = DefaultPartitioner()(key, partitions, partitions)
    assert partition_for(key, partitions, partitions) == expected
    assert partition_for(key, partitions, partitions[:1]) == expected  # a remembered key: same answer again


@given(partition_lists)
def test_a_record_without_key_goes_to_an_available_partition(partitions: list[int]) -> None:
    available = partitions[::2]
    assert partition_for(None, partitions, available) in available
    assert partition_for(None, partitions, []) in partitions


async def test_services_producers_use_it() -> None:
    producer = make_producer(BusSettings(), "test")
    try:
        assert producer._partitioner is partition_for
    finally:
        await producer.stop()
