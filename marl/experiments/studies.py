"""Built-in studies for ``python -m marl.compare --study NAME``.

Each study is a list of named variants (train options, as ``--field=value`` strings of
``python -m marl.train``, see ``marl/run/config.py``) and a reference variant that the others are
compared against (probability of improvement).

=============  ================================================================================
study          variants
=============  ================================================================================
whitening      none, batch, type, team_individual at alpha 0.25 / 0.5 / 0.75 (inner grouping by
               agent type), running (exact running statistics); with a sequence backbone (gru,
               mamba, mamba2) also position and chunk. Reference: batch. With ``--algo grpo``
               the schemes are a second stage on GRPO's group-relative advantage: ti_a0.5
               would be none again (no second stage, alpha 0.5), so it is left out.
calibration    baseline (``--recipe=baseline``: plain batch whitening), then seed 000's
               (docs/seeds.md) staged enabling on top of it: value stabilisation (clipped
               value loss 0.1, 4 value epochs, value normalisation; MAPPO only, GRPO has no
               critic), + batch
               whitening then clip 5, + entropy bonus 0.01 and asymmetric ratio clip (0.1
               below, 0.2 above), + the learnable optimism offset b (init 0.5), and the full
               ``--recipe=calibrated`` (symmetric ratio clip, with the offset). Reference:
               baseline.
memory         mlp vs gru vs mamba vs mamba2 backbones on the memory preset of the environment
               (``--env.preset=memory``: no minimap, long episodes). Reference: mlp.
memory_       mlp / gru / mamba / mamba2 x two training settings (t32: rollout 32, window 16,
factorial      penalty channel on, the published gru's; t128: rollout 128, window 64, penalty
               channel off, the published mamba's), memory preset. Reference: gru_t32; six
               more pre-registered comparisons: mamba and mamba2 vs gru at t128, gru vs mlp at
               t128, t128 vs t32 for mlp, mamba and mamba2. Run it with ``--env.preset`` left
               to the study (it sets ``--env.preset=memory`` and ``--eval-repeats=1``).
calibration_   seed 000's ingredients one at a time from ``--recipe=baseline`` (value
ladder         stabilisation (MAPPO only), + advantage clip 5, + entropy bonus 0.01, + optimism
               offset 0.5) to ``--recipe=calibrated`` (the last rung adds gradient clipping),
               and the library default. Reference: baseline; pre-registered: each rung vs
               the one before, calibrated vs default.
whitening_     none / batch / type / team_individual at alpha 0.5 and 0.25 (per type) on the
scales         hard preset; give the task's scale with
               ``--common=--env.rescuer_reward_scale=10`` (or 100). Reference: batch. With
               ``--algo grpo`` ti_a0.5 is left out (it is none: no second stage).
grouping       sequence backbones only (gru, mamba, mamba2): the default scheme
               (team_individual: team and individual advantages whitened separately, mixed
               by alpha 0.5) with its statistics grouped per agent type (the default) vs per
               position in the training window vs per chunk of 8 positions (seed 003's
               pairing). Only the group key differs, so the study says which default
               grouping sequence backbones should have. Reference: type.
=============  ================================================================================
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["Study", "STUDIES", "SEQUENCE_BACKBONES", "get_study"]

#: Backbones with memory over a sequence window (the whitening study adds position/chunk).
SEQUENCE_BACKBONES = ("gru", "mamba", "mamba2")


@dataclass(frozen=True)
class Study:
    """A named set of variants: ``variants`` maps variant name -> train options."""

    name: str
    description: str
    reference: str
    variants: dict[str, list[str]]
    comparisons: tuple[tuple[str, str], ...] = ()
    """Pre-registered primary comparisons beyond each variant vs the reference: (A, B) asks
    whether A beats B."""


def _drop_grpo_no_second_stage(variants: dict[str, list[str]]) -> None:
    """Under GRPO, team_individual at alpha 0.5 is no second stage at the default alpha: the
    'none' variant (GRPOConfig.no_ops), so ti_a0.5 would repeat it (marl.compare refuses)."""
    del variants["ti_a0.5"]


def _whitening(backbone: str, algo: str) -> Study:
    variants: dict[str, list[str]] = {
        "none": ["--whitening=none"],
        "batch": ["--whitening=batch"],
        "type": ["--whitening=type"],
        "ti_a0.25": ["--whitening=team_individual", "--alpha=0.25", "--whiten-inner=type"],
        "ti_a0.5": ["--whitening=team_individual", "--alpha=0.5", "--whiten-inner=type"],
        "ti_a0.75": ["--whitening=team_individual", "--alpha=0.75", "--whiten-inner=type"],
        "running": ["--whitening=running"],
    }
    if backbone in SEQUENCE_BACKBONES:
        variants["position"] = ["--whitening=position"]
        variants["chunk"] = ["--whitening=chunk", "--chunk-size=8"]  # as in the grouping study
    description = "Grouped advantage whitening schemes (one grouped kernel, marl.core.whitening)."
    if algo == "grpo":
        _drop_grpo_no_second_stage(variants)
        description += (
            " With GRPO the schemes are a second stage on top of its group-relative advantage: "
            "'none' is no second stage at the default alpha 0.5 ('ti_a0.5' would be the same "
            "configuration and is left out), ti_a0.25 / ti_a0.75 change the group-relative "
            "mix's alpha."
        )
    return Study(
        name="whitening",
        description=description,
        reference="batch",
        variants=variants,
    )


def _calibration(backbone: str, algo: str) -> Study:
    entropy_asym = ["--ent-coef=0.01", "--clip-low=0.1", "--clip-high=0.2"]
    whiten_clip = ["--whitening=batch", "--adv-clip=5.0"]
    offset = ["--optimism-offset=0.5"]
    if algo == "grpo":  # no critic: the value-stabilisation stage does not exist
        variants = {
            "baseline": ["--recipe=baseline"],
            "whiten_clip": ["--recipe=baseline", *whiten_clip],
            "whiten_clip+ent_asym": ["--recipe=baseline", *whiten_clip, *entropy_asym],
            "whiten_clip+ent_asym+offset": [
                "--recipe=baseline",
                *whiten_clip,
                *entropy_asym,
                *offset,
            ],
            "calibrated": ["--recipe=calibrated"],
        }
    else:
        value_stab = [
            "--recipe=baseline",
            "--value-clip=0.1",
            "--value-epochs=4",
            "--value-norm=true",
        ]
        variants = {
            "baseline": ["--recipe=baseline"],
            "value_stab": value_stab,
            "value_stab+whiten_clip": [*value_stab, *whiten_clip],
            "value_stab+whiten_clip+ent_asym": [*value_stab, *whiten_clip, *entropy_asym],
            "value_stab+whiten_clip+ent_asym+offset": [
                *value_stab,
                *whiten_clip,
                *entropy_asym,
                *offset,
            ],
            "calibrated": ["--recipe=calibrated"],
        }
    return Study(
        name="calibration",
        description=(
            "Seed 000's calibrated recipe vs the baseline, with its staged enabling: value "
            "stabilisation (MAPPO only), + batch whitening and clip, + entropy bonus and "
            "asymmetric clip."
        ),
        reference="baseline",
        variants=variants,
    )


def _memory(backbone: str, algo: str) -> Study:
    return Study(
        name="memory",
        description="Backbones on the memory preset (no minimap: memory is necessary).",
        reference="mlp",
        variants={
            kind: [f"--backbone={kind}", "--env.preset=memory"]
            for kind in ("mlp", "gru", "mamba", "mamba2")
        },
    )


def _grouping(backbone: str, algo: str) -> Study:
    if backbone not in SEQUENCE_BACKBONES:
        raise ValueError(
            f"the grouping study compares whitening groups within training windows and needs a "
            f"sequence backbone ({', '.join(SEQUENCE_BACKBONES)}); got --backbone={backbone}: "
            "add --common=--backbone=mamba (for example)"
        )
    default_scheme = ["--whitening=team_individual", "--alpha=0.5"]
    return Study(
        name="grouping",
        description=(
            "Seed 003's pairing for sequence backbones: the default whitening (team and "
            "individual advantages whitened separately, mixed by alpha) with its statistics "
            "grouped per agent type vs per position in the training window vs per chunk of "
            "positions."
        ),
        reference="type",
        variants={
            "type": [*default_scheme, "--whiten-inner=type"],
            "position": [*default_scheme, "--whiten-inner=position"],
            # 8 positions a chunk: 2 chunks of gru's 16-step window, 8 of mamba's 64 (the
            # default chunk_size, 64, would be one chunk of mamba's window: batch whitening)
            "chunk": [*default_scheme, "--whiten-inner=chunk", "--chunk-size=8"],
        },
    )


#: The memory factorial's two training settings: the rollout length, the training window, the
#: penalty channel and an evaluation cadence of one evaluation every 65,536 env steps (64 envs).
FACTORIAL_SETTINGS: dict[str, list[str]] = {
    "t32": [
        "--rollout-steps=32",
        "--seq-len=16",
        "--penalty-channel=individual",
        "--eval-every=32",
    ],
    "t128": [
        "--rollout-steps=128",
        "--seq-len=64",
        "--penalty-channel=none",
        "--eval-every=8",
    ],
}


def _memory_factorial(backbone: str, algo: str) -> Study:
    backbones = ("mlp", "gru", "mamba", "mamba2")
    variants = {
        f"{kind}_{name}": [
            f"--backbone={kind}",
            "--env.preset=memory",
            "--eval-repeats=1",
            "--burn-in=0",
            *options,
        ]
        for name, options in FACTORIAL_SETTINGS.items()
        for kind in backbones
    }
    comparisons = (
        # the architecture at the same settings (vs the reference gru_t32 at t32)
        ("mamba_t128", "gru_t128"),
        ("mamba2_t128", "gru_t128"),
        ("gru_t128", "mlp_t128"),
        # the settings within each backbone (gru's is against the reference)
        ("mlp_t128", "mlp_t32"),
        ("mamba_t128", "mamba_t32"),
        ("mamba2_t128", "mamba2_t32"),
    )
    return Study(
        name="memory_factorial",
        description=(
            "Backbone (mlp, gru, mamba, mamba2) x training settings (t32: rollout 32, window "
            "16, penalty channel on; t128: rollout 128, window 64, penalty channel off) on the "
            "memory preset, at equal env steps: does Mamba beat GRU at the same settings, and "
            "which factor explains the published gap (mamba at t128 vs gru at t32)?"
        ),
        reference="gru_t32",
        variants=variants,
        comparisons=comparisons,
    )


def _calibration_ladder(backbone: str, algo: str) -> Study:
    # the ingredients that separate --recipe=baseline from --recipe=calibrated, in seed 000's
    # order; the last rung adds gradient clipping and is the calibrated recipe itself
    ingredients: list[tuple[str, list[str]]] = [
        ("adv_clip", ["--adv-clip=5.0"]),
        ("ent", ["--ent-coef=0.01"]),
        ("offset", ["--optimism-offset=0.5"]),
    ]
    if algo != "grpo":  # GRPO has no critic: no value stabilisation rung
        ingredients.insert(
            0, ("value_stab", ["--value-clip=0.1", "--value-epochs=4", "--value-norm=true"])
        )
    variants: dict[str, list[str]] = {"baseline": ["--recipe=baseline"]}
    rungs = ["baseline"]
    options = ["--recipe=baseline"]
    for name, added in ingredients:
        options = [*options, *added]
        rung = name if rungs == ["baseline"] else f"{rungs[-1]}+{name}"
        variants[rung] = options
        rungs.append(rung)
    variants["calibrated"] = ["--recipe=calibrated"]  # the last rung + gradient clipping (10)
    variants["default"] = []
    steps = [("calibrated", rungs[-1])]
    steps += [(later, earlier) for earlier, later in zip(rungs[1:-1], rungs[2:], strict=True)]
    return Study(
        name="calibration_ladder",
        description=(
            "Seed 000's ingredients added one at a time from its baseline "
            "(--recipe=baseline: no gradient clipping, entropy bonus or value normalisation) "
            "up to the full calibrated recipe (the last rung adds gradient clipping and equals "
            "--recipe=calibrated), with the library default as a second reference."
        ),
        reference="baseline",
        variants=variants,
        comparisons=(*steps, ("calibrated", "default")),
    )


def _whitening_scales(backbone: str, algo: str) -> Study:
    variants: dict[str, list[str]] = {
        "none": ["--env.preset=hard", "--whitening=none"],
        "batch": ["--env.preset=hard", "--whitening=batch"],
        "type": ["--env.preset=hard", "--whitening=type"],
        "ti_a0.5": [
            "--env.preset=hard",
            "--whitening=team_individual",
            "--alpha=0.5",
            "--whiten-inner=type",
        ],
        "ti_a0.25": [
            "--env.preset=hard",
            "--whitening=team_individual",
            "--alpha=0.25",
            "--whiten-inner=type",
        ],
    }
    description = (
        "Whitening schemes on a task where the rescuers' individual and penalty rewards are "
        "scaled (--env.rescuer_reward_scale=10 or 100 in --common): batch vs per type vs "
        "team_individual at alpha 0.5 and 0.25 (grouped per type) vs none, hard preset."
    )
    if algo == "grpo":
        _drop_grpo_no_second_stage(variants)
        description += (
            " With GRPO the schemes are a second stage on its group-relative advantage: "
            "ti_a0.5 would be 'none' (no second stage, alpha 0.5) and is left out."
        )
    return Study(
        name="whitening_scales", description=description, reference="batch", variants=variants
    )


def _whitening_shared(backbone: str, algo: str) -> Study:
    """Issue 47, item 3: the whitening_scales schemes under one actor shared by every agent
    of every type (``--share-actor all``), where a type's advantage scale reaches every
    shared parameter; with GRPO also Dr. GRPO (no std in the first stage, so the scale
    reaches the second), batch and per type."""
    study = _whitening_scales(backbone, algo)
    variants = {name: [*args, "--share-actor=all"] for name, args in study.variants.items()}
    comparisons: tuple[tuple[str, str], ...] = ()
    description = (
        "Whitening schemes under one actor shared by every agent of every type "
        "(--share-actor all), hard preset, the rescuers' rewards scaled in --common "
        "(--env.rescuer_reward_scale=1, 10 or 100): batch (reference) vs none, type and "
        "team_individual at alpha 0.5 and 0.25 (grouped per type)."
    )
    if algo == "grpo":
        for scheme in ("batch", "type"):
            variants[f"drgrpo_{scheme}"] = [
                "--env.preset=hard",
                f"--whitening={scheme}",
                "--grpo-scale-std=false",
                "--share-actor=all",
            ]
        comparisons = (("drgrpo_type", "drgrpo_batch"),)
        description += (
            " GRPO: ti_a0.5 would be 'none' and is left out; Dr. GRPO (--grpo-scale-std "
            "false) with batch and with per-type second stages, drgrpo_type vs drgrpo_batch "
            "pre-registered beside each variant vs batch."
        )
    return Study(
        name="whitening_shared",
        description=description,
        reference="batch",
        variants=variants,
        comparisons=comparisons,
    )


def _sharing(backbone: str, algo: str) -> Study:
    """Issue 47, item 3: what sharing one actor across the types costs or gains, batch
    whitening (``--share-actor none`` is ``type``: one configuration, one arm)."""
    return Study(
        name="sharing",
        description=(
            "One actor for every agent of every type (--share-actor all) vs one actor per "
            "type (--share-actor type, the default 'none' is the same configuration), batch "
            "whitening, hard preset."
        ),
        reference="type",
        variants={
            "type": ["--env.preset=hard", "--whitening=batch", "--share-actor=type"],
            "all": ["--env.preset=hard", "--whitening=batch", "--share-actor=all"],
        },
    )


#: memory_horizon's horizons H (issue 48: at least 64, 256, 1024, 4096)
MEMORY_HORIZONS = (64, 256, 1024, 4096)


def memory_horizon_settings(horizon: int) -> list[str]:
    """The training settings every arm of a memory_horizon part shares at horizon ``H``:
    ``multisearch_recall_v1`` with one agent (``rescuer_0``, the one that answers), 64 envs,
    rollouts and windows of whole episodes (``k (H + 1)`` steps, about 256 and at least one
    episode: every episode lies in one window, so the answer's gradient reaches the cue; all
    envs reset together, the episodes having one length), 8 epochs of 16 minibatches (the
    pilot's recipe: a gru learned H = 16 and, chrono-initialised, H = 64 with it and not with
    4 x 4; BENCHMARKS.md)."""
    window = max(1, round(256 / (horizon + 1))) * (horizon + 1)
    return [
        "--env-fn=envs.multisearch_recall_v1:vector_env",
        f"--env.memory_horizon={horizon}",
        "--env.n_scouts=0",
        "--env.n_rescuers=1",
        "--num-envs=64",
        f"--rollout-steps={window}",
        f"--seq-len={window}",
        "--burn-in=0",
        "--epochs=8",
        "--num-minibatches=16",
        "--penalty-channel=none",
    ]


def _memory_horizon(horizon: int, backbone: str, algo: str) -> Study:
    """Issue 48, item 3: which backbone remembers over H steps (``multisearch_recall_v1``),
    every setting but the backbone equal (:func:`memory_horizon_settings`); the gru arm is
    chrono-initialised for timescales up to 2H (``--chrono-init``: without it no gru learned
    H = 64 in the pilots)."""
    settings = memory_horizon_settings(horizon)
    extra = {"gru": [f"--chrono-init={2 * horizon}"]}
    return Study(
        name=f"memory_horizon_{horizon}",
        description=(
            f"mlp, gru (chrono init up to {2 * horizon} steps), mamba, mamba2 on "
            f"multisearch_recall_v1 at memory horizon H = {horizon}, every other setting "
            "equal: gru vs mlp (does the task need memory at this H), mamba vs gru and "
            "mamba2 vs gru (does Mamba remember better)."
        ),
        reference="gru",
        variants={
            kind: [f"--backbone={kind}", *settings, *extra.get(kind, [])]
            for kind in ("mlp", "gru", "mamba", "mamba2")
        },
    )


#: whitening_position's horizon and chunk size (issue 47, item 4)
POSITION_HORIZON = 64
POSITION_CHUNK = 16


def whitening_position_settings() -> list[str]:
    """The settings every arm of ``whitening_position`` shares: memory_horizon's recipe at
    H = 64 (:func:`memory_horizon_settings`: whole-episode windows of 260 steps, 8 x 16
    minibatches) with two agents of two types (``scout_0``, who only ever stays, and
    ``rescuer_0``, who answers), one actor shared by both (``--share-actor all``), and the
    gru chrono-initialised up to 2H (the recipe that learned H = 64 in the pilots)."""
    agents = {"--env.n_scouts=0": "--env.n_scouts=1"}
    settings = [agents.get(arg, arg) for arg in memory_horizon_settings(POSITION_HORIZON)]
    return [
        *settings,
        "--backbone=gru",
        f"--chrono-init={2 * POSITION_HORIZON}",
        "--share-actor=all",
    ]


def _whitening_position(backbone: str, algo: str) -> Study:
    """Issue 47, item 4: per-position and chunked statistics under one shared actor, on a
    task whose advantages differ in scale by position (``multisearch_recall_v1`` at H = 64:
    the only reward comes at the answer, so GAE's advantages shrink by ``gamma * lambda``
    per step back from it)."""
    settings = whitening_position_settings()
    return Study(
        name="whitening_position",
        description=(
            f"Per-position and chunked (chunks of {POSITION_CHUNK} positions) advantage "
            "statistics vs batch, under one actor shared by a scout and a rescuer, on "
            f"multisearch_recall_v1 at memory horizon H = {POSITION_HORIZON} (gru, chrono "
            "init, whole-episode windows)."
        ),
        reference="batch",
        variants={
            "batch": [*settings, "--whitening=batch"],
            "position": [*settings, "--whitening=position"],
            "chunk": [*settings, "--whitening=chunk", f"--chunk-size={POSITION_CHUNK}"],
        },
    )


STUDIES = {
    "whitening": _whitening,
    "calibration": _calibration,
    "memory": _memory,
    "grouping": _grouping,
    "memory_factorial": _memory_factorial,
    "calibration_ladder": _calibration_ladder,
    "whitening_scales": _whitening_scales,
    "whitening_shared": _whitening_shared,
    "sharing": _sharing,
    "whitening_position": _whitening_position,
    **{f"memory_horizon_{h}": functools.partial(_memory_horizon, h) for h in MEMORY_HORIZONS},
}


def get_study(name: str, *, backbone: str = "mlp", algo: str = "mappo") -> Study:
    """The study ``name`` for runs with ``backbone`` and ``algo`` (from config/common args).

    Raises ValueError for an unknown study name, listing the known ones.
    """
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; known studies: {', '.join(STUDIES)}")
    if algo not in ("mappo", "grpo"):
        raise ValueError(f"unknown algo {algo!r}; allowed: mappo, grpo")
    return STUDIES[name](backbone, algo)
