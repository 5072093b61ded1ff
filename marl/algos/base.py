"""What every algorithm shares: the configuration base class and the Algorithm interface.

Each algorithm is a class (``MAPPO``, ``GRPO``) with its own configuration dataclass derived
from :class:`BaseConfig` (as BenchMARL pairs each algorithm with its config). A field that an
algorithm's config class does not declare does not apply to that algorithm: that is the one
rule, stated by the classes themselves (:func:`marl.run.config.parse_cli` turns it into the
error "--value-epochs does not apply to --algo grpo").

Rules *between* options of one algorithm (``--alpha`` applies only with
``--whitening team_individual``, ...) are :meth:`BaseConfig.option_rules`. Settings that are
allowed but train exactly as another setting (GRPO's ``--whitening none`` is its
``team_individual``) are each config class's :attr:`BaseConfig.no_ops` table (:class:`NoOp`
entries), and the fields that change no result are :attr:`BaseConfig.result_free`;
:func:`marl.run.config.effective_config` applies both.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from marl.core.advantages import Schedule, constant, linear_decay
from marl.core.whitening import GROUPING_SCHEMES, SCHEMES, AdvantageWhitener
from marl.models.policies import SHARE_ACTOR, AgentLayout, MultiAgentPolicy
from seqmodels.backbones import TRAINER_DEFAULTS, backbone_spec

__all__ = [
    "ALGORITHMS",
    "ConfigError",
    "BaseConfig",
    "NoOp",
    "Algorithm",
    "register_algorithm",
    "resolve_algorithm",
    "config_field",
    "whitener_from_config",
    "penalty_schedule",
    "DEMO_MAX_TIME",
]

#: Wall-clock budget used when neither --total-steps nor --max-time is given (the demo).
DEMO_MAX_TIME = 180.0

#: The built-in backbones (seqmodels.backbones holds them and any registered later).
BACKBONES = ("mlp", "gru", "mamba", "mamba2")
ACTIVATIONS = ("tanh", "relu")
PENALTY_CHANNELS = ("individual", "none")


def backbone_default(backbone: str, key: str) -> Any:
    """The trainer setting ``key`` (rollout_steps, seq_len, burn_in, penalty_channel) that
    ``backbone`` wants when left unset; the feed-forward value for an unknown backbone (its
    config is refused by :meth:`BaseConfig.validate`)."""
    try:
        return backbone_spec(backbone).default(key)
    except ValueError:
        return TRAINER_DEFAULTS[key]


#: The penalty channel of each backbone when ``penalty_channel`` is None (the long-episode
#: default of mamba / mamba2: dropped; see the field's help).
PENALTY_CHANNEL_DEFAULTS = {name: backbone_default(name, "penalty_channel") for name in BACKBONES}

PENALTY_SCHEDULES = ("none", "constant", "linear")
LR_SCHEDULES = ("constant", "linear")
DEVICES = ("cpu", "cuda", "auto")
RECIPE_NAMES = ("default", "baseline", "calibrated")


class ConfigError(ValueError):
    """An unknown option or an invalid value in the training configuration."""


def config_field(default: Any, help: str, **metadata: Any) -> Any:  # noqa: A002 - argparse's
    """A dataclass field carrying its CLI help text (and ``choices``) in its metadata."""
    if isinstance(default, dict | list):
        return field(
            default_factory=lambda d=default: type(d)(d), metadata={"help": help, **metadata}
        )
    return field(default=default, metadata={"help": help, **metadata})


_f = config_field


def _check(cond: bool, name: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ConfigError(
            f"--{name.replace('_', '-')}: invalid value {value!r}; allowed: {allowed}"
        )


@dataclass(frozen=True)
class NoOp:
    """Under one algorithm, ``option`` at any of ``values`` trains exactly as at ``same_as``.

    ``values=None``: any value; ``equal_to="other"``: the value equal to option ``other``'s
    (an entropy coefficient annealed to itself is constant). ``when``: ``(option, allowed
    values)`` pairs that must all hold for the rule to apply. ``why``: the reason, in the
    code's terms, for messages. Each entry is verified by a test that trains both forms and
    gets bit-identical parameters (tests/test_no_ops.py).
    """

    option: str
    same_as: Any
    values: tuple[Any, ...] | None = None
    equal_to: str | None = None
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    why: str = ""

    def applies(self, cfg: Any) -> bool:
        """Whether ``cfg`` (a config, or any object with its fields) sets ``option`` to a value
        this rule maps to ``same_as`` (and is not at ``same_as`` already)."""
        value = getattr(cfg, self.option)
        if value == self.same_as:
            return False
        if self.equal_to is not None:
            hit = value == getattr(cfg, self.equal_to)
        else:
            hit = self.values is None or value in self.values
        return hit and all(getattr(cfg, name) in allowed for name, allowed in self.when)

    def describe(self, value: Any) -> str:
        """``--whitening none trains as --whitening team_individual (why)``."""
        flag = "--" + self.option.replace("_", "-")
        same = "none" if self.same_as is None else self.same_as
        return f"{flag} {value} trains as {flag} {same} ({self.why})"


@dataclass
class BaseConfig:
    """Fields shared by every algorithm; each field is also a ``--field-name`` flag.

    ``BaseConfig(algo=NAME, **fields)`` builds the config of the algorithm whose config class
    has ``algo_name == NAME`` (default mappo); a field that class does not declare raises
    :class:`ConfigError` (``--value-clip does not apply to --algo grpo``).
    """

    #: the algorithm's registry name (set by each subclass)
    algo_name: ClassVar[str] = ""

    #: Settings that train exactly as another setting (:class:`NoOp`); a subclass extends
    #: the tuple with its algorithm's own. Applied in order, repeatedly, by
    #: :func:`marl.run.config.effective_config`.
    no_ops: ClassVar[tuple[NoOp, ...]] = (
        NoOp(
            "ent_coef_final",
            None,
            equal_to="ent_coef",
            why="the entropy coefficient annealed from --ent-coef to the same value is constant "
            "(marl.core.losses.linear_schedule)",
        ),
        NoOp(
            "penalty_channel",
            "individual",
            values=("none",),
            when=(("penalty_beta_schedule", ("constant", "linear")),),
            why="with penalty shaping the penalty enters once, through the shaping term, and "
            "is never added to a channel",
        ),
    )

    #: Fields that change no result: where and what a run writes or shows, and whether the
    #: independent parts of an update run in threads (bit-identical either way:
    #: tests/test_mappo.py, tests/test_grpo.py).
    result_free: ClassVar[frozenset[str]] = frozenset(
        {"run_dir", "progress", "plots", "gif", "baselines", "checkpoint_every", "parallel_update"}
    )

    def __new__(cls, *args: Any, **kwargs: Any) -> BaseConfig:
        if cls is BaseConfig:
            cls = BaseConfig.for_algo(kwargs.get("algo", "mappo"))
        own = set(cls.field_names())
        for name in kwargs:
            if name not in own:
                configs = {n: a.config_class for n, a in ALGORITHMS.items()}
                owners = [n for n, c in configs.items() if name in c.field_names()]
                if not owners:
                    known = sorted({f for c in configs.values() for f in c.field_names()})
                    raise ConfigError(
                        f"unknown config key {name!r}; known keys: {', '.join(known)}"
                    )
                raise ConfigError(
                    f"--{name.replace('_', '-')} does not apply to --algo {cls.algo_name}: it "
                    f"is an option of --algo {' / '.join(owners)} only; remove it or change "
                    "--algo"
                )
        return super().__new__(cls)

    @staticmethod
    def for_algo(algo: str) -> type[BaseConfig]:
        """The config class of algorithm ``algo``: ``resolve_algorithm(algo).config_class``
        (the one way a config class is picked, from the algorithm registry)."""
        return resolve_algorithm(algo).config_class

    # ---- run -------------------------------------------------------------------------------
    algo: str = _f("mappo", "Algorithm.")
    recipe: str = _f(
        "default",
        "Preset of objective settings: 'calibrated' = value clip 0.1, 4 value epochs, batch "
        "whitening then clip 5.0, entropy 0.01, optimism offset 0.5; 'baseline' = plain batch "
        "whitening only (no value clip/norm, no entropy, no grad clip); 'default' = the fields' "
        "defaults. An algorithm takes the parts that apply to it; explicit flags/YAML keys "
        "override recipe values.",
        choices=RECIPE_NAMES,
    )
    seed: int = _f(0, "Base seed for torch, numpy and the environments.")
    total_steps: int | None = _f(
        None,
        "Environment steps to train (summed over the vector envs: one step of E envs counts E). "
        f"None: until --max-time / --max-cpu-time (when all three are None: "
        f"max_time={DEMO_MAX_TIME:g}s, the demo).",
    )
    max_time: float | None = _f(
        None, "Wall-clock training budget in seconds (then evaluate as at a normal end)."
    )
    max_cpu_time: float | None = _f(
        None,
        "CPU-time training budget in seconds: this process's user + system time (all its "
        "threads; rank 0's under torchrun; env worker processes not counted). Unlike --max-time "
        "it does not stretch when other jobs share the cores, so it is the fair 'equal time' "
        "budget for studies on a shared machine (with --torch-threads 1 it equals the wall "
        "clock of an idle core). When several budgets are set, the first one reached ends the run.",
    )
    run_dir: str | None = _f(None, "Run directory (default runs/<algo>-<backbone>-<timestamp>).")
    device: str = _f(
        "cpu", "Torch device for the update ('auto': cuda when available).", choices=DEVICES
    )
    torch_threads: int = _f(
        1,
        "torch intra-op threads (0: min(2, cpu count)). 1 is fastest for these small networks "
        "and robust on shared machines (more threads spin and contend).",
    )
    progress: bool = _f(True, "Show a tqdm progress bar with key figures.")
    numba_threading_layer: str = _f(
        "auto",
        "numba's threading layer for this process (seqmodels' mamba kernels, whitening): "
        "'auto' picks 'omp' when numba's pool has one thread (the trainer sizes it to "
        "--torch-threads: each kernel then runs in the calling thread, faster than on "
        "'workqueue') and 'workqueue' otherwise (idle workers sleep, where 'omp's busy-wait "
        "and slow Mamba.step down); 'omp' is "
        "thread-safe; 'tbb' needs the tbb package; 'default' leaves numba's own choice. Set "
        "once per process, before the first kernel runs.",
        choices=("auto", "workqueue", "omp", "tbb", "default"),
    )
    malloc_tuning: bool = _f(
        True,
        "Fix glibc's allocator thresholds for this process (seqmodels.kernels."
        "set_malloc_thresholds: tensors up to 32 MiB from the heap, up to 512 MiB of freed "
        "memory kept) so that each update does not page-fault its large tensors in afresh; "
        "false: glibc's own adaptive thresholds. No effect off glibc (macOS, musl).",
    )
    # ---- environment -----------------------------------------------------------------------
    env_fn: str = _f(
        "envs.multisearch_v0:vector_env",
        "'module:factory': a native vector-env factory fn(num_envs, autoreset, **env) "
        "(docs/CONTRACTS.md section 1), or a factory returning a PettingZoo ParallelEnv or a "
        "Gymnasium Env (e.g. gymnasium:make with --env.id CartPole-v1), batched by "
        "marl.adapters; adapter options as --env.adapter_* (team_reward, reward_channels, "
        "types, state, max_cycles, workers). Envs without reward_team/individual/penalty "
        "infos: team = mean of the live agents' rewards, individual = own reward, penalty 0; "
        "team_individual whitening then mixes the two whitened advantages by alpha (the same "
        "advantage twice for one agent or a shared reward), every other scheme whitens their "
        "sum within its groups; adapter_team_reward none leaves the individual advantage "
        "alone.",
    )
    env: dict = _f(
        {}, "Environment keyword arguments (YAML 'env:' mapping; CLI '--env.KEY VALUE')."
    )
    num_envs: int = _f(64, "Number of vectorised environments E.")
    # ---- model -----------------------------------------------------------------------------
    backbone: str = _f(
        "mlp",
        "Actor backbone: mlp, gru, mamba, mamba2, a registered one (seqmodels.backbones), or "
        "package.module:NAME for a BackboneSpec in your own module.",
    )
    hidden_dim: int = _f(64, "Actor backbone width.")
    chrono_init: int | None = _f(
        None,
        "gru backbones: chrono initialisation of the update gate for timescales up to T steps "
        "(Tallec & Ollivier 2018: each unit's gate bias log U[1, T - 1], so it keeps its state "
        "for up to about T steps at the start of training; torch's default forgets within a "
        "few). Memory over long spans (multisearch_recall_v1 at H = 64) was learned with it "
        "and not without (BENCHMARKS.md). None: torch's initialisation. Other backbones "
        "refuse it.",
    )
    share_actor: str = _f(
        "none",
        "Actor parameter sharing. none and type (one configuration): each agent type its own "
        "actor, shared by the type's agents. all: one actor for every agent of every type: "
        "observations zero-padded at the end to the largest type's size, one head over the "
        "largest action count whose outputs beyond a type's own actions that type never sees "
        "(action i of the head is action i of each type that has it). With --seeds, export "
        "and load_policy alike; the types' losses then run in turn (no --parallel-update "
        "threads for the actor).",
        choices=SHARE_ACTOR,
    )
    agent_ids: bool = _f(
        True,
        "Append identity one-hots to each agent's observation: per-type actors the agent's "
        "index within its type (n_k inputs); --share-actor all the type's one-hot (K "
        "inputs), then the agent's over all N agents in possible_agents order. false: the "
        "observation alone (agents of a type then act alike on equal observations).",
    )
    activation: str = _f(
        "relu",
        "Hidden activation of the mlp/gru actor backbones and of the centralised critic's MLP "
        "(the mamba/mamba2 blocks keep their own SiLU).",
        choices=ACTIVATIONS,
    )
    # ---- policy optimisation ---------------------------------------------------------------
    lr: float = _f(1e-3, "Actor learning rate (Adam).")
    lr_schedule: str = _f("constant", "Learning-rate schedule.", choices=LR_SCHEDULES)
    epochs: int = _f(4, "Policy epochs per update.")
    num_minibatches: int = _f(4, "Minibatches per epoch.")
    clip_low: float = _f(0.2, "Ratio clip below 1: ratio >= 1 - clip_low.")
    clip_high: float = _f(0.2, "Ratio clip above 1: ratio <= 1 + clip_high (clip-higher).")
    dual_clip: float | None = _f(
        None, "Dual-clip constant c > 1 bounding the loss for negative advantages (None: off)."
    )
    ent_coef: float = _f(0.01, "Entropy bonus coefficient.")
    ent_coef_final: float | None = _f(
        None, "Entropy coefficient at the end, annealed linearly (None: constant)."
    )
    optimism_offset: float | None = _f(
        None,
        "Learnable optimism offset b, initial value (A' = A + b, b trained to minimise "
        "mean(A')^2; None: off).",
    )
    max_grad_norm: float | None = _f(10.0, "Gradient-norm clip (None: off).")
    parallel_update: bool = _f(
        True,
        "Run the independent parts of an update in threads on separate cores: MAPPO runs the "
        "critic's value epochs alongside the policy epochs and, for recurrent actors, each "
        "agent type's actor forward/backward side by side; GRPO (no critic) the agent types "
        "side by side for every backbone. Mamba / Mamba2 actors join in only on a thread-safe "
        "numba layer (omp or tbb: the one-thread default; not workqueue). Identical "
        "results either way (the parts are combined in a fixed order; the critic's minibatch "
        "order is drawn before the policy's). Distributed runs keep the parts in order, so "
        "that collectives match.",
    )
    # ---- advantages and whitening ----------------------------------------------------------
    whitening: str = _f(
        "team_individual",
        "Advantage whitening scheme (marl.whitening). With --algo grpo it is a second stage on "
        "GRPO's advantage, which is itself group-relative (returns normalised within group x "
        "agent type, mixed by --alpha): there 'team_individual' and 'none' both mean no second "
        "stage and train identically.",
        choices=SCHEMES,
    )
    alpha: float = _f(0.5, "Team weight when mixing whitened team and individual advantages.")
    whiten_inner: str = _f(
        "type", "Grouping inside team_individual whitening.", choices=GROUPING_SCHEMES
    )
    chunk_size: int = _f(64, "Chunk size for the 'chunk' scheme (positions per chunk).")
    running_momentum: float = _f(0.99, "EMA momentum for 'running_ema'.")
    adv_clip: float | None = _f(None, "Symmetric clip of whitened advantages (None: off).")
    penalty_channel: str | None = _f(
        None,
        "Where the penalty reward goes when penalty shaping is off: added to the individual "
        "channel or dropped ('none'). None: the backbone's default (mamba/mamba2 none, "
        "mlp/gru individual), resolved when the config is built and saved so in config.yaml. "
        "mamba/mamba2 drop it (long-episode default): on the memory preset the revisit cost "
        "made standing still the safest action, and policies collapsed onto it "
        "(BENCHMARKS.md, sequence backbones).",
        choices=PENALTY_CHANNELS,
    )
    penalty_beta_schedule: str = _f(
        "none",
        "Penalty shaping (seed 003, docs/seeds.md): A - beta(t) * normalised penalty "
        "advantage ('none': off).",
        choices=PENALTY_SCHEDULES,
    )
    penalty_beta: float = _f(0.5, "Penalty shaping beta (initial value for 'linear').")
    penalty_beta_floor: float = _f(0.1, "Floor of the linear penalty beta schedule.")
    # ---- evaluation, checkpoints, artifacts ------------------------------------------------
    eval_every: int = _f(20, "Evaluate on the validation seeds every N updates (0: end only).")
    eval_episodes: int = _f(32, "Validation episodes (one per validation seed).")
    final_eval_episodes: int | None = _f(
        None,
        "Validation episodes of the final evaluation (eval.json, seeds eval_seed .. "
        "+final_eval_episodes-1; None: eval_episodes). marl.compare sets 128: a study's "
        "primary endpoint.",
    )
    eval_seed: int = _f(10_000, "First validation seed (seeds eval_seed .. +eval_episodes-1).")
    eval_repeats: int = _f(
        2,
        "Episodes per validation seed. The figures (success_rate, ...) are those of the first "
        "episode of each seed; with 2 or more, eval.json and metrics.jsonl also carry "
        "search_diversity: the mean pairwise Jaccard distance between the team's visited-cell "
        "sets of episodes from the same seed (0: every episode searched the same cells).",
    )
    eval_deterministic: bool = _f(False, "Greedy actions in evaluation (False: sample).")
    checkpoint_every: int = _f(10, "Write checkpoints/latest.pt every N updates.")
    plots: bool = _f(True, "Write PNG plots at the end.")
    gif: bool = _f(True, "Write episode.gif of one evaluation episode at the end.")
    baselines: bool = _f(
        True, "At the end, print the heuristic and random baselines next to the trained policy."
    )

    # ---- derived ---------------------------------------------------------------------------
    def __post_init__(self) -> None:
        """Resolve per-backbone defaults of fields left None (the backbone's
        ``penalty_channel`` in :mod:`seqmodels.backbones`)."""
        if self.penalty_channel is None:
            self.penalty_channel = backbone_default(self.backbone, "penalty_channel")

    @property
    def is_recurrent(self) -> bool:
        """Whether the actor backbone carries state (the registry's ``recurrent``)."""
        return backbone_spec(self.backbone).recurrent

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def default_of(cls, name: str) -> Any:
        f = {f.name: f for f in dataclasses.fields(cls)}[name]
        return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]

    def option_rules(self) -> list[tuple[str, bool, str]]:
        """``(field, applies, when it applies)`` for options that apply only with certain
        values of others: setting one that does not apply is an error, never ignored."""
        scheme = self.whitening
        grouped = ("team_individual", "running", "running_ema")
        return [
            ("alpha", scheme == "team_individual", "--whitening team_individual"),
            (
                "whiten_inner",
                scheme in grouped,
                "--whitening team_individual, running or running_ema (their inner grouping)",
            ),
            (
                "chunk_size",
                scheme == "chunk" or (scheme in grouped and self.whiten_inner == "chunk"),
                "--whitening chunk, or team_individual/running/running_ema with "
                "--whiten-inner chunk",
            ),
            ("running_momentum", scheme == "running_ema", "--whitening running_ema"),
            (
                "penalty_beta",
                self.penalty_beta_schedule != "none",
                "--penalty-beta-schedule constant or linear",
            ),
            (
                "penalty_beta_floor",
                self.penalty_beta_schedule == "linear",
                "--penalty-beta-schedule linear",
            ),
        ]

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid value and what is allowed."""
        try:
            backbone_spec(self.backbone)
        except ValueError as exc:
            raise ConfigError(f"--backbone: {exc}") from None
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices is not None:
                value = getattr(self, f.name)
                _check(value in choices, f.name, value, ", ".join(choices))
        pos_int = "an integer >= 1"
        for name in (
            "num_envs",
            "hidden_dim",
            "epochs",
            "num_minibatches",
            "chunk_size",
            "eval_episodes",
            "eval_repeats",
            "checkpoint_every",
        ):
            _check(getattr(self, name) >= 1, name, getattr(self, name), pos_int)
        if self.final_eval_episodes is not None:
            _check(
                self.final_eval_episodes >= 1,
                "final_eval_episodes",
                self.final_eval_episodes,
                pos_int + " or none",
            )
        for name in ("seed", "eval_seed", "eval_every", "torch_threads"):
            _check(getattr(self, name) >= 0, name, getattr(self, name), "an integer >= 0")
        if self.total_steps is not None:
            _check(self.total_steps >= 1, "total_steps", self.total_steps, pos_int + " or none")
        for name in ("max_time", "max_cpu_time"):
            value = getattr(self, name)
            if value is not None:
                _check(math.isfinite(value) and value > 0, name, value, "a number > 0 or none")
        _check(math.isfinite(self.lr) and self.lr > 0, "lr", self.lr, "a number > 0")
        _check(0.0 <= self.alpha <= 1.0, "alpha", self.alpha, "a number in [0, 1]")
        _check(0.0 < self.clip_low < 1.0, "clip_low", self.clip_low, "a number in (0, 1)")
        _check(self.clip_high > 0.0, "clip_high", self.clip_high, "a number > 0")
        if self.dual_clip is not None:
            _check(self.dual_clip > 1.0, "dual_clip", self.dual_clip, "a number > 1 or none")
        _check(self.ent_coef >= 0, "ent_coef", self.ent_coef, "a number >= 0")
        if self.ent_coef_final is not None:
            _check(self.ent_coef_final >= 0, "ent_coef_final", self.ent_coef_final, ">= 0 or none")
        for name in ("max_grad_norm", "adv_clip"):
            v = getattr(self, name)
            if v is not None:
                _check(v > 0, name, v, "a number > 0 or none")
        _check(
            0.0 < self.running_momentum < 1.0, "running_momentum", self.running_momentum, "(0, 1)"
        )
        if self.optimism_offset is not None:
            _check(
                math.isfinite(self.optimism_offset),
                "optimism_offset",
                self.optimism_offset,
                "a finite number or none",
            )
        _check(self.penalty_beta >= 0, "penalty_beta", self.penalty_beta, "a number >= 0")
        _check(self.penalty_beta_floor >= 0, "penalty_beta_floor", self.penalty_beta_floor, ">= 0")
        _check(":" in self.env_fn, "env_fn", self.env_fn, "'module:function'")
        if self.chrono_init is not None:
            _check(
                isinstance(self.chrono_init, int) and self.chrono_init >= 3,
                "chrono_init",
                self.chrono_init,
                "an integer >= 3 (the longest timescale, in steps) or none",
            )
            if self.backbone != "gru":
                raise ConfigError(
                    f"--chrono-init: initialises the gru backbone's update gate; --backbone "
                    f"{self.backbone} has none (use --backbone gru, or leave --chrono-init unset)"
                )
        for key in self.env:
            _check(
                isinstance(key, str) and key.isidentifier(), "env", key, "keyword-argument names"
            )

    def check_option_rules(self, explicit: frozenset[str] | set[str] = frozenset()) -> None:
        """Reject options that :meth:`option_rules` says do not apply. A field counts as set
        when named in ``explicit`` (given on the command line, even at its default) or when its
        value differs from the default."""
        for name, applies, when in self.option_rules():
            if applies:
                continue
            if name in explicit or getattr(self, name) != self.default_of(name):
                current = {
                    "penalty_beta": f"--penalty-beta-schedule {self.penalty_beta_schedule}",
                    "penalty_beta_floor": f"--penalty-beta-schedule {self.penalty_beta_schedule}",
                    "value_norm_beta": f"--value-norm {getattr(self, 'value_norm', None)}",
                }.get(name, f"--whitening {self.whitening}")
                raise ConfigError(
                    f"--{name.replace('_', '-')}: has no effect with {current}; it applies only "
                    f"with {when} (remove it or change that option)"
                )


def whitener_from_config(
    cfg: BaseConfig, *, num_groups: int, distributed: bool, scheme: str | None = None
) -> AdvantageWhitener:
    """The advantage whitener the config asks for (``scheme`` overrides ``cfg.whitening``):
    one place maps the whitening fields to :class:`marl.whitening.AdvantageWhitener`."""
    return AdvantageWhitener(
        cfg.whitening if scheme is None else scheme,
        alpha=cfg.alpha,
        inner=cfg.whiten_inner,
        chunk_size=cfg.chunk_size,
        clip_range=cfg.adv_clip,
        momentum=cfg.running_momentum,
        num_groups=num_groups,
        distributed=distributed,
    )


def penalty_schedule(cfg: BaseConfig) -> Schedule | None:
    """The penalty-shaping coefficient ``beta(progress)`` the config asks for (None: off)."""
    if cfg.penalty_beta_schedule == "constant":
        return constant(cfg.penalty_beta)
    if cfg.penalty_beta_schedule == "linear":
        return linear_decay(cfg.penalty_beta, cfg.penalty_beta_floor, 1.0)
    return None


class Algorithm(abc.ABC):
    """The interface :func:`marl.run.train.train` drives.

    An algorithm is built as ``cls(cfg, ctx, device)`` (``ctx``: a
    :class:`marl.run.distributed.DistContext` or None) and exposes its ``policy`` and the
    env's ``layout``.
    """

    #: registry name (``--algo``)
    name: ClassVar[str]
    #: its configuration class
    config_class: ClassVar[type[BaseConfig]]

    policy: MultiAgentPolicy
    layout: AgentLayout

    @classmethod
    def batch_class(cls) -> type | None:
        """The trainer of S runs of this algorithm at once (``--seeds``; a
        :class:`marl.algos.seeds.SeedBatch`), or None: it trains one run at a time."""
        return None

    @abc.abstractmethod
    def iteration(self, progress: float) -> dict[str, float]:
        """One collect + update at training progress ``progress`` in [0, 1]; returns the
        update's metrics, including ``env_steps_delta`` (this rank's env steps)."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Models, optimisers, statistics and the env state: enough to resume exactly."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    #: per agent type, (raw, final) advantages of the last update as flat numpy arrays (for
    #: the histogram plot); empty before the first update
    last_advantages: dict[str, tuple[Any, Any]]


