"""Every shell command of README.md runs as written (issue 39, item 5).

The commands are read from README.md's ```bash blocks (continuation lines joined, comments
dropped, ``a && b`` split into its commands). :data:`CHECKS` says how each one is checked:

- ``run``: run it, in-process for ``python -m marl.*`` (``torchrun`` as a process), in one
  scratch directory shared by the README's commands (so ``runs/mappo`` is the run the README
  trained before it evaluates it), with the flags in ``set`` replaced or added: a tiny budget
  in place of the README's (one or two updates, or 1 s), a checkpoint that tiny run has. It
  must exit 0 without an ``error:`` line and write the files in ``writes``;
- ``dry-run``: ``marl.compare``'s ``--dry-run`` (validates every run it would start);
- ``skip``: not run here, with the reason and what checks it instead (installs, the whole
  suite, a Ray cluster, a GPU).

A command needing an extra that is not installed (``needs``) is skipped, naming the extra.
Checks marked ``slow`` (the Mamba and websearch runs, which compile their kernels for minutes
on a fresh install; W&B; torchrun) run in the slow tier; the fast tier still parses every
marl.train command and builds its env, which is what marl.train checks before it writes
anything.

A README command without an entry in :data:`CHECKS` fails: add it to the table.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from marl.experiments.compare import main as compare_main
from marl.run import train as train_module
from marl.run.config import parse_cli
from marl.run.evaluate import main as evaluate_main
from marl.run.train_seeds import seeds_invocation
from marl.train import main as train_main  # the entry point: --seeds dispatches there

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

#: how to install a module a command needs (the extra the README names)
INSTALL_HINT = {
    "wandb": "pip install -e '.[wandb]'",
    "ray": "pip install -e '.[ray]'",
    "mpe2": "pip install -e '.[dev]' (or pip install mpe2)",
    "popgym": "pip install -e '.[dev]' (or pip install popgym)",
    "pygame": "pip install 'gymnasium[classic-control]' (CartPole draws with pygame)",
}


@dataclasses.dataclass(frozen=True)
class Check:
    """How one README command is checked (see the module docstring)."""

    how: str  # "run", "dry-run" or "skip"
    why: str = ""  # skip: why, and what checks it instead
    set: dict[str, str] = dataclasses.field(default_factory=dict)  # flag -> value
    needs: tuple[str, ...] = ()  # modules the command needs (from the extras it names)
    after: str | None = None  # the README command whose output it reads
    writes: tuple[str, ...] = ()  # glob patterns, relative to the scratch directory
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # written before it runs
    slow: bool = False


INSTALL = "installs packages: tests/test_install.py installs the package into a fresh venv"
TINY_TIME = {"--max-time": "1"}  # in place of the README's minutes
MAPPO = "python -m marl.train --algo mappo --total-steps 2000000 --seed 1 --run-dir runs/mappo"
BATCH = "python -m marl.train --seeds 0-15 --total-steps 500000 --run-dir runs/batch"

#: README command (as :func:`readme_commands` spells it) -> how it is checked
CHECKS: dict[str, Check] = {
    # Quickstart
    "python3 -m venv .venv": Check("skip", INSTALL),
    ".venv/bin/pip install -q torch==2.13.0 -e '.[tensorboard]'": Check("skip", INSTALL),
    ".venv/bin/python -m marl.train --run-dir runs/demo --overwrite": Check(
        "run", set=TINY_TIME, writes=("runs/demo/finished.json", "runs/demo/episode.gif")
    ),
    "python -m marl.compare --report-only --out runs/cmp --export-marl-eval "
    "runs/cmp/marl_eval.json": Check(
        "skip",
        "needs a trained study: tests/test_marl_eval_export.py exports one and feeds it "
        "to marl-eval",
    ),
    "bash tests/run.sh": Check(
        "skip", "installs the dev extras and runs the whole suite: the suite this test is in"
    ),
    # Install
    ".venv/bin/pip install torch==2.13.0": Check("skip", INSTALL),
    ".venv/bin/pip install -e .": Check("skip", INSTALL),
    ".venv/bin/pip install torch==2.13.0 setuptools wheel packaging ninja": Check("skip", INSTALL),
    ".venv/bin/pip install --no-build-isolation -e '.[cuda]'": Check(
        "skip", "builds mamba-ssm against CUDA: benchmarks/gpu.sh on a GPU machine"
    ),
    # The environment: websearch with the budget behind its figure
    "python -m marl.train --env-fn envs.websearch_v2:vector_env --total-steps 3567616 --seed 0 "
    "--torch-threads 1 --run-dir runs/websearch": Check(
        "run", set={"--total-steps": "1"}, writes=("runs/websearch/finished.json",), slow=True
    ),
    # Training
    MAPPO: Check("run", set={"--total-steps": "2048"}, writes=("runs/mappo/finished.json",)),
    "python -m marl.train --algo mappo --recipe calibrated --max-time 900 --run-dir runs/cal": (
        Check("run", set=TINY_TIME, writes=("runs/cal/finished.json",))
    ),
    "python -m marl.train --algo mappo --backbone mamba --env.preset memory --max-time 900": Check(
        "run", set=TINY_TIME, writes=("runs/mappo-mamba-*/finished.json",), slow=True
    ),
    "python -m marl.train --algo grpo --group-size 8 --run-dir runs/grpo": Check(
        "run", set=TINY_TIME, writes=("runs/grpo/finished.json",)
    ),
    "python -m marl.train --config my.yaml --run-dir runs/mine": Check(
        "run",
        set=TINY_TIME,
        files={"my.yaml": "seed: 3\nwhitening: type\nenv:\n  preset: small\n"},
        writes=("runs/mine/finished.json",),
    ),
    # one update of 64 envs x 32 steps before; a budget of two now
    "python -m marl.train --resume runs/mappo --total-steps 4000000": Check(
        "run",
        set={"--total-steps": "4096"},
        after=MAPPO,
        writes=("runs/mappo/checkpoints/ckpt_2.pt",),
    ),
    "python -m marl.evaluate runs/mappo": Check("run", after=MAPPO, writes=("runs/mappo/eval_*",)),
    "python -m marl.evaluate runs/mappo --seeds 100-131 --gif ep.gif --checkpoint latest.pt": (
        Check("run", after=MAPPO, writes=("ep.gif",))
    ),
    "python -m marl.train --run-dir runs/wb --wandb": Check(
        "run", set=TINY_TIME, needs=("wandb",), writes=("runs/wb/wandb",), slow=True
    ),
    "torchrun --standalone --nproc_per_node=2 -m marl.train --algo grpo --total-steps 20000": (
        Check(
            "run", set={"--total-steps": "1"}, writes=("runs/grpo-mlp-*/finished.json",), slow=True
        )
    ),
    "python -m marl.train --help": Check("run"),
    # Many seeds at once (two seeds, one update each, in place of sixteen)
    BATCH: Check(
        "run",
        set={"--seeds": "2-3", "--total-steps": "2048"},
        writes=("runs/batch/seed_2/finished.json", "runs/batch/seed_3/eval.json"),
    ),
    "python -m marl.train --resume runs/batch --total-steps 1000000": Check(
        "run",
        set={"--total-steps": "4096"},
        after=BATCH,
        writes=("runs/batch/seed_3/checkpoints/ckpt_2.pt",),
    ),
    "python -m marl.evaluate runs/batch/seed_3": Check(
        "run", after=BATCH, writes=("runs/batch/seed_3/eval_*",)
    ),
    # Train on your own environment
    "python -m marl.train --env-fn mpe2.simple_speaker_listener_v4:parallel_env "
    "--env.max_cycles 25 --max-time 240": Check(
        "run", set=TINY_TIME, needs=("mpe2",), writes=("runs/mappo-mlp-*/finished.json",)
    ),
    "python -m marl.train --env-fn gymnasium:make --env.id CartPole-v1 --max-time 180": Check(
        "run", set=TINY_TIME, needs=("pygame",), writes=("runs/mappo-mlp-*/episode.gif",)
    ),
    "python -m marl.train --env-fn popgym.envs.repeat_previous:RepeatPreviousEasy --backbone gru "
    "--max-time 300": Check(
        "run", set=TINY_TIME, needs=("popgym",), writes=("runs/mappo-gru-*/finished.json",)
    ),
    # Comparing schemes
    "python -m marl.compare --algo mappo --study whitening --seeds 16 --total-steps 500000 "
    "--jobs 2 --out runs/wh": Check("dry-run"),
    "python -m marl.compare --algo mappo --variant baseline:--recipe=baseline --variant "
    "calibrated:--recipe=calibrated --seeds 8 --total-steps 1000000 --out runs/cmp": Check(
        "dry-run"
    ),
    "ray start --head --port 6379": Check(
        "skip", "starts a Ray cluster node (Ray's own CLI): tests/test_ray_launcher.py"
    ),
    "ray start --address HEAD:6379": Check(
        "skip", "joins a Ray cluster (Ray's own CLI): tests/test_ray_launcher.py"
    ),
    "python -m marl.compare --launcher ray --address HEAD:6379 --study whitening --seeds 10 "
    "--total-steps 500000 --out /shared/runs/wh": Check("dry-run", needs=("ray",)),
}


def readme_commands(text: str) -> list[str]:
    """The commands of the ```bash blocks of ``text``, in order: continuation lines joined,
    comments dropped, ``a && b`` split, each spelled ``shlex.join(tokens)``."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in re.sub(r"\\\n\s*", "", block).splitlines():
            command: list[str] = []
            for token in [*shlex.split(line, comments=True), "&&"]:
                if token != "&&":
                    command.append(token)
                elif command:
                    commands.append(shlex.join(command))
                    command = []
    return commands


COMMANDS = readme_commands(README.read_text())


def test_readme_commands_are_read_as_written():
    text = "```bash\npython -m a --x 1 \\\n    --y 2  # note\nb && c 'd e'\n```\n"
    text += "```python\nnot_a_command()\n```\n"
    assert readme_commands(text) == ["python -m a --x 1 --y 2", "b", "c 'd e'"]


