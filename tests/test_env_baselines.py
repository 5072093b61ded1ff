"""Presets, the training family of configs, baselines and their evaluation, the demo."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from envs import multisearch_v0
from envs.baselines import HeuristicPolicy, RandomPolicy, evaluate_baseline
from envs.demo import main as demo_main


@pytest.mark.parametrize(
    "preset,grid,max_cycles,minimap,dims",
    [
        ("small", 16, 200, True, (235, 75)),
        ("large", 48, 1000, True, (331, 171)),
        ("memory", 24, 2000, False, (200, 40)),
    ],
)
def test_presets(preset, grid, max_cycles, minimap, dims):
    env = multisearch_v0.parallel_env(preset=preset)
    cfg = env.config
    assert (cfg.grid_size, cfg.max_cycles, cfg.minimap) == (grid, max_cycles, minimap)
    assert cfg.n_scouts >= 1 and cfg.n_rescuers >= 1
    obs, _ = env.reset(seed=0)
    assert obs["scout_0"]["observation"].shape == (dims[0],)
    assert obs["rescuer_0"]["observation"].shape == (dims[1],)
    assert env.state().shape == (4 * grid * grid + 2 * cfg.n_agents + 2,)


def test_defaults_are_small_preset_and_kwargs_override():
    default = multisearch_v0.parallel_env().config
    assert default == multisearch_v0.parallel_env(preset="small").config
    cfg = multisearch_v0.parallel_env(preset="large", grid_size=20, n_targets=5).config
    assert (cfg.grid_size, cfg.n_targets, cfg.max_cycles) == (20, 5, 1000)


FAMILY = list(
    itertools.product(
        (8, 11, 16),  # grid_size
        (1, 3),  # agents per type
        (1, 4),  # targets
        (0.0, 0.2),  # obstacle density
        (100, 300),  # max_cycles
    )
)


@pytest.mark.parametrize("grid,per_type,targets,density,cycles", FAMILY)
def test_family_configs_construct_and_run(grid, per_type, targets, density, cycles):
    kw = dict(
        grid_size=grid,
        n_scouts=per_type,
        n_rescuers=per_type,
        n_targets=targets,
        obstacle_density=density,
        max_cycles=cycles,
    )
    env = multisearch_v0.parallel_env(**kw)
    obs, _ = env.reset(seed=grid + targets)
    assert (
        obs["scout_0"]["observation"].shape == env.observation_space("scout_0")["observation"].shape
    )
    policy = RandomPolicy(0)
    for _ in range(5):
        obs, *_ = env.step(policy(obs))
    # observation size does not depend on the grid, agent or target counts
    assert env.config.obs_dim_scout == multisearch_v0.parallel_env().config.obs_dim_scout


def test_heuristic_solves_family_configs():
    for grid, per_type, targets, density, cycles in FAMILY[::3]:
        result = evaluate_baseline(
            "heuristic",
            seeds=range(8),
            grid_size=grid,
            n_scouts=per_type,
            n_rescuers=per_type,
            n_targets=targets,
            obstacle_density=density,
            max_cycles=cycles,
        )
        assert result["solved_rate"] >= 0.75, (grid, per_type, targets, density, cycles, result)


def test_heuristic_clearly_beats_random_on_small_preset():
    heuristic = evaluate_baseline("heuristic", seeds=range(48))
    random = evaluate_baseline("random", seeds=range(48))
    assert heuristic["success_rate"] >= 0.95 and heuristic["solved_rate"] >= 0.9
    assert random["success_rate"] <= 0.3
    assert heuristic["success_rate"] >= 3 * random["success_rate"]
    assert heuristic["steps"] < random["steps"]


def test_evaluate_baseline_matches_manual_parallel_loop():
    """The vectorised evaluation equals running each seed by hand in a parallel_env."""
    kw = dict(grid_size=10, n_targets=2, max_cycles=80)
    seeds = [3, 4, 5, 6]
    result = evaluate_baseline("heuristic", seeds=seeds, **kw)
    finals = []
    policy = HeuristicPolicy()
    for seed in seeds:
        env = multisearch_v0.parallel_env(**kw)
        obs, _ = env.reset(seed=seed)
        while env.agents:
            obs, _, _, _, infos = env.step(policy(obs, env))
        finals.append(infos["scout_0"])
    for key, name in [
        ("success", "success_rate"),
        ("solved", "solved_rate"),
        ("coverage", "coverage"),
        ("revisit_rate", "revisit_rate"),
        ("episode_length", "steps"),
    ]:
        assert result[name] == pytest.approx(np.mean([f[key] for f in finals]), abs=1e-12)
    assert result["n_episodes"] == 4


def test_random_policy_only_legal_actions():
    vec = multisearch_v0.vector_env(32)
    obs, _ = vec.reset(seed=0)
    policy = RandomPolicy(1)
    counts = np.zeros(6)
    for _ in range(60):
        actions = policy(obs, vec)
        counts += np.bincount(actions["rescuer_0"], minlength=6)
        obs, _, _, _, infos = vec.step(actions)
        assert all((infos[a]["invalid_action"] == 0).all() for a in vec.possible_agents)
    assert (counts[:5] > 0).all()  # every move is used


def test_evaluate_baseline_bad_policy():
    with pytest.raises(ValueError, match="unknown policy"):
        evaluate_baseline("greedy", seeds=[0])


def test_demo_runs_and_writes_media(tmp_path, capsys):
    assert demo_main(["--preset", "small", "--episodes", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "heuristic" in out and "random" in out and "success_rate" in out
    assert (tmp_path / "episode.gif").stat().st_size > 0
    assert (tmp_path / "episode.png").stat().st_size > 0
    with pytest.raises(SystemExit) as exit_info:
        demo_main(["--help"])
    assert exit_info.value.code == 0
