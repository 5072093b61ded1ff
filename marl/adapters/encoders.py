"""Spaces to flat float32 vectors: one encoder per observation space (Box, Discrete,
MultiDiscrete, MultiBinary, Tuple, Dict) and the action-space check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from marl.adapters.options import UnsupportedSpaceError

_SUPPORTED_OBS = (
    "Box (1-D or 2-D, flattened), Discrete (one-hot), MultiDiscrete (one-hot per entry), "
    "MultiBinary, and Tuple / Dict of these (a Dict may carry an 'action_mask')"
)


class SpaceEncoder:
    """Writes one value of a gymnasium space into a flat float32 row ``out[dim]``."""

    dim: int

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        raise NotImplementedError


class BoxEncoder(SpaceEncoder):
    """Box: the values flattened (row-major) as float32."""

    def __init__(self, space: spaces.Box) -> None:
        self.dim = int(np.prod(space.shape)) if space.shape else 1
        self.flat = len(space.shape) <= 1

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        if self.flat:
            out[:] = value  # a 1-D value casts in place
        else:
            out[:] = np.asarray(value, dtype=np.float32).reshape(-1)


class DiscreteEncoder(SpaceEncoder):
    """Discrete(n, start): one-hot of ``value - start``, ``[n]``."""

    def __init__(self, space: spaces.Discrete) -> None:
        self.dim = int(space.n)
        self.start = int(space.start)

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        index = int(value) - self.start
        if not 0 <= index < self.dim:
            raise ValueError(
                f"observation {value!r} outside Discrete({self.dim}, start={self.start})"
            )
        out[:] = 0.0
        out[index] = 1.0


class MultiDiscreteEncoder(SpaceEncoder):
    """MultiDiscrete(nvec, start): one one-hot per entry (row-major), concatenated."""

    def __init__(self, space: spaces.MultiDiscrete) -> None:
        nvec = np.asarray(space.nvec, dtype=np.int64).reshape(-1)
        self.dim = int(nvec.sum())
        self.offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]]).astype(np.int64)
        self.start = np.asarray(space.start, dtype=np.int64).reshape(-1)
        self.nvec = nvec

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        index = np.asarray(value, dtype=np.int64).reshape(-1) - self.start
        if index.shape != self.nvec.shape or (index < 0).any() or (index >= self.nvec).any():
            raise ValueError(f"observation {value!r} outside MultiDiscrete({self.nvec.tolist()})")
        out[:] = 0.0
        out[self.offsets + index] = 1.0


class MultiBinaryEncoder(SpaceEncoder):
    """MultiBinary: the 0/1 entries flattened."""

    def __init__(self, space: spaces.MultiBinary) -> None:
        self.dim = int(np.prod(space.shape))

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        out[:] = np.asarray(value, dtype=np.float32).reshape(-1)


class ConcatEncoder(SpaceEncoder):
    """Tuple / Dict: the parts' encodings concatenated (``keys``: Dict keys or Tuple indices)."""

    def __init__(self, keys: Sequence[Any], parts: Sequence[SpaceEncoder]) -> None:
        self.keys = tuple(keys)
        self.parts = tuple(parts)
        bounds = np.concatenate([[0], np.cumsum([p.dim for p in parts])]).astype(int)
        self.slices = tuple(
            slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        )
        self.dim = int(bounds[-1])

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        for key, part, sl in zip(self.keys, self.parts, self.slices, strict=True):
            part.encode_into(value[key], out[sl])


def make_encoder(space: Any, *, what: str) -> SpaceEncoder:
    """The encoder of ``space`` (``what`` names it in errors, e.g. "observation of agent_0").

    Raises:
        UnsupportedSpaceError: images, Text, Graph, Sequence and other spaces, naming the
            space and what is supported.
    """
    if isinstance(space, spaces.Box):
        shape = tuple(space.shape)
        if len(shape) >= 3 or (len(shape) >= 2 and space.dtype == np.uint8):
            raise UnsupportedSpaceError(
                f"{what}: image observations are not supported ({space}); supported: "
                f"{_SUPPORTED_OBS}. Flatten or encode the image in a wrapper first"
            )
        return BoxEncoder(space)
    if isinstance(space, spaces.Discrete):
        return DiscreteEncoder(space)
    if isinstance(space, spaces.MultiDiscrete):
        return MultiDiscreteEncoder(space)
    if isinstance(space, spaces.MultiBinary):
        return MultiBinaryEncoder(space)
    if isinstance(space, spaces.Tuple):
        parts = [make_encoder(s, what=f"{what}[{i}]") for i, s in enumerate(space.spaces)]
        return ConcatEncoder(range(len(parts)), parts)
    if isinstance(space, spaces.Dict):
        keys = list(space.spaces)
        parts = [make_encoder(space.spaces[k], what=f"{what}[{k!r}]") for k in keys]
        return ConcatEncoder(keys, parts)
    raise UnsupportedSpaceError(
        f"{what}: unsupported space {space!r} ({type(space).__name__}); supported: {_SUPPORTED_OBS}"
    )


def observation_encoder(space: Any, what: str) -> tuple[SpaceEncoder, bool]:
    """(encoder of the observation part, whether the observation carries an action_mask)."""
    if isinstance(space, spaces.Dict) and "action_mask" in space.spaces:
        keys = [k for k in space.spaces if k != "action_mask"]
        keys.sort(key=lambda k: k != "observation")  # 'observation' first, then the others
        if not keys:
            raise UnsupportedSpaceError(f"{what}: a Dict with only an 'action_mask' ({space})")
        parts = [make_encoder(space.spaces[k], what=f"{what}[{k!r}]") for k in keys]
        return ConcatEncoder(keys, parts), True
    return make_encoder(space, what=what), False


def action_size(space: Any, what: str) -> tuple[int, int]:
    """(n, start) of a Discrete action space; UnsupportedSpaceError for anything else."""
    if isinstance(space, spaces.Discrete):
        return int(space.n), int(space.start)
    kind = "continuous actions" if isinstance(space, spaces.Box) else "this action space"
    raise UnsupportedSpaceError(
        f"{what}: {kind} not supported ({space!r}); supported: Discrete(n) actions only "
        "(wrap MultiDiscrete as one Discrete of the product, discretise a Box)"
    )