def test_every_readme_command_has_a_check():
    missing = [c for c in COMMANDS if c not in CHECKS]
    assert not missing, "README commands without a check: add them to CHECKS: " + repr(missing)
    stale = [c for c in CHECKS if c not in COMMANDS]
    assert not stale, "CHECKS entries no README command has any more: " + repr(stale)


def test_the_websearch_command_carries_the_budget_behind_its_figure():
    """README's websearch figure ("success of about 0.8") is BENCHMARKS.md's at 3,567,616 env
    steps: the command beside it says that budget."""
    (command,) = [c for c in COMMANDS if "envs.websearch_v2:vector_env" in c]
    assert "--total-steps 3567616" in command
    assert "--total-steps 3567616" in (REPO / "BENCHMARKS.md").read_text()
    assert "3,567,616 env steps" in README.read_text()


def _substituted(args: list[str], values: dict[str, str]) -> list[str]:
    """``args`` with each flag of ``values`` set to its value (replaced, else added)."""
    out = list(args)
    for flag, value in values.items():
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def _skip_without(needs: tuple[str, ...]) -> None:
    for module in needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}: {INSTALL_HINT.get(module, 'pip install ' + module)}")


def _module_and_args(command: str) -> tuple[str, list[str]]:
    """(``marl.train`` / ``marl.evaluate`` / ``marl.compare`` / ``torchrun``, its arguments)."""
    tokens = shlex.split(command)
    if tokens[0] == "torchrun":
        return "torchrun", tokens[1:]
    assert tokens[0].endswith("python") and tokens[1] == "-m", command
    return tokens[2], tokens[3:]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """The directory the README's commands run in (as a user's checkout would be)."""
    return tmp_path_factory.mktemp("readme")


