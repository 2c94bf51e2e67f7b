"""core.params: the declarative hyperparameter fields every method's ``Params`` is made of.

How a run's config is checked against them (the error names the key, the value and what is
allowed) is tested with the config, in tests/fl_app/test_config.py; here each field's
default, range and words, and :func:`params_from`."""

from __future__ import annotations

import dataclasses

import pytest

from core.params import (
    NOT_A_CHOICE,
    Range,
    at_least,
    below_one,
    hyper,
    nonnegative,
    one_of,
    params_from,
    positive,
    unit_interval,
)


@dataclasses.dataclass(frozen=True)
class _Params:
    tau: float = positive(0.5)
    weight: float = nonnegative(1.0)
    buffer: int = at_least(2, default=5)
    decay: float = below_one(0.9)
    mix: float = unit_interval(0.5)
    mode: str = one_of("plain", "hard")
    levels: str = hyper("all", "'all' or a list of indices", lambda v: True, types=(list,))


def _range(name: str) -> Range:
    [field] = [f for f in dataclasses.fields(_Params) if f.name == name]
    return field.metadata["range"]


@pytest.mark.parametrize(
    ("name", "good", "bad", "allowed"),
    [
        ("tau", [1e-9, 1.0, 50], [0, -0.1], "a number > 0"),
        ("weight", [0, 0.0, 3], [-1e-9], "a number >= 0"),
        ("buffer", [2, 100], [1, 0, -3], "an integer >= 2"),
        ("decay", [0, 0.5, 0.999], [1, 1.0, -0.01], "0 <= x < 1"),
        ("mix", [0, 0.5, 1], [1.01, -0.01], "0 <= x <= 1"),
        ("mode", ["plain", "hard"], ["Hard", "", "soft"], "plain | hard"),
    ],
)
def test_each_shorthand_accepts_its_range_and_says_it_in_words(name, good, bad, allowed):
    r = _range(name)
    assert r.allowed == allowed
    assert all(r.ok(v) for v in good) and not any(r.ok(v) for v in bad)


def test_a_choice_says_it_is_not_one_of_the_choices_where_a_number_is_out_of_range():
    assert _range("mode").problem == NOT_A_CHOICE
    assert _range("tau").problem == "is out of range"


def test_defaults_are_the_declared_ones_and_one_of_defaults_to_its_first_choice():
    assert _Params() == _Params(0.5, 1.0, 5, 0.9, 0.5, "plain", "all")


def test_hyper_records_the_extra_types_a_field_may_take():
    fields = {f.name: f for f in dataclasses.fields(_Params)}
    assert fields["levels"].metadata["types"] == (list,)
    assert fields["tau"].metadata["types"] == ()


def test_params_from_reads_its_fields_and_ignores_the_rest_of_the_section():
    section = {"tau": 0.1, "weight": 0.0, "buffer": 3, "decay": 0.0, "mix": 1.0}
    section |= {"mode": "hard", "levels": [1, 2], "name": "fedavg", "other": 7}
    p = params_from(_Params, section)
    assert p == _Params(0.1, 0.0, 3, 0.0, 1.0, "hard", [1, 2])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.tau = 1.0


def test_params_from_needs_every_field_in_the_validated_section():
    with pytest.raises(KeyError, match="mode"):  # the first field missing
        params_from(_Params, {"tau": 0.1, "weight": 0, "buffer": 3, "decay": 0, "mix": 1})
