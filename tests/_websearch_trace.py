"""A recorded trace of the native envs' behaviour, for refactors that must not change it.

For ``websearch_v0``, ``websearch_v1``, ``websearch_v2`` and ``multisearch_v0``, both faces
(``parallel_env`` and ``vector_env``) are stepped a few hundred times with seeded random
actions (mostly legal, some masked) and, every few steps, an action the env must refuse. Each
step's observations, masks, rewards, flags, infos and state are hashed (sha256 of the arrays'
bytes, dtype and shape); refused actions and bad constructor arguments are kept as error type
and message; ``render()`` frames (``ansi`` text and ``rgb_array`` images) are hashed.

``python tests/_websearch_trace.py`` writes the trace to ``tests/data/env_trace.json``;
``tests/test_websearch_trace.py`` compares a fresh trace with it exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__":  # run as a script from anywhere: the repository on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs import multisearch_v0, websearch_v0, websearch_v1, websearch_v2  # noqa: E402

FIXTURE = Path(__file__).parent / "data" / "env_trace.json"

#: (trace name, env module, constructor arguments): small presets and short episodes so that
#: episodes end, reset and render many times within the step budget
ENVS: tuple[tuple[str, Any, dict[str, Any]], ...] = (
    ("websearch_v0", websearch_v0, {"preset": "easy", "max_cycles": 25}),
    ("websearch_v0_default", websearch_v0, {"preset": "default", "max_answers": 2}),
    ("websearch_v1", websearch_v1, {"preset": "default", "max_cycles": 30, "reward_read": 0.3}),
    ("websearch_v2", websearch_v2, {"preset": "hard", "max_cycles": 20}),
    ("multisearch_v0", multisearch_v0, {"preset": "small", "max_cycles": 60}),
)
PARALLEL_STEPS = 300
VECTOR_STEPS = 200
NUM_ENVS = 4
P_MASKED = 0.1  # probability that an agent's action is drawn from all actions, masked included
REFUSE_EVERY = 17  # steps between refused actions
RENDER_EVERY = 9  # steps between rendered frames

#: bad constructor arguments per env family: each must raise; the type and message are kept
BAD_ARGUMENTS = {
    "websearch": (
        {"preset": "impossible"},
        {"n_queriers": "2"},
        {"n_browsers": 0},
        {"p_synonym": 1.5},
        {"top_k": 3},
        {"strict_actions": 1},
        {"reward_read": "high"},  # v0: unknown (a v1 argument); v1, v2: a wrong type
        {"no_such_argument": 1},
        {"render_mode": "gif"},
    ),
    "multisearch": (
        {"preset": "impossible"},
        {"grid_size": 2.5},
        {"n_rescuers": 0},
        {"obstacle_density": 1.5},
        {"minimap": "yes"},
        {"no_such_argument": 1},
        {"render_mode": "gif"},
    ),
}


def digest(*parts: Any) -> str:
    """sha256 (first 16 hex digits) of ``parts``: arrays by dtype, shape and bytes; dicts in
    sorted key order; other values by ``repr``."""
    h = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, np.ndarray):
            h.update(f"{x.dtype.str}{x.shape}".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, dict):
            for key in sorted(x):
                h.update(repr(key).encode())
                feed(x[key])
        elif isinstance(x, (list, tuple)):
            h.update(f"{type(x).__name__}{len(x)}".encode())
            for item in x:
                feed(item)
        elif isinstance(x, (float, np.floating)):
            h.update(np.float64(x).tobytes())
        else:
            h.update(repr(x).encode())

    for part in parts:
        feed(part)
    return h.hexdigest()[:16]


def error_of(call: Callable[[], Any]) -> dict[str, str] | None:
    """``{"type", "message"}`` of the exception ``call`` raises, or None."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 (recording any refusal is the point)
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def _masked_choice(rng: np.random.Generator, mask: np.ndarray) -> int:
    """A legal action (uniform over the mask), or with probability ``P_MASKED`` any action."""
    if rng.random() < P_MASKED:
        return int(rng.integers(mask.shape[-1]))
    return int(rng.choice(np.flatnonzero(mask)))


def _spaces(env: Any) -> list[str]:
    return [
        f"{a}: {env.observation_space(a)} {env.action_space(a)}" for a in env.possible_agents
    ] + [f"state: {env.state_space}"]