_ran: dict[str, int] = {}  # command -> exit status, for the commands run so far


def _run(command: str, scratch: Path, monkeypatch) -> int:
    """Run a README command as :data:`CHECKS` says (its prerequisite first); its exit status."""
    if command in _ran:
        return _ran[command]
    check = CHECKS[command]
    if check.after is not None:
        assert _run(check.after, scratch, monkeypatch) == 0, f"{check.after} failed"
    for name, text in check.files.items():
        (scratch / name).write_text(text)
    module, args = _module_and_args(command)
    args = _substituted(args, check.set)
    monkeypatch.chdir(scratch)
    monkeypatch.setenv("WANDB_MODE", "offline")  # a test uploads nothing
    if check.how == "dry-run":
        code = compare_main([*args, "--dry-run"])
    elif module == "marl.train":
        code = train_main(args)
    elif module == "marl.evaluate":
        code = evaluate_main(args)
    elif module == "torchrun":
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        res = subprocess.run([torchrun, *args], cwd=scratch, timeout=1200)
        code = res.returncode
    else:
        raise AssertionError(f"no runner for {module}: {command}")
    _ran[command] = code
    return code


def _params(slow: bool) -> list:
    return [
        pytest.param(c, id=c[:90])
        for c in COMMANDS
        if c in CHECKS and CHECKS[c].how != "skip" and CHECKS[c].slow == slow
    ]


