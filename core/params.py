"""Declarative hyperparameters: what every method's ``Params`` dataclass is made of.

A client, an aggregator and a payload exchange each declare their hyperparameters as a
frozen dataclass whose fields carry their default and their allowed range (:func:`hyper` and
its shorthands :func:`positive`, :func:`nonnegative`, :func:`at_least`, :func:`below_one`,
:func:`unit_interval`, :func:`one_of`); the app's configuration (``fl_app.config``) checks
a run's values against them, and :func:`params_from` reads a validated config section into
one. Errors are :class:`ConfigError`, whose message names the key, the bad value and what is
allowed. Nothing here knows a method.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

Config = dict[str, Any]
NOT_A_CHOICE = "is not one of the choices"


class ConfigError(ValueError):
    """A configuration problem, with a message that says what to change."""


@dataclasses.dataclass(frozen=True)
class Range:
    """What a hyperparameter may be: ``ok(value)`` holds; ``allowed`` says it in words."""

    allowed: str
    ok: Callable[[Any], bool]
    problem: str = "is out of range"  # how the error says the value is wrong


def hyper(
    default: Any,
    allowed: str,
    ok: Callable[[Any], bool],
    problem: str = "is out of range",
    types: tuple[type, ...] = (),
) -> Any:
    """A ``Params`` field whose configured value ``fl_app.config.validate`` checks with ``ok``. The
    value must have the default's type, or one of ``types`` (e.g. FedRCL's ``levels``: a
    string or a list of indices)."""
    metadata = {"range": Range(allowed, ok, problem), "types": types}
    return dataclasses.field(default=default, metadata=metadata)


def positive(default: float) -> Any:
    """A ``Params`` field that must be > 0 (temperatures, learning rates, scales)."""
    return hyper(default, "a number > 0", lambda v: v > 0)


def nonnegative(default: float) -> Any:
    """A ``Params`` field that must be >= 0 (loss weights: 0 switches the term off)."""
    return hyper(default, "a number >= 0", lambda v: v >= 0)


def at_least(low: int, *, default: int) -> Any:
    """An integer ``Params`` field that must be >= ``low`` (buffer sizes, counts)."""
    return hyper(default, f"an integer >= {low}", lambda v: v >= low)


def below_one(default: float) -> Any:
    """A ``Params`` field in [0, 1) (momentum and decay rates)."""
    return hyper(default, "0 <= x < 1", lambda v: 0 <= v < 1)


def unit_interval(default: float) -> Any:
    """A ``Params`` field in [0, 1] (mixing weights: 0 and 1 are the two pure ends)."""
    return hyper(default, "0 <= x <= 1", lambda v: 0 <= v <= 1)


def one_of(*choices: str) -> Any:
    """A string ``Params`` field that must be one of ``choices``; the first is the default."""
    return hyper(choices[0], " | ".join(choices), lambda v: v in choices, NOT_A_CHOICE)


def params_from(params_cls: type, section: Mapping[str, Any]) -> Any:
    """An instance of the ``Params`` dataclass ``params_cls`` with the values of its fields
    in ``section`` (a validated config section, which holds every one of them)."""
    return params_cls(**{f.name: section[f.name] for f in dataclasses.fields(params_cls)})