def _frames(env: Any, step: int, render: Callable[[], Any], frames: list) -> None:
    if step % RENDER_EVERY == 0:
        frame = render()
        kind = "ansi" if isinstance(frame, str) else "rgb_array"
        frames.append({"step": step, "mode": kind, "sha": digest(frame)})


def _bad_parallel_actions(env: Any, actions: dict[str, int]) -> Iterable[dict[str, Any]]:
    """Refused actions for the parallel env, cycled through."""
    first, last = env.possible_agents[0], env.possible_agents[-1]
    n_first = int(env.action_space(first).n)
    yield {**actions, first: n_first}
    yield {**actions, last: -1}
    yield {**actions, first: 1.0}
    yield {**actions, last: True}
    yield {**actions, first: "1"}
    yield {**actions, first: np.array([1, 2])}
    yield {a: x for a, x in actions.items() if a != last}
    yield {**actions, "nobody_0": 0}


def trace_parallel(module: Any, kwargs: dict[str, Any], seed: int) -> dict[str, Any]:
    """``PARALLEL_STEPS`` steps of ``parallel_env`` (ansi frames), with refused actions, and
    a strict env's refusals of masked actions; one rgb_array frame per episode start."""
    rng = np.random.default_rng(seed)
    env = module.parallel_env(render_mode="ansi", **kwargs)
    rgb = module.parallel_env(render_mode="rgb_array", **kwargs)
    strict = module.parallel_env(strict_actions=True, **kwargs)
    steps: list[str] = []
    errors: list[dict[str, Any]] = []
    frames: list[dict[str, Any]] = []
    episode_seed = seed
    obs, infos = env.reset(seed=episode_seed)
    rgb.reset(seed=episode_seed)
    strict_obs, _ = strict.reset(seed=episode_seed)
    steps.append(digest(obs, infos, env.state()))
    frames.append({"step": 0, "mode": "rgb_array", "sha": digest(rgb.render())})
    bad = None
    for step in range(1, PARALLEL_STEPS + 1):
        actions = {a: _masked_choice(rng, obs[a]["action_mask"]) for a in env.agents}
        if step % REFUSE_EVERY == 0:
            if bad is None:
                bad = _bad_parallel_actions(env, actions)
            try:
                wrong = next(bad)
            except StopIteration:
                bad = _bad_parallel_actions(env, actions)
                wrong = next(bad)
            error = error_of(lambda wrong=wrong: env.step(wrong))
            errors.append({"step": step, "face": "parallel", "error": error})
            steps.append(digest(env.state(), env.agents))  # nothing changed
        # the strict env refuses a masked action, then takes legal ones
        if strict.agents and step % 10 == 0:
            a = strict.agents[step % len(strict.agents)]
            illegal = np.flatnonzero(strict_obs[a]["action_mask"] == 0)
            if illegal.size:
                wrong = {**actions, a: int(illegal[step % illegal.size])}
                error = error_of(lambda wrong=wrong: strict.step(wrong))
                errors.append({"step": step, "face": "strict", "error": error})
        if strict.agents:
            legal = {
                a: int(rng.choice(np.flatnonzero(strict_obs[a]["action_mask"])))
                for a in strict.agents
            }
            strict_obs, *rest = strict.step(legal)
            steps.append(digest("strict", strict_obs, *rest))
        obs, rewards, terms, truncs, infos = env.step(actions)
        rgb.step(actions)
        steps.append(digest(obs, rewards, terms, truncs, infos, env.state(), env.agents))
        _frames(env, step, env.render, frames)
        if not env.agents:
            episode_seed += 1
            obs, infos = env.reset(seed=episode_seed)
            rgb.reset(seed=episode_seed)
            steps.append(digest("reset", obs, infos, env.state()))
            frames.append({"step": step, "mode": "rgb_array", "sha": digest(rgb.render())})
        if not strict.agents:
            strict_obs, _ = strict.reset(seed=episode_seed + 1000)
    error = error_of(lambda: env.reset(seed=-1))
    errors.append({"step": PARALLEL_STEPS, "face": "parallel", "error": error})
    return {"spaces": _spaces(env), "steps": steps, "errors": errors, "frames": frames}


