"""The native envs behave exactly as recorded: a fresh trace (seeded steps of both faces of
websearch_v0/v1/v2 and multisearch_v0, refused actions, bad arguments, rendered frames; see
``tests/_websearch_trace.py``) equals ``tests/data/env_trace.json``, recorded before the env
modules were reorganised. A deliberate change of behaviour bumps the env version and
re-records the fixture (``python tests/_websearch_trace.py``)."""

from __future__ import annotations

import json
import os
import sys

import pytest

try:
    import _websearch_trace as trace
except ImportError:  # pytest --import-mode=importlib does not put tests/ on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _websearch_trace as trace

RECORDED = json.loads(trace.FIXTURE.read_text())


@pytest.mark.parametrize("index", range(len(trace.ENVS)), ids=[e[0] for e in trace.ENVS])
def test_trace_matches_recording(index):
    name, module, kwargs = trace.ENVS[index]
    family = "multisearch" if name.startswith("multisearch") else "websearch"
    recorded = RECORDED[name]
    assert trace.constructor_errors(module, family) == recorded["constructor_errors"]
    for face, run, seed in (
        ("parallel", trace.trace_parallel, 100 + index),
        ("vector", trace.trace_vector, 200 + index),
    ):
        fresh = run(module, kwargs, seed)
        expected = recorded[face]
        assert fresh["spaces"] == expected["spaces"], face
        assert fresh["errors"] == expected["errors"], face
        assert fresh["frames"] == expected["frames"], face
        pairs = zip(fresh["steps"], expected["steps"], strict=False)
        first_diff = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        assert first_diff is None, f"{face}: step record {first_diff} differs"
        assert len(fresh["steps"]) == len(expected["steps"]), face


def test_trace_exercises_errors_and_frames():
    """The recording is not vacuous: refusals, bad arguments and both frame kinds occur."""
    for name, entry in RECORDED.items():
        errors = entry["parallel"]["errors"] + entry["vector"]["errors"]
        assert sum(e["error"] is not None for e in errors) >= 10, name
        assert all(e["error"] is not None for e in entry["constructor_errors"]), name
        modes = {f["mode"] for f in entry["parallel"]["frames"] + entry["vector"]["frames"]}
        assert modes == {"ansi", "rgb_array"}, name
        assert len(entry["parallel"]["steps"]) > trace.PARALLEL_STEPS, name
