"""Plugins by name: the one registry idiom of every service (placement filters, scorers and pickers,
complexity scorers, embedders, scaling policies, actuators, engines).

A plugin module registers its factory under a name (`@FILTERS.register("serves-model")`); a
configuration file names the plugin and its params, and `build` makes it with those params checked
strictly against the factory's own parameters and their types (a dataclass's fields, else its
signature): an unknown name or param, or a string where a number belongs, is a clear error before
anything runs. A factory whose params need more than types (ranges, nested sections, rules between
fields) declares them as a pydantic model, its `Params` attribute: the params are validated by that
model and passed as one `params` argument. What the service passes itself (bounds, its settings)
goes as keywords, unchecked.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[T]):
    """Factories of one kind of plugin, by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """A decorator: the class or function it decorates makes the plugin `name`."""

        def add(factory: F) -> F:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._factories[name] = factory
            return factory

        return add

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def names(self) -> list[str]:
        return sorted(self._factories)

    def factory(self, name: str) -> Callable[..., T]:
        try:
            return self._factories[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {self.names()}") from None

    def check(self, name: str, params: Mapping[str, Any] | None = None, *given: str) -> dict[str, Any]:
        """`params` checked against the plugin's own parameters (`given`: those the service passes
        itself, not settable from a file); returns them validated, strictly typed."""
        factory = self.factory(name)
        model = _params_model(factory)
        settable, hints = (set(model.model_fields), {}) if model is not None else _parameters(factory)
        settable -= set(given)
        params = dict(params or {})
        if unknown := sorted(set(params) - settable):
            raise ValueError(f"{self.kind} {name!r}: unknown params {unknown}; it takes {sorted(settable)}")
        if model is not None:
            try:
                return {"params": model.model_validate(params)}
            except ValidationError as exc:
                error = exc.errors()[0]  # a rule between params has no one param to name
                where = f"param {'.'.join(map(str, error['loc']))!r}: " if error["loc"] else ""
                raise ValueError(f"{self.kind} {name!r}: {where}{error['msg']}") from exc
        checked = {}
        for key, value in params.items():
            try:  # strict: `kv_headroom: "1.0"` is a mistake in the file, not a float
                checked[key] = TypeAdapter(hints[key]).validate_python(value, strict=True) if key in hints else value
            except ValidationError as exc:
                raise ValueError(f"{self.kind} {name!r}: param {key!r}: {exc.errors()[0]['msg']}") from exc
        return checked

    def build(self, name: str, params: Mapping[str, Any] | None = None, **given: Any) -> T:
        """The plugin `name`, made with `params` (checked) and `given` (the service's own)."""
        checked = self.check(name, params, *given)
        try:
            return self.factory(name)(**checked, **given)
        except TypeError as exc:  # a required param the file left out
            raise ValueError(f"{self.kind} {name!r}: {exc}") from exc


def _params_model(factory: Callable[..., Any]) -> type[BaseModel] | None:
    """The factory's `Params` model, if it declares one."""
    model = getattr(factory, "Params", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _parameters(factory: Callable[..., Any]) -> tuple[set[str], dict[str, Any]]:
    """The names a factory takes by keyword (a dataclass's init fields but `name` and private ones)
    and their type hints."""
    if isinstance(factory, type) and dataclasses.is_dataclass(factory):
        names = {
            f.name for f in dataclasses.fields(factory) if f.init and f.name != "name" and not f.name.startswith("_")
        }
        return names, typing.get_type_hints(factory)
    target = factory.__init__ if isinstance(factory, type) else factory  # type: ignore[misc]
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {p.name for p in inspect.signature(target).parameters.values() if p.kind in kinds} - {"self"}
    hints = {k: v for k, v in typing.get_type_hints(target).items() if k != "return"}
    return names, hints
