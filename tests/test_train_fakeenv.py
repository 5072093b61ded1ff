"""A second environment with the trainer contract (docs/CONTRACTS.md section 1): the signal game.

Not multisearch: the trainer must train it without changes to ``marl/``. Each step every agent
sees a private cue (one-hot) and should answer with the matching action. Agents ``caller_<i>``
(Discrete(4), action 3 always masked, cues in 0..2) and ``picker_<i>`` (Discrete(3)).

Rewards: individual +0.2 for a correct answer; penalty -0.05 for a wrong one; team +1 for a
step where every agent was correct. Terminated after ``goal`` all-correct steps, truncated at
``max_cycles``. Infos: the three reward channels, ``invalid_action``, ``success`` (all-correct
steps / goal, capped at 1), ``solved``, ``episode_length``. The random policy rarely solves.

``nan_at_call`` (test hook): the reward of every agent becomes NaN at that step() call.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

N_CUES = 3


class SignalVectorEnv:
    def __init__(
        self,
        num_envs: int,
        autoreset: bool = True,
        n_callers: int = 2,
        n_pickers: int = 1,
        max_cycles: int = 10,
        goal: int = 3,
        nan_at_call: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        self.num_envs = int(num_envs)
        self.autoreset = autoreset
        self.possible_agents = [f"caller_{i}" for i in range(n_callers)] + [
            f"picker_{i}" for i in range(n_pickers)
        ]
        self.n_actions = {a: (4 if a.startswith("caller") else 3) for a in self.possible_agents}
        self.obs_dim = N_CUES + 1
        self.max_cycles, self.goal, self.nan_at_call = max_cycles, goal, nan_at_call
        self.render_mode = render_mode
        n_ag = len(self.possible_agents)
        self.state_space = spaces.Box(0.0, 1.0, (n_ag * N_CUES + 2,), np.float32)
        self.rng = np.random.default_rng(0)
        self.calls = 0
        self.cues = np.zeros((self.num_envs, n_ag), np.int64)
        self.t = np.zeros(self.num_envs, np.int64)
        self.correct = np.zeros(self.num_envs, np.int64)
        self.frozen = np.zeros(self.num_envs, bool)
        self.ended_term = np.zeros(self.num_envs, bool)
        self.ended_trunc = np.zeros(self.num_envs, bool)
        self._final_state = None
        self._final_obs = None

    def observation_space(self, agent):
        return spaces.Dict(
            observation=spaces.Box(0.0, 1.0, (self.obs_dim,), np.float32),
            action_mask=spaces.Box(0, 1, (self.n_actions[agent],), np.int8),
        )

    def action_space(self, agent):
        return spaces.Discrete(self.n_actions[agent])

    def _obs(self):
        out = {}
        for j, a in enumerate(self.possible_agents):
            o = np.zeros((self.num_envs, self.obs_dim), np.float32)
            o[np.arange(self.num_envs), self.cues[:, j]] = 1.0
            o[:, -1] = (self.max_cycles - self.t) / self.max_cycles
            mask = np.ones((self.num_envs, self.n_actions[a]), np.int8)
            if a.startswith("caller"):
                mask[:, 3] = 0
            out[a] = {"observation": o, "action_mask": mask}
        return out

    def state(self):
        n = self.num_envs
        onehot = np.zeros((n, len(self.possible_agents), N_CUES), np.float32)
        onehot[np.arange(n)[:, None], np.arange(len(self.possible_agents))[None], self.cues] = 1
        extra = np.stack([self.t / self.max_cycles, self.correct / self.goal], 1)
        return np.concatenate([onehot.reshape(n, -1), extra], 1).astype(np.float32)

    def _reset_rows(self, rows):
        self.cues[rows] = self.rng.integers(0, N_CUES, (len(rows), len(self.possible_agents)))
        self.t[rows] = 0
        self.correct[rows] = 0

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed if isinstance(seed, int) else list(seed))
        self._reset_rows(np.arange(self.num_envs))
        self.frozen[:] = False
        self.ended_term[:] = False
        self.ended_trunc[:] = False
        obs = self._obs()
        self._final_obs, self._final_state = obs, self.state()
        return obs, self._zero_infos()

    def _zero_infos(self):
        z = np.zeros(self.num_envs)
        keys = (
            "reward_team",
            "reward_individual",
            "reward_penalty",
            "invalid_action",
            "success",
            "solved",
            "episode_length",
        )
        return {a: {k: z.copy() for k in keys} for a in self.possible_agents}

    def step(self, actions):
        self.calls += 1
        agents = self.possible_agents
        act = np.stack([np.asarray(actions[a], np.int64) for a in agents], 1)
        active = ~self.frozen
        right = act == self.cues
        invalid = np.zeros_like(right)
        for j, a in enumerate(agents):
            if a.startswith("caller"):
                invalid[:, j] = act[:, j] == 3
        all_right = right.all(1)
        ind = np.where(right, 0.2, 0.0) * active[:, None]
        pen = np.where(right, 0.0, -0.05) * active[:, None]
        team = np.where(all_right, 1.0, 0.0) * active
        self.correct += all_right & active
        self.t += active
        term = (self.correct >= self.goal) & active
        trunc = (self.t >= self.max_cycles) & active & ~term
        done = term | trunc
        success = np.minimum(self.correct / self.goal, 1.0)
        infos = {}
        for j, a in enumerate(agents):
            r_ind, r_pen = ind[:, j].copy(), pen[:, j].copy()
            if self.nan_at_call is not None and self.calls == self.nan_at_call:
                r_ind[:] = np.nan
            infos[a] = {
                "reward_team": team.copy(),
                "reward_individual": r_ind,
                "reward_penalty": r_pen,
                "invalid_action": invalid[:, j].astype(np.float64),
                "success": success * active,
                "solved": (self.correct >= self.goal).astype(np.float64) * active,
                "episode_length": self.t.astype(np.float64) * active,
            }
        rewards = {
            a: (
                infos[a]["reward_team"] + infos[a]["reward_individual"] + infos[a]["reward_penalty"]
            ).astype(np.float32)
            for a in agents
        }
        # new cues for the next step
        self.cues = np.where(
            active[:, None], self.rng.integers(0, N_CUES, self.cues.shape), self.cues
        )
        final_obs, final_state = self._obs(), self.state()
        if self.autoreset:
            rows = np.flatnonzero(done)
            if len(rows):
                self._reset_rows(rows)
            terms = {a: term.copy() for a in agents}
            truncs = {a: trunc.copy() for a in agents}
        else:
            self.ended_term |= term
            self.ended_trunc |= trunc
            self.frozen |= done
            terms = {a: self.ended_term.copy() for a in agents}
            truncs = {a: self.ended_trunc.copy() for a in agents}
        self._final_obs, self._final_state = final_obs, final_state
        return self._obs(), rewards, terms, truncs, infos

    @property
    def final_obs(self):
        return self._final_obs

    @property
    def final_state(self):
        return self._final_state

    def render(self, index: int = 0):
        img = np.zeros((24, 24, 3), np.uint8)
        img[:, : 8 * (1 + self.cues[index, 0])] = 255
        return img


def vector_env(num_envs: int, autoreset: bool = True, **kwargs) -> SignalVectorEnv:
    return SignalVectorEnv(num_envs, autoreset=autoreset, **kwargs)


def test_fake_env_follows_the_contract():
    vec = vector_env(4, max_cycles=5)
    obs, infos = vec.reset(seed=1)
    assert set(obs) == set(vec.possible_agents)
    assert obs["caller_0"]["observation"].shape == (4, 4)
    for _ in range(6):
        acts = {a: np.zeros(4, np.int64) for a in vec.possible_agents}
        obs, rew, term, trunc, infos = vec.step(acts)
        parts = sum(
            infos["caller_0"][k] for k in ("reward_team", "reward_individual", "reward_penalty")
        )
        np.testing.assert_allclose(rew["caller_0"], parts, rtol=1e-6)
    assert vec.state().shape == (4, vec.state_space.shape[0])