def _check(command: str, scratch: Path, monkeypatch, capfd) -> None:
    check = CHECKS[command]
    _skip_without(check.needs)
    if check.after is not None:  # its output first, so that only this command's is read
        _run(check.after, scratch, monkeypatch)
        capfd.readouterr()
    existing = {p: set(glob.glob(str(scratch / p))) for p in check.writes}
    code = _run(command, scratch, monkeypatch)
    out, err = capfd.readouterr()
    assert code == 0, f"{command}: exit status {code}\n{err[-3000:]}"
    assert "error:" not in err, f"{command}:\n{err[-3000:]}"
    for pattern, before in existing.items():
        assert set(glob.glob(str(scratch / pattern))) - before, f"{command}: wrote no {pattern}"
    if command.endswith("--help"):
        assert "usage: python -m marl.train" in out


@pytest.mark.parametrize("command", _params(slow=False))
def test_readme_command(command, scratch, monkeypatch, capfd):
    _check(command, scratch, monkeypatch, capfd)


@pytest.mark.slow
@pytest.mark.parametrize("command", _params(slow=True))
def test_readme_command_slow(command, scratch, monkeypatch, capfd):
    _check(command, scratch, monkeypatch, capfd)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(c, id=c[:90])
        for c in COMMANDS
        if CHECKS.get(c, Check("skip")).how == "run"
        and _module_and_args(c)[0] in ("marl.train", "torchrun")
        and "--resume" not in c
        and not c.endswith("--help")
    ],
)
def test_readme_train_command_parses_and_builds_its_env(command, scratch, monkeypatch):
    """What marl.train checks before it writes anything: the flags and values, the algorithm,
    the env factory and its keyword arguments (the command's own budget, not the tiny one)."""
    check = CHECKS[command]
    _skip_without(check.needs)
    for name, text in check.files.items():
        (scratch / name).write_text(text)
    monkeypatch.chdir(scratch)
    args = _module_and_args(command)[1]
    args = args[args.index("marl.train") + 1 :] if "marl.train" in args else args
    _, rest = train_module._parse_wandb_flags(args)
    batch = seeds_invocation(rest)  # --seeds: the seeds are checked, the rest is a run's
    cfg = parse_cli(rest if batch is None else batch[1])
    train_module._check_env(cfg)
