"""Rendering of one env of a :class:`envs._multisearch_core.MultiSearchCore` (numpy only;
pygame optional).

* :func:`render_rgb` -- ``uint8 [G*cell_px, G*cell_px, 3]`` image;
* :func:`render_ansi` -- text frame;
* :class:`HumanRenderer` -- a pygame window when pygame is importable and a display exists,
  else the ansi frame printed to stdout.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from envs._multisearch_core import MultiSearchCore

__all__ = ["HumanRenderer", "render_ansi", "render_rgb"]

_UNEXPLORED = np.array([170, 170, 170], dtype=np.uint8)
_EXPLORED = np.array([245, 245, 240], dtype=np.uint8)
_VISITED = np.array([215, 228, 250], dtype=np.uint8)
_OBSTACLE = np.array([50, 50, 55], dtype=np.uint8)
_HIDDEN_TARGET = np.array([240, 170, 170], dtype=np.uint8)
_REPORTED_TARGET = np.array([215, 30, 30], dtype=np.uint8)
_SCOUT = np.array([40, 90, 220], dtype=np.uint8)
_RESCUER = np.array([20, 150, 60], dtype=np.uint8)


def render_rgb(core: MultiSearchCore, env: int = 0, cell_px: int = 12) -> np.ndarray:
    """Image of env ``env``: uint8 ``[G * cell_px, G * cell_px, 3]``.

    Grey: unexplored; off-white: explored; light blue: visited; dark: obstacle; pale red
    square: hidden target; red square: reported target; blue/green dots: scouts/rescuers.
    """
    if cell_px < 3:
        raise ValueError(f"cell_px must be >= 3, got {cell_px}")
    cfg = core.config
    g = cfg.grid_size
    colors = np.empty((g, g, 3), dtype=np.uint8)
    colors[:] = _UNEXPLORED
    colors[core.seen[env] > 0] = _EXPLORED
    colors[core.visited[env] > 0] = _VISITED
    colors[core.obstacle[env] > 0] = _OBSTACLE
    img = np.repeat(np.repeat(colors, cell_px, axis=0), cell_px, axis=1)
    img[::cell_px, :, :] = (img[::cell_px, :, :] * 0.85).astype(np.uint8)  # grid lines
    img[:, ::cell_px, :] = (img[:, ::cell_px, :] * 0.85).astype(np.uint8)
    margin = max(cell_px // 6, 1)

    def fill(r: int, c: int, color: np.ndarray, inset: int) -> None:
        r0, c0 = r * cell_px + inset, c * cell_px + inset
        img[r0 : r0 + cell_px - 2 * inset, c0 : c0 + cell_px - 2 * inset] = color

    for k in range(cfg.n_targets):
        state = core.target_state[env, k]
        if state != 2:
            r, c = core.target_pos[env, k]
            fill(int(r), int(c), _REPORTED_TARGET if state == 1 else _HIDDEN_TARGET, 1)
    for a in range(cfg.n_agents):
        r, c = core.agent_pos[env, a]
        fill(int(r), int(c), _SCOUT if a < cfg.n_scouts else _RESCUER, margin + 1)
    return img


def render_ansi(core: MultiSearchCore, env: int = 0) -> str:
    """Text frame of env ``env``.

    ``#`` obstacle, ``.`` unexplored, `` `` explored, ``T`` reported target, ``t`` hidden
    target, ``S``/``R`` scout/rescuer (``*`` several agents), then a status line.
    """
    cfg = core.config
    g = cfg.grid_size
    chars = np.full((g, g), " ", dtype="<U1")
    chars[core.seen[env] == 0] = "."
    chars[core.obstacle[env] > 0] = "#"
    for k in range(cfg.n_targets):
        state = core.target_state[env, k]
        if state != 2:
            r, c = core.target_pos[env, k]
            chars[r, c] = "T" if state == 1 else "t"
    for a in range(cfg.n_agents):
        r, c = core.agent_pos[env, a]
        chars[r, c] = "*" if chars[r, c] in ("S", "R", "*") else ("S" if a < cfg.n_scouts else "R")
    border = "+" + "-" * g + "+"
    rows = [border] + ["|" + "".join(row) + "|" for row in chars] + [border]
    rows.append(
        f"t={int(core.t[env])}/{cfg.max_cycles} collected={int(core.n_collected[env])}/"
        f"{cfg.n_targets} coverage={core.n_seen_free[env] / core.n_free[env]:.2f}"
    )
    return "\n".join(rows)


def _display_available() -> bool:
    if os.environ.get("SDL_VIDEODRIVER"):
        return True
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


class HumanRenderer:
    """A pygame window showing :func:`render_rgb` frames; prints the ansi frame instead when
    pygame is not installed or no display is available."""

    def __init__(self, fps: int) -> None:
        self.fps = fps
        self._pygame: Any = None
        self._screen: Any = None
        self._clock: Any = None
        self._fallback = not _display_available()

    def show(self, core: MultiSearchCore, env: int = 0) -> None:
        if not self._fallback and self._screen is None:
            try:
                os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
                import pygame

                pygame.init()
                frame = render_rgb(core, env)
                self._screen = pygame.display.set_mode(frame.shape[1::-1])
                pygame.display.set_caption("multisearch_v0")
                self._clock = pygame.time.Clock()
                self._pygame = pygame
            except Exception:  # ImportError, or pygame.error without a usable display
                self._fallback = True
        if self._fallback:
            print(render_ansi(core, env))
            return
        pygame = self._pygame
        pygame.event.pump()
        frame = render_rgb(core, env)
        surface = pygame.surfarray.make_surface(frame.transpose(1, 0, 2))
        self._screen.blit(surface, (0, 0))
        pygame.display.flip()
        self._clock.tick(self.fps)

    def close(self) -> None:
        if self._pygame is not None:
            self._pygame.display.quit()
            self._pygame = None
            self._screen = None
