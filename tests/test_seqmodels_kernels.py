"""seqmodels.kernels: every fused op has a readable twin with its signature and equals it;
numba's runtime settings are left to the caller (set_numba_threading_layer); private torch
APIs appear only under seqmodels/kernels/.

(The scans, the conv + SiLU, the gated RMSNorm and the gated inner part are compared with
their twins, gradients included, in tests/test_seqmodels.py; this file adds the step ops, the
whole Mamba block, the two branches of the masked conv and the MLP runner.)
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from seqmodels import Mamba, ops, scan
from seqmodels.backbones import make_backbone, run_sequential
from seqmodels.kernels import cuda_ops, malloc_tuning_available, numba_ops, set_malloc_thresholds
from seqmodels.kernels.allocator import MAX_MMAP_THRESHOLD
from seqmodels.kernels.numba_runtime import THREADING_LAYERS, set_numba_threading_layer

F64 = torch.float64
ROOT = Path(__file__).resolve().parents[1]

# (fused kernel op, its readable twin)
TWINS = [
    (numba_ops.selective_scan_numba, scan.selective_scan_reference),
    (numba_ops.ssd_scan_numba, scan.ssd_scan_reference),
    (numba_ops.selective_state_update_numba, scan.selective_state_update_reference),
    (numba_ops.selective_state_update_gated_numba, scan.selective_state_update_gated_reference),
    (numba_ops.ssd_state_update_numba, scan.ssd_state_update_reference),
    (numba_ops.conv_silu_numba, ops.conv_silu_reference),
    (numba_ops.conv_step_silu_numba, ops.conv_step_silu_reference),
    (numba_ops.rmsnorm_gated_numba, ops.rmsnorm_gated_reference),
    (numba_ops.rmsnorm_numba, ops.rmsnorm_reference),
    (numba_ops.mamba_inner_numba, ops.mamba_inner_reference),
    (numba_ops.mamba_block_numba, ops.mamba_block_reference),
    (numba_ops.mamba_step_numba, ops.mamba_step_reference),
    (cuda_ops.selective_scan_cuda, scan.selective_scan_reference),
    (cuda_ops.ssd_scan_cuda, scan.ssd_scan_reference),
]


def _positional(fn) -> list[tuple[str, object]]:
    """(name, default) of the parameters that are not keyword-only (tuning knobs may be)."""
    return [
        (p.name, p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.kind is not inspect.Parameter.KEYWORD_ONLY
    ]


@pytest.mark.parametrize(("fused", "twin"), TWINS, ids=lambda f: f.__name__)
def test_every_fused_op_has_a_twin_with_its_signature(fused, twin):
    assert _positional(fused) == _positional(twin)


def test_every_public_kernel_op_is_listed():
    listed = {f.__name__ for f, _ in TWINS}
    public = {n for n in numba_ops.__all__ if n.islower()} | {
        n for n in cuda_ops.__all__ if n != "mamba_ssm_available"
    }
    assert public == listed


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=F64)


# ------------------------------------------------------------------------------------------
# single-step ops (no autograd: the rollout kernels)
# ------------------------------------------------------------------------------------------


def test_step_ops_match_their_twins():
    B, D, N, H, P, G, C, W = 5, 11, 4, 6, 3, 2, 9, 4
    h = _randn(B, D, N, seed=1)
    dt = torch.nn.functional.softplus(_randn(B, D, seed=2))
    x, z = _randn(B, D, seed=3), _randn(B, D, seed=4)
    A = -torch.rand(D, N, generator=_gen(5), dtype=F64) - 0.1
    Bm, Cm = _randn(B, N, seed=6), _randn(B, N, seed=7)
    Dv, dt_bias = _randn(D, seed=8), _randn(D, seed=9)
    cases = [
        (
            numba_ops.selective_state_update_numba,
            scan.selective_state_update_reference,
            (h, dt, x, A, Bm, Cm),
        ),
        (
            numba_ops.selective_state_update_gated_numba,
            scan.selective_state_update_gated_reference,
            (h, dt, x, z, A, Dv, Bm, Cm, dt_bias, True),
        ),
        (
            numba_ops.selective_state_update_gated_numba,
            scan.selective_state_update_gated_reference,
            (h, dt, x, z, A, Dv, Bm, Cm, None, False),
        ),
        (
            numba_ops.ssd_state_update_numba,
            scan.ssd_state_update_reference,
            (
                _randn(B, H, P, N, seed=10),
                dt[:, :H],
                _randn(B, H, P, seed=11),
                -torch.rand(H, generator=_gen(12), dtype=F64),
                _randn(B, G, N, seed=13),
                _randn(B, G, N, seed=14),
            ),
        ),
        (
            numba_ops.conv_step_silu_numba,
            ops.conv_step_silu_reference,
            (_randn(B, C, W, seed=15), _randn(B, C, seed=16), _randn(C, 1, W, seed=17), None),
        ),
        (
            numba_ops.conv_step_silu_numba,
            ops.conv_step_silu_reference,
            (
                _randn(B, C, W, seed=15),
                _randn(B, C, seed=16),
                _randn(C, 1, W, seed=17),
                _randn(C, seed=18),
            ),
        ),
    ]
    for fused, twin, args in cases:
        for got, want in zip(fused(*args), twin(*args), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=fused.__name__)


@pytest.mark.parametrize("conv_bias", [True, False])
@pytest.mark.parametrize("reset", [None, "some"])
def test_mamba_step_numba_matches_its_twin(conv_bias, reset):
    # d_inner = 11, d_state = 4, dt_rank = 3, d_conv = 4; rows 1 and 3 reset and carry NaN
    # states, which must not reach their outputs (replaced by zeros, not multiplied by 0)
    B, D, N, R, W = 5, 11, 4, 3, 4
    xz = _randn(B, 2 * D, seed=1)
    conv_state, ssm_state = _randn(B, D, W, seed=2), _randn(B, D, N, seed=3)
    flags = None
    if reset == "some":
        flags = torch.tensor([False, True, False, True, False])
        conv_state[flags], ssm_state[flags] = float("nan"), float("nan")
    conv = (_randn(D, 1, W, seed=4), _randn(D, seed=5) if conv_bias else None)
    x_proj_weight = _randn(R + 2 * N, D, seed=6)
    dt_proj = (_randn(D, R, seed=7) * 0.3, _randn(D, seed=8))
    A = -torch.rand(D, N, generator=_gen(9), dtype=F64) - 0.1
    Dv = _randn(D, seed=10)
    args = (xz, conv_state, ssm_state, flags, conv, x_proj_weight, dt_proj, A, Dv)
    before = [t.clone() for t in (conv_state, ssm_state)]
    got, want = numba_ops.mamba_step_numba(*args), ops.mamba_step_reference(*args)
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    for t, b in zip((conv_state, ssm_state), before, strict=True):  # inputs not modified
        torch.testing.assert_close(t, b, equal_nan=True, rtol=0, atol=0)


def _mamba_step_twin(m: Mamba, x, state, reset):
    """Mamba.step's readable composition: in_proj, ops.mamba_step_reference, out_proj."""
    y, conv, ssm = ops.mamba_step_reference(
        torch.nn.functional.linear(x, m.in_proj.weight, m.in_proj.bias), *state, reset,
        (m.conv1d.weight, m.conv1d.bias), m.x_proj.weight, (m.dt_proj.weight, m.dt_proj.bias),
        -torch.exp(m.A_log), m.D,
    )  # fmt: skip
    return torch.nn.functional.linear(y, m.out_proj.weight, m.out_proj.bias), (conv, ssm)