# ------------------------------------------------------------------------------------------
# the algorithm registry
# ------------------------------------------------------------------------------------------

#: ``--algo`` name -> algorithm class (MAPPO and GRPO are registered by :mod:`marl.algos`).
ALGORITHMS: dict[str, type[Algorithm]] = {}


def register_algorithm(cls: Any, name: str | None = None) -> type[Algorithm]:
    """Make ``cls`` (an :class:`Algorithm` with a ``config_class``) available as ``--algo NAME``
    to ``python -m marl.train``, ``marl.evaluate``, ``marl.load_policy`` and ``marl.compare``.

    ``NAME`` is ``name``, else ``cls.name``. Returns ``cls``, so it also works as a class
    decorator. (``register_algorithm("name", cls)`` is accepted too.) A later registration
    under the same name replaces the earlier one.
    """
    if isinstance(cls, str):  # register_algorithm("name", cls)
        cls, name = name, cls
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"register_algorithm: expected an Algorithm subclass, got {cls!r}")
    name = name or getattr(cls, "name", "")
    if not name:
        raise TypeError(
            f"register_algorithm({cls.__name__}): give a name, or set the class attribute "
            "`name` (the --algo value)"
        )
    ALGORITHMS[name] = cls
    return cls


def resolve_algorithm(spec: str) -> type[Algorithm]:
    """The algorithm ``--algo spec`` names: a registered name (:data:`ALGORITHMS`), or
    ``package.module:Class`` for one defined outside the package (the module is imported and
    the class registered under ``spec``, so that config.yaml's ``algo: package.module:Class``
    finds it again in a new process). Raises ConfigError with the allowed values."""
    if spec in ALGORITHMS:
        return ALGORITHMS[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise ConfigError(
            f"--algo: invalid value {spec!r}; allowed: {', '.join(ALGORITHMS)}, or "
            "package.module:Class for an algorithm defined in your own module"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--algo {spec!r}: cannot import {module_name!r} ({exc})") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(
            f"--algo {spec!r}: {module_name} has no Algorithm subclass named {attr!r}"
        )
    ALGORITHMS[spec] = cls
    return cls