def trace_vector(module: Any, kwargs: dict[str, Any], seed: int) -> dict[str, Any]:
    """``VECTOR_STEPS`` steps of ``vector_env(NUM_ENVS)`` with autoreset (final obs and
    state included), refused action arrays, then ``autoreset=False`` until every env ends."""
    rng = np.random.default_rng(seed)
    vec = module.vector_env(NUM_ENVS, render_mode="ansi", **kwargs)
    agents = vec.possible_agents
    steps: list[str] = []
    errors: list[dict[str, Any]] = []
    frames: list[dict[str, Any]] = []
    obs, infos = vec.reset(seed=seed)
    steps.append(digest(obs, infos, vec.state()))

    def draw(obs: dict) -> dict[str, np.ndarray]:
        return {
            a: np.array([_masked_choice(rng, m) for m in obs[a]["action_mask"]], dtype=np.int64)
            for a in agents
        }

    for step in range(1, VECTOR_STEPS + 1):
        actions = draw(obs)
        if step % REFUSE_EVERY == 0:
            first = agents[0]
            n_first = int(vec.action_space(first).n)
            wrongs = (
                {**actions, first: np.full(NUM_ENVS, n_first)},
                {**actions, first: actions[first].astype(np.float64)},
                {**actions, first: actions[first][:-1]},
                {a: x for a, x in actions.items() if a != first},
            )
            wrong = wrongs[(step // REFUSE_EVERY) % len(wrongs)]
            error = error_of(lambda wrong=wrong: vec.step(wrong))
            errors.append({"step": step, "face": "vector", "error": error})
        obs, rewards, terms, truncs, infos = vec.step(actions)
        steps.append(
            digest(obs, rewards, terms, truncs, infos, vec.state(), vec.final_obs, vec.final_state)
        )
        _frames(vec, step, lambda step=step: vec.render(step % NUM_ENVS), frames)
    steps.append(digest("search_sets", [sorted(map(repr, s)) for s in vec.search_sets()]))
    # autoreset=False: envs freeze when they end
    frozen = module.vector_env(NUM_ENVS, autoreset=False, **kwargs)
    obs, infos = frozen.reset(seed=[seed + 7 * i for i in range(NUM_ENVS)])
    for _ in range(200):
        obs, rewards, terms, truncs, infos = frozen.step(draw(obs))
        steps.append(digest("frozen", obs, rewards, terms, truncs, infos, frozen.state()))
        done = terms[agents[0]] | truncs[agents[0]]
        if done.all():
            break
    frames.append({"step": -1, "mode": "rgb_array", "sha": digest(frozen.render(NUM_ENVS - 1))})
    errors.append({"step": -1, "face": "vector", "error": error_of(lambda: frozen.render(99))})
    errors.append(
        {"step": -1, "face": "vector", "error": error_of(lambda: frozen.reset(seed=[1, 2]))}
    )
    return {"spaces": _spaces(vec), "steps": steps, "errors": errors, "frames": frames}


def constructor_errors(module: Any, family: str) -> list[dict[str, Any]]:
    out = []
    for bad in BAD_ARGUMENTS[family]:
        error = error_of(lambda bad=bad: module.parallel_env(**bad))
        out.append({"arguments": repr(bad), "error": error})
        error = error_of(lambda bad=bad: module.vector_env(2, **bad))
        out.append({"arguments": "vector " + repr(bad), "error": error})
    out.append({"arguments": "vector num_envs=0", "error": error_of(lambda: module.vector_env(0))})
    out.append(
        {"arguments": "vector num_envs='2'", "error": error_of(lambda: module.vector_env("2"))}
    )
    return out


def record_trace() -> dict[str, Any]:
    """The whole trace: per env of ``ENVS``, its parallel and vector traces and the
    constructor errors of its module."""
    trace: dict[str, Any] = {}
    for i, (name, module, kwargs) in enumerate(ENVS):
        family = "multisearch" if name.startswith("multisearch") else "websearch"
        trace[name] = {
            "parallel": trace_parallel(module, kwargs, seed=100 + i),
            "vector": trace_vector(module, kwargs, seed=200 + i),
            "constructor_errors": constructor_errors(module, family),
        }
    return trace


if __name__ == "__main__":
    os.makedirs(FIXTURE.parent, exist_ok=True)
    FIXTURE.write_text(json.dumps(record_trace(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
