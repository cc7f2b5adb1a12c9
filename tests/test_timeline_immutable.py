"""A Timeline is a value: the analysis of a trace leaves every timeline it was given as it was, each stage
returning a new one, and a timeline's fields cannot be assigned."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from taxes.attribution import analyze as A

from taxes.attribution import rank_passes as P
from taxes.traces import timeline as T

REAL = sorted((Path(__file__).parent / "data" / "traces" / "real").glob("rank*.json.gz"))
FRAMES = ("activities", "launches", "host", "windows", "extra")


def assert_same(tl: T.Timeline, before: T.Timeline) -> None:
    """tl holds exactly what its deep copy `before` held."""
    assert tl.rank == before.rank and tl.meta == before.meta
    for name in FRAMES:
        got, want = getattr(tl, name), getattr(before, name)
        if want is None:
            assert got is None, name
        else:
            pd.testing.assert_frame_equal(got, want, check_exact=True, obj=name)
    if before.key_source is None:
        assert tl.key_source is None
    else:
        assert list(tl.key_source) == list(before.key_source)


def test_every_stage_of_one_rank_leaves_its_input_timeline_unchanged():
    res = P.analyze_rank(str(REAL[0]))
    tl = res["timeline"]
    assert tl.extra is not None and len(tl.extra) == len(tl.activities)  # declared fields, filled by the reader
    assert tl.key_source is not None and len(tl.key_source) == len(tl.activities)
    before = copy.deepcopy(tl)
    segments = copy.deepcopy(res["segments"])
    P.rank_tables(res)
    moved = P.shift_rank(res, 250.0)
    assert moved is not res and moved["timeline"] is not tl
    # the shift happened, on the new record only
    assert np.allclose(moved["timeline"].activities["start_us"], tl.activities["start_us"] + 250.0)
    assert np.allclose(moved["timeline"].extra["launch_us"], tl.extra["launch_us"] + 250.0, equal_nan=True)
    assert P.shift_rank(moved, 99.0) is moved  # once only
    P.attribute_part(moved, pd.Series(dtype=float), {}, None, pd.DataFrame(columns=["rank", "key", "activity", "lo_us", "hi_us"]))
    P.step_activities(moved, int(moved["timeline"].windows["step"].iloc[0]))
    assert_same(tl, before)
    assert res["timeline"] is tl and res.get("offset_us") is None
    assert res["segments"].keys() == segments.keys()
    for k, seg in segments.items():
        if k != "names":
            assert np.array_equal(res["segments"][k][0], seg[0]), k


def test_the_whole_analysis_leaves_every_timeline_it_made_unchanged(monkeypatch):
    made = []
    read = P.to_timeline

    def recorded(*args, **kwargs):
        tl = read(*args, **kwargs)
        made.append((tl, copy.deepcopy(tl)))
        return tl

    monkeypatch.setattr(P, "to_timeline", recorded)
    an = A.analyze([str(p) for p in REAL], jobs=1, keep_timelines=True)
    assert len(made) == len(REAL)
    for tl, before in made:
        assert_same(tl, before)
    # what came back was made from them: steps and keys assigned, on the common clock
    for tl, _ in made:
        kept = an.timelines[tl.rank]
        assert kept is not tl and (kept.activities["step"] >= -1).any() and (tl.activities["step"] == -1).all()


def test_a_timeline_field_cannot_be_assigned():
    tl = T.timeline(0, [{"name": "k", "start_us": 0.0, "end_us": 1.0}])
    for name, value in (("windows", pd.DataFrame()), ("extra", pd.DataFrame()), ("key_source", np.array([""])),
                        ("rank", 1)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(tl, name, value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tl.anything_else = 1  # no undeclared attribute either
    assert tl.extra is None and tl.key_source is None  # the declared defaults


def test_shifting_and_floors_return_new_timelines():
    from taxes.documents.profile_document import apply_floors

    tl = T.timeline(0, [{"name": "a", "start_us": 0.0, "end_us": 4.0, "phase": "p", "step": 0},
                        {"name": "b", "start_us": 5.0, "end_us": 6.0, "phase": "p", "step": 0}],
                    windows=[{"step": 0, "start_us": 0.0, "end_us": 6.0}])
    before = copy.deepcopy(tl)
    later = T.shifted(tl, 10.0)
    assert list(later.windows["start_us"]) == [10.0] and list(later.activities["end_us"]) == [14.0, 16.0]
    floored = apply_floors(tl, {"p": 3.0})
    assert list(floored.activities["floor_us"]) == [3.0, 0.0]
    assert_same(tl, before)
