"""Count the update path: the functions a reader follows from the train loop to the policy's
``optimizer.step()`` (issue 46, item 3), measured with a profiler rather than by reading.

    python benchmarks/update_path.py                       # MAPPO, default mlp backbone
    python benchmarks/update_path.py --algo grpo --backbone gru --seeds 0-1

It trains a short run of ``python -m marl.train`` in this process under ``sys.setprofile`` and
stops at the first ``step()`` of a ``torch.optim.Optimizer`` that an algorithm's ``update``
reaches. The path is

* the **spine**: every repository function (marl/, envs/, seqmodels/) on the call stack at
  that moment, from the train loop (``--from``, default ``_train_loop``, the loop of one run
  and of ``--seeds``: the entry points above it are not on the path) down to the
  function that calls ``optimizer.step()``;
* and every repository function **called in the policy phase** before that step: from the
  call of the spine's frame below ``update`` (the policy update of the batch, after the
  advantages) to the step (the minibatch's selection, the forward passes, the loss terms,
  ``backward`` and the gradient clipping).

Functions are told apart by file and qualified name; comprehensions, generator expressions
and lambdas count as part of the function they are written in. The rollout, the advantages
and the critic's update are not on the path. Prints the functions in the order they are
first entered, then ``N functions in F files``. ``--json FILE`` writes the list.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import types
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the repository first: the script's folder is on sys.path, and its seqmodels.py (a benchmark)
# would shadow the seqmodels package
sys.path.insert(0, REPO)
PACKAGES = tuple(os.path.join(REPO, p) + os.sep for p in ("marl", "envs", "seqmodels"))


class _Found(Exception):
    """Raised out of the profiler once the first policy step is reached."""


def _is_repo(code: types.CodeType) -> bool:
    return code.co_filename.startswith(PACKAGES)


def _is_named(code: types.CodeType) -> bool:
    """A function a reader reads as one: not a comprehension, generator expression or lambda
    (``<listcomp>``, ``<genexpr>``, ``<lambda>``: part of the function they are written in)."""
    return not code.co_name.startswith("<")


def _name(code: types.CodeType) -> tuple[str, str]:
    return os.path.relpath(code.co_filename, REPO), code.co_qualname


def _is_optimizer_step(frame: types.FrameType) -> bool:
    code = frame.f_code
    if code.co_name != "step" or "torch" + os.sep + "optim" not in code.co_filename:
        return False
    return any(f.f_code.co_name == "update" and _is_repo(f.f_code) for f in _stack(frame))


def _stack(frame: types.FrameType | None) -> list[types.FrameType]:
    """The frames from the outermost to ``frame``."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def trace_update_path(
    argv: list[str], origins: tuple[str, ...] = ("_train_loop",)
) -> list[tuple[str, str]]:
    """Train ``python -m marl.train ARGV`` until the first policy step of an update; returns the
    update path's functions ((file, qualname), in order of first entry), the spine from the
    outermost frame named one of ``origins`` (the train loop, of one run and of ``--seeds``;
    from the outermost repository frame if none is)."""
    from marl.train import main as train_main

    calls: list[tuple[types.FrameType, tuple[str, str]]] = []
    path: list[tuple[str, str]] = []

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        if _is_repo(frame.f_code):
            calls.append((frame, _name(frame.f_code)))
        elif _is_optimizer_step(frame):
            spine = [f for f in _stack(frame) if _is_repo(f.f_code)]
            first = next((i for i, f in enumerate(spine) if f.f_code.co_name in origins), 0)
            spine = spine[first:]
            below = next(
                i for i in range(len(spine) - 1, -1, -1) if spine[i].f_code.co_name == "update"
            )
            phase = spine[below + 1] if below + 1 < len(spine) else spine[below]
            start = next(i for i, (f, _) in enumerate(calls) if f is phase)
            seen: set[tuple[str, str]] = set()
            entered = [f.f_code for f in spine] + [f.f_code for f, _ in calls[start:]]
            for name in [_name(c) for c in entered if _is_named(c)]:
                if name not in seen:
                    seen.add(name)
                    path.append(name)
            raise _Found

    sys.setprofile(profile)
    try:
        train_main(argv)
    except _Found:
        pass
    finally:
        sys.setprofile(None)
    if not path:
        raise SystemExit("update_path: the run ended before any policy optimizer step")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algo", default="mappo", choices=("mappo", "grpo"))
    parser.add_argument("--backbone", default="mlp", help="the actor's backbone (default mlp)")
    parser.add_argument(
        "--seeds", default=None, help="a --seeds batch, e.g. 0-1 (default: one run)"
    )
    parser.add_argument(
        "--from",
        dest="start",
        default="_train_loop",
        help="the functions the path may start at, comma-separated (default: the train loop, "
        "of one run and of --seeds)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the list as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="update_path_") as tmp:
        train_args = [
            "--algo", args.algo, "--backbone", args.backbone, "--total-steps", "2048",
            "--run-dir", os.path.join(tmp, "run"), "--eval-every", "0",
        ]  # fmt: skip
        if args.seeds:
            train_args += ["--seeds", args.seeds]
        path = trace_update_path(train_args, tuple(args.start.split(",")))
    files = sorted({f for f, _ in path})
    for i, (file, qualname) in enumerate(path, 1):
        print(f"{i:3d}. {file}: {qualname}")
    print(f"{len(path)} functions in {len(files)} files")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"functions": [list(p) for p in path], "files": files}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
