"""Weights & Biases logging (``--wandb``), in offline mode: the same scalars as TensorBoard and
metrics.jsonl in one log call per update, the run's config, a resumed run continuing the same
W&B run; the install hint when wandb is missing; how the mode is chosen.

The offline run file (``RUN_DIR/wandb/offline-run-*/run-ID.wandb``) is read here with a small
reader of its record framing (W&B's LevelDB-log format: 32 KiB blocks of records, each a
7-byte header ``crc32, length, type`` and a protobuf ``Record``), not with wandb's own API."""

from __future__ import annotations

import glob
import json
import math
import os
import struct
import sys
import time

import pytest
import torch

from marl.run.checkpoint import load_checkpoint
from marl.run.runlog import WandbOptions, read_metrics, read_tensorboard_events
from marl.run.train import main as train_main

TINY = [
    "--env-fn", "test_train_fakeenv:vector_env", "--num-envs", "8", "--rollout-steps", "16",
    "--hidden-dim", "16", "--critic-hidden-dim", "16", "--eval-episodes", "2",
    "--eval-repeats", "1", "--eval-every", "2", "--progress", "false", "--baselines", "false",
    "--plots", "false", "--gif", "false", "--env.max_cycles", "6", "--env.goal", "2",
    "--checkpoint-every", "1",
]  # fmt: skip
STEPS = 128  # env steps per update
BLOCK = 32768
W_AND_B_KEYS = {"_step", "_runtime", "_timestamp"}


@pytest.fixture
def wandb_env(monkeypatch, tmp_path):
    """wandb importable, offline, and writing nothing outside tmp_path."""
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    torch.manual_seed(0)


def _records(path: str) -> list[bytes]:
    """The raw records of a .wandb file (after its 7-byte ':W&B' header)."""
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:4] == b":W&B"
    out, pos, partial = [], 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:  # zero padding
            continue
        if kind == 1:  # FULL
            out.append(chunk)
        elif kind == 2:  # FIRST
            partial = chunk
        elif kind == 3:  # MIDDLE
            partial += chunk
        elif kind == 4:  # LAST
            out.append(partial + chunk)
    return out


def _parsed(path: str) -> list:
    from wandb.proto import wandb_internal_pb2

    out = []
    for raw in _records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def _offline_run(run_dir, n_runs: int = 1, timeout_s: float = 60.0) -> dict:
    """History rows and run record of the newest offline W&B run in run_dir, once the
    ``n_runs`` offline runs there are complete (wandb's service writes the file after
    ``run.finish()`` returns: wait for each one's ``exit`` record)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
        paths = sorted(found, key=os.path.getmtime)  # oldest first
        kinds = [[r.WhichOneof("record_type") for r in _parsed(p)] for p in paths]
        if len(paths) >= n_runs and all("exit" in k for k in kinds):
            break
        assert time.monotonic() < deadline, f"offline W&B runs incomplete: {paths} {kinds}"
        time.sleep(0.2)
    out: dict = {"history": [], "run": None, "paths": paths}
    for record in _parsed(paths[-1]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            out["history"].append({k: v for k, v in row.items() if k not in W_AND_B_KEYS})
        elif kind == "run" and out["run"] is None:
            out["run"] = record.run
    return out


def _scalars(row: dict) -> dict:
    return {
        k: float(v)
        for k, v in row.items()
        if isinstance(v, (int, float)) and math.isfinite(v) and k != "update"
    }


def test_offline_run_logs_the_tensorboard_scalars(tmp_path, wandb_env) -> None:
    run = tmp_path / "run"
    argv = [*TINY, "--total-steps", str(3 * STEPS), "--run-dir", str(run), "--wandb"]
    argv += ["--wandb-mode", "offline", "--wandb-project", "ws", "--wandb-run-name", "tiny"]
    assert train_main(argv) == 0
    logged = _offline_run(run)
    rows = read_metrics(str(run / "metrics.jsonl"))
    # one history row per update, holding exactly the scalars of that update's row
    assert len(logged["history"]) == len(rows) == 3
    for got, row in zip(logged["history"], rows, strict=True):
        want = _scalars(row)
        assert set(got) == set(want)
        assert got == pytest.approx(want, rel=1e-6)
    assert "eval/success_rate" in logged["history"][1]  # --eval-every 2
    # and they are TensorBoard's (tag, step = env_steps)
    tb = {(step, tag): value for step, tag, value in read_tensorboard_events(str(run / "tb"))}
    wb = {(int(h["env_steps"]), k): v for h in logged["history"] for k, v in h.items()}
    assert set(wb) == set(tb)
    assert [wb[key] for key in sorted(tb)] == pytest.approx([tb[k] for k in sorted(tb)])
    meta = logged["run"]
    assert (meta.project, meta.display_name) == ("ws", "tiny")
    config = {item.key: json.loads(item.value_json) for item in meta.config.update}
    config = {
        k: v["value"] if isinstance(v, dict) and "value" in v else v for k, v in config.items()
    }
    assert config["num_envs"] == 8 and config["total_steps"] == 3 * STEPS


def test_resume_continues_the_same_wandb_run(tmp_path, wandb_env) -> None:
    run = tmp_path / "run"
    argv = [*TINY, "--total-steps", str(2 * STEPS), "--run-dir", str(run)]
    assert train_main([*argv, "--wandb", "--wandb-mode", "offline"]) == 0
    first_id = load_checkpoint(str(run / "checkpoints" / "latest.pt"))["wandb_run_id"]
    assert first_id and _offline_run(run)["run"].run_id == first_id
    resume = ["--resume", str(run), "--total-steps", str(3 * STEPS), "--progress", "false"]
    assert train_main([*resume, "--wandb", "--wandb-mode", "offline"]) == 0
    logged = _offline_run(run, n_runs=2)
    assert len(logged["paths"]) == 2 and logged["run"].run_id == first_id
    assert [h["env_steps"] for h in logged["history"]] == [3 * STEPS]  # the new update only
    assert load_checkpoint(str(run / "checkpoints" / "latest.pt"))["wandb_run_id"] == first_id


def test_missing_wandb_is_an_install_hint(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    run = tmp_path / "run"
    assert train_main([*TINY, "--total-steps", str(STEPS), "--run-dir", str(run), "--wandb"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "pip install 'coopsearch[wandb]'" in err
    assert not run.exists()  # refused before anything was written


def test_wandb_options_need_wandb(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert train_main([*TINY, "--run-dir", str(run), "--wandb-project", "p"]) == 2
    assert "--wandb-project without --wandb" in capsys.readouterr().err
    assert train_main([*TINY, "--run-dir", str(run), "--wandb", "--wandb-mode", "cloud"]) == 2
    assert "invalid choice: 'cloud'" in capsys.readouterr().err
    assert not run.exists()


def test_help_lists_the_wandb_flags(capsys) -> None:
    assert train_main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--wandb ", "--wandb-project", "--wandb-entity", "--wandb-run-name"):
        assert flag in out
    assert "--wandb-mode {online,offline,disabled}" in out


def test_default_mode(monkeypatch, tmp_path) -> None:
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert WandbOptions().resolved_mode() == "offline"  # no API key anywhere
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert WandbOptions().resolved_mode() == "online"  # wandb login's entry
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert WandbOptions().resolved_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert WandbOptions().resolved_mode() == "disabled"
    assert WandbOptions(mode="offline").resolved_mode() == "offline"
