"""Stepping ``num_envs`` copies in one process: :class:`CopyBatch` turns their dict-of-agent
results into the trainers' arrays (:class:`BatchStep`)."""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marl.adapters.inspection import EnvSpec
from marl.adapters.options import RESERVED_INFO_KEYS


@dataclass
class BatchStep:
    """One reset or step of ``n`` copies (A agents in ``EnvSpec.agents`` order).

    ``obs[j]: float32 [n, D_j]``, ``mask[j]: int8 [n, K_j]``, ``rewards: float32 [n, A]``,
    ``team``, ``individual``, ``penalty``, ``active: float64 [n, A]``, ``terminated``,
    ``truncated: bool [n]``, ``infos: {key: float64 [n, A]}`` (the env's numeric keys);
    ``final_index: int64 [m]`` (copies whose episode ended and were reset at this step) with
    their final ``final_obs[j] [m, D_j]``, ``final_mask[j]``, ``final_state [m, S]``;
    ``state [n, S]`` when computed eagerly (workers), else None.
    """

    obs: list[np.ndarray]
    mask: list[np.ndarray]
    rewards: np.ndarray
    team: np.ndarray
    individual: np.ndarray
    penalty: np.ndarray
    active: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: dict[str, np.ndarray]
    final_index: np.ndarray
    final_obs: list[np.ndarray]
    final_mask: list[np.ndarray]
    final_state: np.ndarray | None
    state: np.ndarray | None = None

    @staticmethod
    def concat(parts: Sequence[BatchStep]) -> BatchStep:
        """The copies of several batches, in order (the workers' slices)."""
        if len(parts) == 1:
            return parts[0]
        sizes = [len(p.terminated) for p in parts]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        n_agents = parts[0].rewards.shape[1]
        keys = list(dict.fromkeys(k for p in parts for k in p.infos))
        infos = {
            k: np.concatenate(
                [p.infos.get(k, np.zeros((s, n_agents))) for p, s in zip(parts, sizes, strict=True)]
            )
            for k in keys
        }

        def cat(name: str) -> Any:
            return np.concatenate([getattr(p, name) for p in parts])

        def cat_lists(name: str) -> list[np.ndarray]:
            return [
                np.concatenate(rows)
                for rows in zip(*(getattr(p, name) for p in parts), strict=True)
            ]

        finals = [p.final_state for p in parts]
        return BatchStep(
            obs=cat_lists("obs"),
            mask=cat_lists("mask"),
            rewards=cat("rewards"),
            team=cat("team"),
            individual=cat("individual"),
            penalty=cat("penalty"),
            active=cat("active"),
            terminated=cat("terminated"),
            truncated=cat("truncated"),
            infos=infos,
            final_index=np.concatenate(
                [p.final_index + o for p, o in zip(parts, offsets, strict=True)]
            ).astype(np.int64),
            final_obs=cat_lists("final_obs"),
            final_mask=cat_lists("final_mask"),
            final_state=None if finals[0] is None else np.concatenate(finals),
            state=None if parts[0].state is None else cat("state"),
        )


def _is_number(value: Any) -> bool:
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return True
    return isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "biuf"