@pytest.mark.parametrize(("dtype", "tol"), [(F64, 1e-12), (torch.float32, 2e-5)])
def test_mamba_step_on_cached_views_matches_its_twin_across_resets(dtype, tol):
    # Mamba.step's rollout path (numba kernel on cached parameter views, A from A_log in the
    # kernel) against the readable composition, 12 steps with resets and NaN in reset rows
    torch.manual_seed(0)
    m = Mamba(16, d_state=4, backend="numba").to(dtype)
    with torch.no_grad():
        m.A_log.add_(0.3 * torch.randn_like(m.A_log))  # not the S4D init
        m.D.add_(torch.randn_like(m.D))
    B = 6
    state = m.initial_state(B)
    twin_state = state
    with torch.no_grad():
        for t in range(12):
            x = torch.randn(B, 16, dtype=dtype)
            reset = torch.rand(B) < 0.3 if t else None
            if reset is not None and reset.any():
                state = tuple(s.clone() for s in state)
                for s in state:
                    s[reset] = float("nan")
            y, state = m.step(x, state, reset)
            assert m._step_views_cache is not None  # the cached path ran
            y_twin, twin_state = _mamba_step_twin(m, x, twin_state, reset)
            torch.testing.assert_close(y, y_twin, rtol=tol, atol=tol)
            for got, want in zip(state, twin_state, strict=True):
                assert got.dtype == dtype
                torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_mamba_step_reads_parameters_updated_in_place_or_replaced():
    # the cached views follow an optimizer step (in place) and a replaced tensor (module.to,
    # .data = ...): each step uses the current weights
    torch.manual_seed(1)
    m = Mamba(16, d_state=4, backend="numba").double()
    B = 4
    x = torch.randn(B, 16, dtype=F64)
    state = m.initial_state(B)
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    for _ in range(3):
        with torch.no_grad():
            y, _ = m.step(x, state)
            torch.testing.assert_close(y, _mamba_step_twin(m, x, state, None)[0])
        out, _ = m(x[:, None], state)
        opt.zero_grad()
        out.square().sum().backward()
        opt.step()  # in place: every parameter moves
        with torch.no_grad():
            y_new, _ = m.step(x, state)
        assert not torch.allclose(y_new, y)
        torch.testing.assert_close(y_new, _mamba_step_twin(m, x, state, None)[0])
    with torch.no_grad():
        m.x_proj.weight.data = torch.randn_like(m.x_proj.weight)  # a new tensor
        m.A_log.data = m.A_log.data * 0.5
        y, _ = m.step(x, state)
        torch.testing.assert_close(y, _mamba_step_twin(m, x, state, None)[0])
        m.float()
        y32, _ = m.step(x.float(), m.initial_state(B))
        torch.testing.assert_close(y32.double(), y, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------
# the whole Mamba block, the masked conv's two branches, the MLP runner
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("windowed", "window_tokens", "bias"),
    [
        (False, None, True),  # the whole sequence at once (_NumbaMambaBlockFull)
        (False, None, False),
        (True, 10, True),  # windows of 5 steps
        (True, 2048, True),  # one window
        (True, 6, False),  # windows of 3 steps < d_conv
    ],
)
def test_mamba_block_numba_matches_its_twin(windowed, window_tokens, bias, monkeypatch):
    # both of mamba_block_numba's paths: forward outputs, both returned states and gradients
    # w.r.t. the input, both initial states and every parameter, against the readable twin
    monkeypatch.setattr(numba_ops, "MAMBA_WINDOWED_MIN_TOKENS", 0 if windowed else 10**9)
    if window_tokens is not None:
        monkeypatch.setattr(numba_ops, "MAMBA_BLOCK_TOKENS", window_tokens)
    torch.manual_seed(0)
    m = Mamba(d_model=6, d_state=3, dt_rank=2, bias=bias, conv_bias=bias, dtype=F64)
    B, L = 2, 19
    x = _randn(B, L, 6, seed=20).requires_grad_(True)
    conv0 = _randn(B, m.d_inner, m.d_conv, seed=21).requires_grad_(True)
    ssm0 = _randn(B, m.d_inner, m.d_state, seed=22).requires_grad_(True)
    resets = torch.rand(B, L, generator=_gen(23)) < 0.15
    leaves = [x, conv0, ssm0, *m.parameters()]

    def run(fn):
        A = -torch.exp(m.A_log.to(F64))  # (A_log and D are float32, as mamba-ssm's)
        outs = fn(
            x, conv0, ssm0, resets, (m.in_proj.weight, m.in_proj.bias),
            (m.conv1d.weight, m.conv1d.bias), m.x_proj.weight,
            (m.dt_proj.weight, m.dt_proj.bias), A, m.D.to(F64),
            (m.out_proj.weight, m.out_proj.bias),
        )  # fmt: skip
        weights = [torch.cos(torch.arange(o.numel(), dtype=F64)).view_as(o) for o in outs]
        loss = sum((o * w).sum() for o, w in zip(outs, weights, strict=True))
        return [*outs, *torch.autograd.grad(loss, leaves)]

    for got, want in zip(
        run(numba_ops.mamba_block_numba), run(ops.mamba_block_reference), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


def test_masked_causal_conv_branches_agree():
    """The F.conv1d branch (no resets) equals the tap-by-tap branch (resets all false)."""
    B, L, C, W = 3, 9, 5, 4
    x = _randn(B, L, C, seed=30)
    state = _randn(B, C, W, seed=31)
    weight, bias = _randn(C, 1, W, seed=32), _randn(C, seed=33)
    no_resets = torch.zeros(B, L, dtype=torch.bool)
    for b in (bias, None):
        fused = ops.masked_causal_conv(x, state, weight, b, None)
        composed = ops.masked_causal_conv(x, state, weight, b, no_resets)
        for got, want in zip(fused, composed, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", ["tanh", "relu", "silu", "gelu"])
def test_run_sequential_matches_the_module_call(activation):
    bb = make_backbone("mlp", 7, 16, num_layers=3, activation=activation).double()
    x = _randn(4, 5, 7, seed=40)
    torch.testing.assert_close(run_sequential(bb.net, x), bb.net(x), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------
# numba's runtime: nothing changed by seqmodels, the layer chosen by the caller
# ------------------------------------------------------------------------------------------


def _omp_loadable() -> bool:
    from seqmodels.kernels.numba_runtime import _layer_loadable

    return _layer_loadable("omp")


def _python(*parts: str, args: tuple[str, ...] = (), pool: int | None = None) -> str:
    """Run the code parts in a fresh interpreter (numba's threading layer is chosen once per
    process) with ``args`` as sys.argv[1:] and, when ``pool`` is given, numba's pool sized to
    it; returns its stdout."""
    code = "\n".join(textwrap.dedent(part) for part in parts)
    env = None if pool is None else {**os.environ, "NUMBA_NUM_THREADS": str(pool)}
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


_RUN_MODELS = """
    import torch
    from seqmodels import Mamba, Mamba2
    for cls, kw in ((Mamba, {}), (Mamba2, {"d_state": 8, "headdim": 8})):
        m = cls(16, backend="numba", **kw)
        y, s = m(torch.randn(2, 9, 16))
        y.sum().backward()
        with torch.no_grad():
            m.step(torch.randn(2, 16), s, torch.tensor([True, False]))
"""


def test_importing_and_running_seqmodels_changes_no_process_setting():
    out = _python(
        """
        import os, sys
        import torch
        torch.set_num_threads(1)
        env = dict(os.environ)
        import seqmodels, seqmodels.kernels
        assert "numba" not in sys.modules, "importing seqmodels imported numba"
        import numba
        layer, threads = numba.config.THREADING_LAYER, numba.get_num_threads()
        """,
        _RUN_MODELS,
        """
        assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())
        assert numba.config.THREADING_LAYER == layer
        assert numba.get_num_threads() == threads, (numba.get_num_threads(), threads)
        assert torch.get_num_threads() == 1
        print("layer", numba.threading_layer())
        """,
    )
    assert "layer" in out


def test_set_numba_threading_layer_before_and_after_the_pool_starts():
    out = _python(
        """
        import pytest
        from seqmodels.kernels import numba_threading_layer, set_numba_threading_layer
        assert numba_threading_layer() is None
        set_numba_threading_layer("workqueue")
        """,
        _RUN_MODELS,
        """
        assert numba_threading_layer() == "workqueue"
        set_numba_threading_layer("workqueue")  # already so: a no-op
        set_numba_threading_layer("forksafe")  # satisfied by workqueue: a no-op
        with pytest.raises(RuntimeError, match="already initialised as 'workqueue'"):
            set_numba_threading_layer("omp")
        print("ok")
        """,
    )
    assert out.strip().endswith("ok")


def test_auto_threading_layer_picks_omp_for_a_one_thread_pool(monkeypatch):
    import seqmodels.kernels.numba_runtime as rt

    monkeypatch.setattr(rt, "_layer_loadable", lambda name: True)
    assert rt.auto_threading_layer(1) == "omp"
    for threads in (2, 3, 64):
        assert rt.auto_threading_layer(threads) == "workqueue"
    monkeypatch.setattr(rt, "_layer_loadable", lambda name: False)  # no GNU OpenMP here
    assert rt.auto_threading_layer(1) == "workqueue"
    for bad in (0, -1, 1.0, True, "1"):
        with pytest.raises(ValueError, match="pool_threads must be an integer >= 1"):
            rt.auto_threading_layer(bad)


def test_numba_thread_safe_follows_the_running_or_the_requested_layer(monkeypatch):
    """Hand-worked against numba's rules: the running layer decides; before the pool starts,
    the first loadable layer that satisfies the requested name (tbb, omp, workqueue for
    "default"; tbb, workqueue for "forksafe")."""
    import numba

    import seqmodels.kernels.numba_runtime as rt

    monkeypatch.setattr(rt, "numba_threading_layer", lambda: "workqueue")
    assert rt.numba_thread_safe() is False
    for layer in ("omp", "tbb"):
        monkeypatch.setattr(rt, "numba_threading_layer", lambda layer=layer: layer)
        assert rt.numba_thread_safe() is True
    monkeypatch.setattr(rt, "numba_threading_layer", lambda: None)
    loadable = {"tbb": False, "omp": True, "workqueue": True}
    monkeypatch.setattr(rt, "_layer_loadable", lambda name: loadable[name])
    cases = {"workqueue": False, "omp": True, "default": True, "threadsafe": True,
             "forksafe": False, "safe": False}  # fmt: skip
    for requested, expected in cases.items():
        monkeypatch.setattr(numba.config, "THREADING_LAYER", requested)
        assert rt.numba_thread_safe() is expected, requested
    loadable["omp"] = False  # no GNU OpenMP: "default" falls through to workqueue
    monkeypatch.setattr(numba.config, "THREADING_LAYER", "default")
    assert rt.numba_thread_safe() is False
    loadable["tbb"] = True
    assert rt.numba_thread_safe() is True


def test_mamba_backbone_is_thread_safe_off_the_numba_backend(monkeypatch):
    from seqmodels.backbones import MambaBackbone

    monkeypatch.setattr("seqmodels.backbones.numba_thread_safe", lambda: False)
    for kind in ("mamba", "mamba2"):
        net = MambaBackbone(kind, 8, 16)
        assert net.thread_safe is False  # CPU float32, backend auto: numba's kernels
        net.backend = "chunked"
        assert net.thread_safe is True
        net.backend = "numba"
        monkeypatch.setattr("seqmodels.backbones.numba_thread_safe", lambda: True)
        assert net.thread_safe is True
        monkeypatch.setattr("seqmodels.backbones.numba_thread_safe", lambda: False)


@pytest.mark.skipif(not _omp_loadable(), reason="numba's omp layer needs GNU OpenMP")
def test_mappo_runs_mamba_types_side_by_side_on_omp_with_sequential_results():
    """On the omp layer (the trainer's pick for a one-thread pool) MAPPO updates the agent
    types' mamba actors in two threads at once: no abort, and bit for bit the parameters of
    the types updated one after another."""
    out = _python(
        """
        import sys, torch
        sys.path.insert(0, "tests")
        torch.set_num_threads(1)  # as the trainer sets it for a one-thread numba pool
        from seqmodels.kernels import numba_threading_layer, set_numba_threading_layer
        set_numba_threading_layer("omp")
        from marl.algos.mappo import MAPPO
        from marl.run.config import TrainConfig, validate_config
        for backbone in ("mamba", "mamba2"):
            params = []
            for parallel in (False, True):
                cfg = TrainConfig(env_fn="test_train_fakeenv:vector_env", num_envs=6,
                                  rollout_steps=12, seq_len=4, backbone=backbone,
                                  env={"max_cycles": 5, "goal": 2}, progress=False,
                                  parallel_update=parallel)
                validate_config(cfg)
                torch.manual_seed(0)
                algo = MAPPO(cfg, None)
                assert algo.policy_update.parallel is parallel
                for _ in range(2):
                    algo.iteration(0.0)
                params.append([p.detach().clone() for p in algo.policy.parameters()])
            assert all(torch.equal(a, b) for a, b in zip(*params, strict=True)), backbone
        assert numba_threading_layer() == "omp"
        print("ok")
        """,
        pool=1,
    )
    assert out.strip().endswith("ok")


_LAYER_RESULTS = """
    import sys, numpy as np, torch
    from seqmodels.kernels import numba_threading_layer, set_numba_threading_layer
    set_numba_threading_layer(sys.argv[1])
    torch.manual_seed(0)
    from seqmodels import Mamba, Mamba2
    out = {}
    for name, cls, kw in (("mamba", Mamba, {}), ("mamba2", Mamba2, {"d_state": 8, "headdim": 8})):
        m = cls(16, backend="numba", **kw)
        x = torch.randn(3, 37, 16)
        resets = torch.rand(3, 37) < 0.1
        y, s = m(x, resets=resets)
        y.square().sum().backward()
        out[name + "_y"] = y.detach().numpy()
        for p_name, p in m.named_parameters():
            out[name + "_grad_" + p_name] = p.grad.numpy()
        with torch.no_grad():
            for t in range(5):
                y1, s = m.step(x[:, t], s, resets[:, t])
                out[name + f"_step{t}"] = y1.numpy()
    assert numba_threading_layer() == sys.argv[1]
    np.savez(sys.argv[2], **out)
"""


@pytest.mark.skipif(not _omp_loadable(), reason="numba's omp layer needs GNU OpenMP")
def test_the_threading_layer_changes_speed_not_results(tmp_path):
    """A one-thread pool on omp (the trainer's 'auto' pick) and on workqueue compute the same
    forward, gradients and steps, bit for bit."""
    files = {}
    for layer in ("omp", "workqueue"):
        files[layer] = tmp_path / f"{layer}.npz"
        _python(_LAYER_RESULTS, args=(layer, str(files[layer])), pool=1)
    a, b = np.load(files["omp"]), np.load(files["workqueue"])
    assert sorted(a.files) == sorted(b.files) and len(a.files) > 10
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("pool, expected", [(1, "omp"), (2, "workqueue")])
def test_the_trainers_auto_layer_follows_the_numba_pool_in_a_fresh_process(pool, expected):
    if expected == "omp" and not _omp_loadable():
        pytest.skip("numba's omp layer needs GNU OpenMP")
    out = _python(
        """
        import numba, torch
        from marl.run.config import parse_cli
        from marl.run.train import configure_process
        configure_process(parse_cli(["--malloc-tuning", "false"]))  # --numba-threading-layer auto
        from seqmodels import Mamba
        Mamba(8, backend="numba")(torch.randn(1, 3, 8))
        print(numba.threading_layer())
        """,
        pool=pool,
    )
    assert out.split() == [expected]


def test_set_numba_threading_layer_rejects_unknown_names():
    with pytest.raises(ValueError, match="threading layer must be one of"):
        set_numba_threading_layer("openmp")
    assert "workqueue" in THREADING_LAYERS


_FAULTS_OF_FREED_BLOCKS = """
    import resource, sys, torch
    from seqmodels.kernels import set_malloc_thresholds
    if sys.argv[1] == "tuned":
        assert set_malloc_thresholds() is True
    def step():  # a training step's pattern: several 16 MiB tensors written, then freed
        blocks = [torch.ones(4 * 1024 * 1024) for _ in range(3)]
        del blocks
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not malloc_tuning_available(), reason="needs glibc")
def test_malloc_thresholds_keep_freed_blocks_for_the_next_step():
    """glibc's adaptive thresholds trim freed blocks and fault them in again (measured: 167k
    page faults over 20 steps in most heap layouts, 16k-24k in some); fixed ones keep them:
    the 20 steps fault in at most two steps' worth of the three 16 MiB blocks (4096 pages
    each; CI measured 12288 and 16384: three blocks once, four), where trimming faults them
    every step (20 x 12288). Where the default heap keeps them too, the tuned one faults no
    more than it."""
    faults = {}
    for mode in ("default", "tuned"):
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_FAULTS_OF_FREED_BLOCKS), mode],
            capture_output=True, text=True, cwd=ROOT, timeout=120, check=True,
        )  # fmt: skip
        faults[mode] = int(out.stdout.strip().splitlines()[-1])
    bound = 2 * 3 * 4096 * 1.1  # two steps' blocks; a trimmed heap faults 20 steps' worth
    assert faults["tuned"] <= bound, faults
    assert faults["tuned"] <= faults["default"], faults


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mmap_threshold": MAX_MMAP_THRESHOLD + 1}, "mmap_threshold must be an int"),
        ({"mmap_threshold": -1}, "mmap_threshold must be an int"),
        ({"trim_threshold": 2**31}, "trim_threshold must be an int"),
        ({"trim_threshold": 1.5}, "trim_threshold must be an int"),
        ({"mmap_threshold": True}, "mmap_threshold must be an int"),
    ],
)
def test_malloc_thresholds_reject_values_out_of_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        set_malloc_thresholds(**kwargs)


def test_tbb_layer_without_tbb_is_a_clear_error():
    try:
        import numba.np.ufunc.tbbpool  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("tbb is installed here")
    _python(
        """
        import pytest
        from seqmodels.kernels import set_numba_threading_layer
        with pytest.raises(ValueError, match="'tbb' threading layer cannot be loaded"):
            set_numba_threading_layer("tbb")
        """
    )


def test_private_torch_apis_only_in_kernels():
    """``torch._*`` and tensor internals (``._base``) only under seqmodels/kernels/."""
    private = re.compile(r"\btorch\._\w|\._base\b")
    offenders = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in sorted((ROOT / "seqmodels").rglob("*.py"))
        if "kernels" not in path.relative_to(ROOT / "seqmodels").parts
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert offenders == []


# ------------------------------------------------------------------------------------------
# RMSNorm (the backbones' norms)
# ------------------------------------------------------------------------------------------


def _rmsnorm_numpy(x, w, eps, g):
    """out, dx, dw of sum(out * g) by hand in numpy float64: out = x r w, r = (mean x^2 +
    eps)^-1/2; dx = r (g w) - x r^3 mean(g w x); dw = sum over rows of g x r."""
    import numpy as np

    x, w, g = (np.asarray(t, dtype=np.float64) for t in (x, w, g))
    r = 1.0 / np.sqrt((x**2).mean(-1, keepdims=True) + eps)
    out = x * r * w
    dx = r * g * w - x * r**3 * (g * w * x).mean(-1, keepdims=True)
    dw = (g * x * r).reshape(-1, x.shape[-1]).sum(0)
    return out, dx, dw


@pytest.mark.parametrize("shape", [(3, 7, 12), (5, 12), (2, 3, 4, 8), (0, 4, 8), (130, 2, 6)])
@pytest.mark.parametrize("fast", [True, False], ids=["numba", "reference"])
def test_rmsnorm_matches_a_numpy_hand_derivation(shape, fast):
    x = _randn(*shape, seed=1).requires_grad_(True)
    w = _randn(shape[-1], seed=2).requires_grad_(True)
    g = _randn(*shape, seed=3)
    fn = numba_ops.rmsnorm_numba if fast else ops.rmsnorm_reference
    out = fn(x, w, 1e-5)
    dx, dw = torch.autograd.grad(out, (x, w), g)
    ref = _rmsnorm_numpy(x.detach(), w.detach(), 1e-5, g)
    for got, want in zip((out, dx, dw), ref, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got.detach(), torch.from_numpy(want), rtol=1e-12, atol=1e-12)


def test_rmsnorm_numba_gradcheck_float32_and_no_grad_path():
    x = _randn(2, 5, 6, seed=4).requires_grad_(True)
    w = _randn(6, seed=5).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a, b: numba_ops.rmsnorm_numba(a, b, 1e-5), [x, w], eps=1e-6, atol=1e-8
    )
    x32, w32 = x.detach().float(), w.detach().float()
    with torch.no_grad():  # the forward kernel alone
        fast = numba_ops.rmsnorm_numba(x32, w32, 1e-5)
    assert fast.dtype == torch.float32 and fast.grad_fn is None
    torch.testing.assert_close(fast, ops.rmsnorm_reference(x32, w32, 1e-5), rtol=1e-5, atol=1e-6)


def test_rmsnorm_weight_gradient_does_not_depend_on_the_thread_count():
    x = _randn(300, 2, 16, seed=6).float().requires_grad_(True)
    w = _randn(16, seed=7).float().requires_grad_(True)
    g = _randn(300, 2, 16, seed=8).float()
    grads = []
    for threads in (1, 2):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            grads.append(torch.autograd.grad(numba_ops.rmsnorm_numba(x, w, 1e-5), (x, w), g))
        finally:
            torch.set_num_threads(before)
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_backbone_norms_run_the_dispatcher_on_the_blocks_backend(monkeypatch):
    import seqmodels.backbones as bb

    calls = []
    real = bb.rmsnorm
    monkeypatch.setattr(
        bb, "rmsnorm", lambda x, w, eps, backend: calls.append(backend) or real(x, w, eps, backend)
    )
    net = make_backbone("mamba", 5, 8, num_layers=2)
    net.backend = "chunked"
    net(torch.randn(2, 3, 5))
    assert calls == ["chunked"] * 3  # two pre-block norms and the final one
