"""The declarations are the services' wiring: every declared subscription is bound, nothing else can be,
and a write the declaration does not name is caught."""

from __future__ import annotations

import pytest

from llmbus.bus.memory import MemoryBus
from llmbus.bus.service import ServiceRuntime
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.declarations import catalog_name
from llmbus.contract.messages import Control, ControlAction
from llmbus.settings import BusSettings
from llmbus_services.autoscaler.adapters.actuators import NoActuator
from llmbus_services.autoscaler.app import build_app
from llmbus_services.autoscaler.config import AutoscalerSettings
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from llmbus_services.shadow_comparator.app import build
from llmbus_services.shadow_comparator.config import ComparatorSettings

SETTINGS = BusSettings(topic_prefix="unit.")


def wired(contract: contracts.Contract) -> ServiceRuntime:
    runtime = MemoryBus(SETTINGS).runtime(contract)
    if contract is contracts.AUTOSCALER:
        build_app(runtime, AutoscalerSettings(actuator="none"), NoActuator())
    elif contract is contracts.COST:
        CostService(SETTINGS, CostSettings(), runtime)
    else:
        build(runtime, ComparatorSettings())
    return runtime


@pytest.mark.parametrize("contract", [contracts.AUTOSCALER, contracts.COST, contracts.COMPARATOR], ids=str)
def test_every_declared_subscription_is_bound_once(contract: contracts.Contract) -> None:
    runtime = wired(contract)
    bound = sorted(r.name for r in contract.bound())  # start-up reads (read_table) and on-demand reads are not bound
    assert sorted(b.reads.name for b in runtime.bindings) == bound


def test_every_declared_topic_is_in_the_catalog() -> None:
    names = {spec.name for spec in (*t.CATALOG, *t.PATTERN_SPECS)}
    for contract in contracts.ALL:
        assert contract.read_topics() | contract.write_topics() <= names, contract.service


def test_a_subscription_reads_only_what_its_declaration_names() -> None:
    runtime = MemoryBus(SETTINGS).runtime(contracts.AUTOSCALER)
    with pytest.raises(KeyError, match="declares no subscription 'results'"):
        runtime.subscribe("results", lambda record: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="what its declaration names"):
        runtime.subscribe("workers", lambda record: None, topics=(t.RESULTS,))  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="cannot change"):
        runtime.subscribe("workers", lambda record: None, group="mine")  # type: ignore[arg-type,return-value]


async def test_a_write_the_declaration_does_not_name_is_caught() -> None:
    runtime = wired(contracts.AUTOSCALER)
    topics = runtime.topics
    await runtime.publisher.publish(
        topics.name(t.CONTROL), Control(target_id="w1", action=ControlAction.DRAIN), key="w1"
    )
    assert runtime.contract.undeclared(topics, runtime.publisher.topics_written) == {t.CONTROL}


def test_per_instance_topics_are_named_by_their_pattern() -> None:
    topics = t.Topics("p.")
    assert catalog_name(topics, topics.dispatch("w-1")) == t.DISPATCH_SPEC.name
    assert catalog_name(topics, topics.replies("gw-1")) == t.REPLIES_SPEC.name
    assert not contracts.WORKER.undeclared(topics, {topics.replies("gw-1"), topics.name(t.RESULTS)})


def test_the_catalogs_readers_and_writers_are_the_declarations() -> None:
    assert t.BY_NAME[t.SCALING].writers == (t.AUTOSCALER,)
    assert t.AUTOSCALER not in t.BY_NAME[t.RESULTS].readers + t.BY_NAME[t.CONTROL].writers
    # cost-accounting reads llm.costs only as a start-up read (what was billed, after a Redis data loss)
    assert [r.name for r in contracts.COST.reads if t.COSTS in r.topics and not r.at_start] == []
    assert t.COMPARATOR not in t.BY_NAME[t.SHADOW_TOKENS].readers


def test_the_declared_groups_are_the_groups_services_always_had() -> None:
    """Committed offsets live under these names: a declaration that renamed one would restart a service
    from its start position."""
    topics = t.Topics("p.")
    assert contracts.ROUTER.group_id("requests", topics) == topics.group(t.ROUTER)
    assert contracts.ROUTER.group_id("results", topics) == topics.group(t.ROUTER, "results")
    assert contracts.SCHEDULER.group_id("routed", topics) == topics.group(t.SCHEDULER)
    assert contracts.SCHEDULER.group_id("outcomes", topics, instance="s1") == topics.group(t.SCHEDULER, "outcomes.s1")
    assert contracts.WORKER.group_id("dispatch", topics, worker_id="w1") == topics.group(t.WORKER, "w1")
    assert contracts.WORKER.group_id("control", topics, worker_id="w1") == topics.group(t.WORKER, "w1.control")
    assert contracts.AUTOSCALER.group_id("pool_stats", topics) == topics.group(t.AUTOSCALER)
    assert contracts.COST.group_id("scaling", topics) == topics.group(t.COST, "scaling")
    assert contracts.COST.group_id("results", topics) == topics.group(t.COST, "results")
    assert contracts.COMPARATOR.group_id("results", topics) == topics.group(t.COMPARATOR)
    assert contracts.COMPARATOR.group_id("feedback", topics) == topics.group(t.COMPARATOR, "feedback")
    assert contracts.COMPARATOR.group_id("experiments", topics) is None
    with pytest.raises(ValueError, match="placeholder"):
        contracts.WORKER.group_id("dispatch", topics)