class CopyBatch:
    """``n`` copies of one env stepped in this process (the adapter's engine).

    Keeps each copy's live agents, step count and (``autoreset=False``) frozen state; does the
    same-step autoreset itself, so that worker processes (:mod:`marl.adapters.workers`) run
    exactly this code on their slice of the copies. The per-copy loop works on Python lists
    (one NumPy conversion per step), since the envs' own steps are Python too.
    """

    def __init__(
        self, envs: Sequence[Any], spec: EnvSpec, *, autoreset: bool, eager_state: bool = False
    ) -> None:
        self.envs = list(envs)
        self.spec = spec
        self.autoreset = bool(autoreset)
        self.eager_state = bool(eager_state)
        n = len(self.envs)
        self.n = n
        #: per copy, the indices of the agents acting at the next step (sorted)
        self.live: list[list[int]] = [[] for _ in range(n)]
        self.steps = [0] * n
        self.ended = [False] * n  # autoreset=False: frozen copies
        self.flags = [(False, False)] * n  # frozen copies' (terminated, truncated)
        self.started = False
        self._obs: list[np.ndarray] = [
            np.zeros((n, a.obs_encoder.dim), np.float32) for a in spec.agents
        ]
        self._mask: list[np.ndarray] = [np.ones((n, a.n_actions), np.int8) for a in spec.agents]

    # -- encoding ------------------------------------------------------------------------------
    def _write_obs(
        self,
        i: int,
        obs: Mapping[Any, Any],
        infos: Mapping[Any, Any],
        present: Sequence[int],
        obs_out: list[np.ndarray],
        mask_out: list[np.ndarray],
    ) -> None:
        """Row i of ``obs_out`` / ``mask_out`` from the env's dicts for the agents in
        ``present`` (zeros / all allowed for the others and where the env gave none)."""
        for j, agent in enumerate(self.spec.agents):
            value = obs.get(agent.env_name) if j in present else None
            if value is None:
                obs_out[j][i] = 0.0
                mask_out[j][i] = 1
                continue
            mask = None
            if agent.mask_in_obs:
                mask = value["action_mask"]
            else:
                info = infos.get(agent.env_name)
                if isinstance(info, Mapping):
                    mask = info.get("action_mask")
            agent.obs_encoder.encode_into(value, obs_out[j][i])
            if mask is None:
                mask_out[j][i] = 1
            else:
                mask = np.asarray(mask).reshape(-1)
                if mask.shape[0] != agent.n_actions:
                    raise ValueError(
                        f"action_mask of agent {agent.env_name!r} has {mask.shape[0]} entries, "
                        f"its action space {agent.n_actions}"
                    )
                mask_out[j][i] = mask != 0

    def _env_state(self, i: int) -> np.ndarray:
        env = self.envs[i]
        method = getattr(env, self.spec.state_method, None)
        if method is None:
            method = getattr(env.unwrapped, self.spec.state_method)
        out = np.empty(self.spec.state_dim, np.float32)
        self.spec.state_encoder.encode_into(method(), out)  # type: ignore[union-attr]
        return out

    def state(self) -> np.ndarray:
        """float32 ``[n, S]`` of the copies' current episodes."""
        if self.spec.state_method == "obs":
            return np.concatenate(self._obs, axis=1)
        return np.stack([self._env_state(i) for i in range(self.n)])

    def _live_from_env(self, i: int) -> list[int]:
        index = self.spec.index
        live = []
        for name in getattr(self.envs[i], "agents", ()):
            j = index.get(name)
            if j is None:
                raise ValueError(f"the env has an agent {name!r} not in its possible_agents")
            live.append(j)
        live.sort()
        return live

    def _collect_infos(
        self, i: int, env_infos: Mapping[Any, Any], infos: dict[str, np.ndarray]
    ) -> None:
        for name, info in env_infos.items():
            j = self.spec.index.get(name)
            if j is None or not isinstance(info, Mapping):
                continue
            for key, value in info.items():
                if key in RESERVED_INFO_KEYS or key == "action_mask" or not _is_number(value):
                    continue
                array = infos.get(key)
                if array is None:
                    array = infos[key] = np.zeros((self.n, len(self.spec.agents)))
                array[i, j] = float(value)

    # -- reset / step ----------------------------------------------------------------------
    def _buffers(self, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Fresh observation and mask arrays ``[n, D_j]``, ``[n, K_j]`` per agent."""
        agents = self.spec.agents
        return (
            [np.empty((n, a.obs_encoder.dim), np.float32) for a in agents],
            [np.empty((n, a.n_actions), np.int8) for a in agents],
        )

    def _new_step(
        self, rows: dict[str, list], obs: list[np.ndarray], mask: list[np.ndarray]
    ) -> BatchStep:
        """A BatchStep around this step's per-copy Python rows and observation arrays."""
        agents = self.spec.agents
        return BatchStep(
            obs=obs,
            mask=mask,
            rewards=np.array(rows["rewards"], np.float32).reshape(self.n, len(agents)),
            team=np.array(rows["team"], np.float64).reshape(self.n, len(agents)),
            individual=np.array(rows["individual"], np.float64).reshape(self.n, len(agents)),
            penalty=np.array(rows["penalty"], np.float64).reshape(self.n, len(agents)),
            active=np.array(rows["active"], np.float64).reshape(self.n, len(agents)),
            terminated=np.array(rows["terminated"], bool).reshape(self.n),
            truncated=np.array(rows["truncated"], bool).reshape(self.n),
            infos={},
            final_index=np.zeros(0, np.int64),
            final_obs=[],
            final_mask=[],
            final_state=None,
        )

    def _zero_rows(self) -> dict[str, list]:
        A = len(self.spec.agents)
        rows: dict[str, list] = {
            k: [[0.0] * A for _ in range(self.n)]
            for k in ("rewards", "team", "individual", "penalty", "active")
        }
        rows["terminated"] = [False] * self.n
        rows["truncated"] = [False] * self.n
        return rows

    def reset(self, seeds: Sequence[int | None], options: dict | None = None) -> BatchStep:
        """Reset copy i with ``seeds[i]`` (None: continue its stream)."""
        if len(seeds) != self.n:
            raise ValueError(f"{len(seeds)} seeds for {self.n} copies")
        rows = self._zero_rows()
        obs_out, mask_out = self._buffers(self.n)
        step_infos: dict[str, np.ndarray] = {}
        for i, env in enumerate(self.envs):
            obs, infos = env.reset(seed=seeds[i], options=options)
            infos = infos or {}
            self.live[i] = self._live_from_env(i)
            for j in self.live[i]:
                rows["active"][i][j] = 1.0
            self._write_obs(i, obs, infos, self.live[i], obs_out, mask_out)
            self._collect_infos(i, infos, step_infos)
        out = self._new_step(rows, obs_out, mask_out)
        out.infos = step_infos
        self.steps = [0] * self.n
        self.ended = [False] * self.n
        self.flags = [(False, False)] * self.n
        self.started = True
        self._finish(out, [], *self._buffers(0), [])
        return out

    def step(self, actions: np.ndarray) -> BatchStep:
        """Step every copy: ``actions[i, j]`` is the trainer's action of agent j in copy i."""
        if not self.started:
            raise ValueError("step() called before reset(): call reset() first")
        spec = self.spec
        agents = spec.agents
        names = [a.env_name for a in agents]
        starts = [a.action_start for a in agents]
        action_rows = np.asarray(actions).tolist()
        rows = self._zero_rows()
        obs_out, mask_out = self._buffers(self.n)
        final_obs, final_mask = self._buffers(self.n)  # rows of the copies reset at this step
        finals: list[int] = []
        final_states: list[np.ndarray] = []
        step_infos: dict[str, np.ndarray] = {}
        for i, env in enumerate(self.envs):
            if self.ended[i]:  # autoreset=False: frozen until reset()
                rows["terminated"][i], rows["truncated"][i] = self.flags[i]
                for j in range(len(agents)):
                    obs_out[j][i] = self._obs[j][i]
                    mask_out[j][i] = self._mask[j][i]
                continue
            acting = self.live[i]
            row = action_rows[i]
            obs, rewards, terms, truncs, infos = env.step(
                {names[j]: row[j] + starts[j] for j in acting}
            )
            infos = infos or {}
            self.steps[i] += 1
            self._write_rewards(i, acting, names, rewards, infos, rows)
            if infos:
                self._collect_infos(i, infos, step_infos)
            still, ended, terminated = self._episode_end(i, acting, names, terms, truncs)
            if not ended:  # agents that left: zero observation, every action allowed
                self._write_obs(i, obs, infos, still, obs_out, mask_out)
                self.live[i] = still
                continue
            rows["terminated"][i], rows["truncated"][i] = terminated, not terminated
            if not self.autoreset:  # the final observation stays until reset()
                self._write_obs(i, obs, infos, acting, obs_out, mask_out)
                self.ended[i] = True
                self.flags[i] = (terminated, not terminated)
                self.live[i] = []
                continue
            # same-step autoreset: keep the final observation / state, then reset the copy
            self._write_obs(i, obs, infos, acting, final_obs, final_mask)
            finals.append(i)
            if spec.state_method != "obs":
                final_states.append(self._env_state(i))
            reset_obs, reset_infos = env.reset(seed=None)
            self.live[i] = self._live_from_env(i)
            self.steps[i] = 0
            self._write_obs(i, reset_obs, reset_infos or {}, self.live[i], obs_out, mask_out)
        out = self._new_step(rows, obs_out, mask_out)
        out.infos = step_infos
        self._finish(
            out,
            finals,
            [f[finals] for f in final_obs],
            [f[finals] for f in final_mask],
            final_states,
        )
        return out

    def _write_rewards(
        self,
        i: int,
        acting: list[int],
        names: list[str],
        rewards: Mapping[Any, Any],
        infos: Mapping[Any, Any],
        rows: dict[str, list],
    ) -> None:
        """Copy i's rows of ``rows`` (see :meth:`_zero_rows`) from one env step: the acting
        agents' rewards and active flags, and the team / individual / penalty channels (the
        env's own ``reward_*`` infos where it reports them for every acting agent, else the
        rewards split by ``spec.team_reward``)."""
        spec = self.spec
        n_agents = len(spec.agents)
        own = [float(rewards.get(names[j], 0.0)) for j in acting]
        reward_row, active_row = rows["rewards"][i], rows["active"][i]
        team_row, ind_row, pen_row = rows["team"][i], rows["individual"][i], rows["penalty"][i]
        for j, r in zip(acting, own, strict=True):
            reward_row[j] = r
            active_row[j] = 1.0
        channel_infos = [infos.get(names[j]) for j in acting]
        has_channels = spec.reward_channels != "reward" and all(
            isinstance(info, Mapping)
            and "reward_team" in info
            and "reward_individual" in info
            and "reward_penalty" in info
            for info in channel_infos
        )
        if has_channels and acting:
            if spec.team_reward_explicit and spec.reward_channels == "auto":
                raise ValueError(
                    "adapter_team_reward was given, but the env reports its own reward "
                    "channels (reward_team / reward_individual / reward_penalty infos), "
                    "which the adapter keeps: remove adapter_team_reward, or pass "
                    "adapter_reward_channels reward to use the rewards instead"
                )
            team = [float(info["reward_team"]) for info in channel_infos]
            team_row[:] = [sum(team) / len(team)] * n_agents  # left agents: the team's
            for k, j in enumerate(acting):
                team_row[j] = team[k]
                ind_row[j] = float(channel_infos[k]["reward_individual"])
                pen_row[j] = float(channel_infos[k]["reward_penalty"])
        elif spec.reward_channels == "infos":
            raise ValueError(
                "adapter_reward_channels infos: the env's infos lack reward_team / "
                "reward_individual / reward_penalty for some live agent"
            )
        else:
            team_mode = spec.team_reward
            if team_mode == "none" or not own:
                team_value = 0.0
            else:
                team_value = sum(own) / len(own) if team_mode == "mean" else sum(own)
            team_row[:] = [team_value] * n_agents
            for j, r in zip(acting, own, strict=True):
                ind_row[j] = r

    def _episode_end(
        self,
        i: int,
        acting: list[int],
        names: list[str],
        terms: Mapping[Any, Any],
        truncs: Mapping[Any, Any],
    ) -> tuple[list[int], bool, bool]:
        """After copy i's step: its agents still live (sorted), whether its episode ended
        (no agent left, or ``spec.max_cycles`` steps), and whether it terminated: it ended with
        no acting agent truncated but not terminated, and not at the step limit (otherwise it
        was truncated)."""
        truncated_now = False
        done_now = set()
        for j in acting:
            term = bool(terms.get(names[j], False))
            trunc = bool(truncs.get(names[j], False))
            if term or trunc:
                done_now.add(j)
                truncated_now |= trunc and not term
        still = [j for j in self._live_from_env(i) if j not in done_now]
        ended = not still
        terminated = ended and not truncated_now
        if not ended and self.steps[i] >= self.spec.max_cycles:
            ended, terminated = True, False
        return still, ended, terminated

    def _finish(
        self,
        out: BatchStep,
        finals: list[int],
        final_obs: list[np.ndarray],
        final_mask: list[np.ndarray],
        final_states: list[np.ndarray],
    ) -> None:
        """Attach the final observations / states of the copies reset at this step."""
        out.final_index = np.asarray(finals, np.int64)
        out.final_obs, out.final_mask = final_obs, final_mask
        if self.spec.state_method == "obs":
            out.final_state = np.concatenate(final_obs, axis=1)
        elif final_states:
            out.final_state = np.stack(final_states)
        else:
            out.final_state = np.zeros((0, self.spec.state_dim), np.float32)
        self._obs, self._mask = out.obs, out.mask
        if self.eager_state:
            out.state = self.state()

    def render(self, index: int) -> Any:
        return self.envs[index].render()

    def __getstate__(self) -> dict:
        """Pickled with the copies only when they also restore (checkpoints keep the envs):
        the restored copies must unpickle and take a step; otherwise a TypeError (a resumed
        run then resets its envs)."""
        try:
            restored = pickle.loads(pickle.dumps(self.envs))
            for i, env in enumerate(restored):
                acting = self.live[i]
                if self.started and not self.ended[i] and len(acting):
                    agents = [self.spec.agents[j] for j in acting]
                    env.step({a.env_name: a.action_start for a in agents})
        except Exception as exc:  # noqa: BLE001 - any failure means: cannot be restored
            raise TypeError(
                f"the env copies cannot be pickled and restored ({type(exc).__name__}: {exc})"
            ) from exc
        return self.__dict__.copy()

    def close(self) -> None:
        for env in self.envs:
            close = getattr(env, "close", None)
            if callable(close):
                close()
