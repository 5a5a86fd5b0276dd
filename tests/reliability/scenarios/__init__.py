"""The fault scenarios, one module each: a module that defines `SCENARIO` (tests.reliability.common.Scenario)
is in the suite. Adding a scenario is adding a module here; test_faults.py runs every one, with the
`reliability` mark (and only in `make reliability`) when it is heavy or the size is long."""

from __future__ import annotations

import importlib
import pkgutil

from tests.reliability.common import Scenario


def _registry() -> dict[str, Scenario]:
    found: dict[str, Scenario] = {}
    for info in pkgutil.iter_modules(__path__):
        scenario = getattr(importlib.import_module(f"{__name__}.{info.name}"), "SCENARIO", None)
        if isinstance(scenario, Scenario):
            if scenario.name in found:
                raise ValueError(f"two scenarios named {scenario.name!r}")
            found[scenario.name] = scenario
    return found


SCENARIOS = _registry()
