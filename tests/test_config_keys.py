"""The one router of --config keys (kernels/config_keys.py): a workload of one configuration takes its fields,
tp-mlp's parts take theirs by PART.KEY or a plain KEY every part with that field takes; anything else is one
line naming what there is."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from taxes.kernels.config_keys import route


@dataclass
class One:
    block_m: int = 128
    copiers: int = 16


@dataclass
class Other:
    block_m: int = 64
    rows: int = 8


def test_one_configuration_takes_its_own_fields():
    assert route("w", {"": One}, {"block_m": 64, "copiers": 2}) == {"": {"block_m": 64, "copiers": 2}}
    assert route("w", {"": One}, None) == {"": {}}


@pytest.mark.parametrize("key", ["rows", "x.block_m", ".block_m", ""])
def test_one_configuration_refuses_what_it_lacks_naming_its_keys(key):
    with pytest.raises(ValueError) as e:
        route("w", {"": One}, {key: 1})
    assert str(e.value) == f"w has no configuration key {key!r} (keys: block_m, copiers)"


def test_parts_take_a_plain_key_each_and_their_own_dotted_key_wins():
    got = route("mlp", {"a": One, "b": Other}, {"b.block_m": 8, "block_m": 16, "rows": 2, "a.copiers": 4})
    assert got == {"a": {"block_m": 16, "copiers": 4}, "b": {"block_m": 8, "rows": 2}}


@pytest.mark.parametrize("key,words", [("c.block_m", "(parts: a, b)"), ("a.rows", "(parts: a, b)"),
                                       ("nothing", "(keys of its parts a, b, optionally as a.KEY, b.KEY)")])
def test_parts_refuse_a_key_no_part_has(key, words):
    with pytest.raises(ValueError) as e:
        route("mlp", {"a": One, "b": Other}, {key: 1})
    assert str(e.value) == f"mlp has no configuration key {key!r} {words}"
