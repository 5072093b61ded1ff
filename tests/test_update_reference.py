"""The MAPPO and GRPO updates against plain, independent recomputations (issue 14, item 11).

A mutation check showed that config values could be wired wrongly without any test failing.
Every test here recomputes one quantity of one minibatch from the batch alone (numpy float64
loops, or plain torch for the gradients) with *non-default* values of every coefficient, and
asserts the library's quantity equals it. Each test also evaluates the mutated formula next to
the reference and asserts that it is far from the library's value, so the test provably fails
for that mutation (``_assert_mutations_detected``). The mutations, and the tests that catch
them:

- MAPPO mixing with ``1 - alpha``: ``test_mappo_advantages_match_plain_gae_whitening_and_mix``
  and ``test_mappo_update_metrics_match_plain_recomputation`` (the policy loss moves);
- the actor using ``clip_high`` as ``clip_low`` (or the reverse):
  ``test_ppo_surrogate_hand_example``, ``test_mappo_policy_loss_and_gradient_match_plain``,
  ``test_mappo_update_metrics_match_plain_recomputation``, the GRPO tests;
- the team head's value clip dropped (either head's):
  ``test_mappo_value_loss_clips_both_heads``;
- dual clip active on every negative advantage (in the loss or in its indicator):
  ``test_ppo_surrogate_hand_example``, ``test_mappo_policy_loss_and_gradient_match_plain``,
  ``test_mappo_update_metrics_match_plain_recomputation`` (``dual_clip_frac``);
- GRPO's KL term multiplied by 0 (in its objective hook or in ``GRPO``'s coefficients):
  ``test_grpo_loss_terms_and_gradient_match_plain`` and
  ``test_grpo_update_metrics_match_plain_recomputation``;
- clip fractions counted regardless of the advantage's sign: ``test_ppo_stats_hand_example``,
  and with the sign of the advantage *before* the optimism offset (a bug found by this file):
  ``test_mappo_update_clip_fractions_use_the_offset_advantage``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from marl.algos.grpo import GRPO, episode_units, group_seeds
from marl.algos.mappo import MAPPO
from marl.algos.ppo import PPOLossConfig
from marl.core.losses import ValueNorm, ppo_stats, ppo_surrogate
from marl.rollout.episodes import collect_group_episodes
from marl.run.config import TrainConfig, validate_config

FAKE = "test_train_fakeenv:vector_env"

#: non-default coefficients shared by the MAPPO and GRPO cases
ALPHA, CLIP_LOW, CLIP_HIGH, DUAL_CLIP, ENT_COEF = 0.3, 0.1, 0.3, 2.0, 0.05
VALUE_CLIP, OFFSET_INIT, KL_BETA = 0.05, 0.3, 0.2
WHITEN_EPS = 1e-8  # the whitening library's eps (added to the population std)

RTOL, ATOL = 1e-5, 1e-6
#: a mutated formula must move the checked quantity by more than this (>> the tolerances)
MUTATION_GAP = 1e-3


def _assert_mutations_detected(got: float, reference: float, mutants: dict[str, float]) -> None:
    """``got`` equals ``reference`` and is far from every mutated formula's value."""
    assert got == pytest.approx(reference, rel=RTOL, abs=ATOL)
    for name, value in mutants.items():
        assert abs(value - reference) > MUTATION_GAP, f"the test is blind to mutation {name!r}"


def _assert_grads_close(got: list[Tensor | None], want: list[Tensor]) -> None:
    for g, w in zip(got, want, strict=True):
        g = torch.zeros_like(w) if g is None else g
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-4, atol=1e-6)


def _randomise_actor_heads(policy: torch.nn.Module, generator: torch.Generator) -> None:
    """Give the actors' output heads O(1) weights, so that the policy is far from uniform."""
    with torch.no_grad():
        for actor in policy.actors.values():
            w = torch.randn(actor.head.weight.shape, generator=generator)
            actor.head.weight.copy_(w)
            actor.head.bias.copy_(0.3 * torch.randn(actor.head.bias.shape, generator=generator))


# ---------------------------------------------------------------------- plain references


def _plain_surrogate(
    ratio: Tensor,
    adv: Tensor,
    *,
    low: float,
    high: float,
    dual: float | None,
    dual_on_every_negative: bool = False,
) -> Tensor:
    """The clipped surrogate written per sign of the advantage (not as min of two products):
    A >= 0: ``A * min(r, 1 + high)``; A < 0: ``A * max(r, 1 - low)``, then the dual bound
    ``max(s, c * A)`` for A < 0. ``dual_on_every_negative``: the mutation ``s = c * A``."""
    pos = adv * torch.minimum(ratio, torch.full_like(ratio, 1.0 + high))
    neg = adv * torch.maximum(ratio, torch.full_like(ratio, 1.0 - low))
    if dual is not None:
        neg = dual * adv if dual_on_every_negative else torch.maximum(neg, dual * adv)
    return torch.where(adv >= 0, pos, neg)


def _plain_logp_entropy(logits: Tensor, mask: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
    """log pi(a) and the entropy of the categorical over the allowed actions, float64."""
    z = logits.double().masked_fill(~mask.bool(), -1e30)  # a row with no allowed action: uniform
    z = z - z.max(-1, keepdim=True).values
    logp_all = z - torch.log(torch.exp(z).sum(-1, keepdim=True))
    p = torch.exp(logp_all)
    entropy = -torch.where(mask.bool(), p * logp_all, torch.zeros_like(p)).sum(-1)
    return logp_all.gather(-1, actions.long()[..., None])[..., 0], entropy


def _np_gae(r, v, nv, term, trunc, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """GAE along axis 0 with python loops over every trailing index, float64."""
    r, v, nv = (np.asarray(x, np.float64) for x in (r, v, nv))
    adv = np.zeros_like(r)
    for idx in np.ndindex(r.shape[1:]):
        last = 0.0
        for t in reversed(range(r.shape[0])):
            at = (t, *idx)
            bootstrap = 0.0 if term[at] else nv[at]
            delta = r[at] + gamma * bootstrap - v[at]
            last = delta + gamma * lam * (0.0 if (term[at] or trunc[at]) else 1.0) * last
            adv[at] = last
    return adv, adv + v


def _np_whiten(x: np.ndarray) -> np.ndarray:
    """(x - mean) / (population std + eps) over all of x; 0 where the std is 0."""
    x = np.asarray(x, np.float64)
    std = x.std()
    if x.size <= 1 or std == 0:
        return np.zeros_like(x)
    return (x - x.mean()) / (std + WHITEN_EPS)


def _np_value_norm_moments(vn: ValueNorm) -> tuple[np.ndarray, np.ndarray]:
    """MAPPO ValueNorm's debiased mean and variance from its buffers."""
    debias = max(float(vn.debiasing_term), vn.epsilon)
    mean = vn.running_mean.numpy() / debias
    var = np.maximum(vn.running_mean_sq.numpy() / debias - mean**2, 1e-2)
    return mean, var


def _np_value_norm_update(vn: ValueNorm, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance a ValueNorm would have after ``update(rows [M, *shape])`` (EMA of the
    batch's first and second moments, then debiased), computed from its current buffers."""
    b = vn.beta
    rm = b * vn.running_mean.numpy() + (1 - b) * rows.mean(0)
    rms = b * vn.running_mean_sq.numpy() + (1 - b) * (rows**2).mean(0)
    debias = max(b * float(vn.debiasing_term) + (1 - b), vn.epsilon)
    mean = rm / debias
    return mean, np.maximum(rms / debias - mean**2, 1e-2)


# ---------------------------------------------------------------------- hand-worked examples


def test_ppo_surrogate_hand_example():
    """clip_low 0.1 / clip_high 0.3, dual clip 2: each sample in its own region.

    Catches: the clip range [1 - clip_high, 1 + clip_high] or [1 - clip_low, 1 + clip_low]
    (samples 1 and 3), dual clip on every negative advantage (samples 4 and 5: s = 2A)."""
    ratio = torch.tensor([1.5, 1.2, 0.8, 0.8, 1.5, 0.5, 3.0, 3.0])
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0])
    expected = [
        1.3,  # A > 0, r > 1 + clip_high: clipped at 1.3
        1.2,  # A > 0, r in (1 + clip_low, 1 + clip_high): not clipped
        0.8,  # A > 0, r < 1 - clip_low: the unclipped term is the minimum
        -0.9,  # A < 0, r in (1 - clip_high, 1 - clip_low): clipped at 0.9
        -1.5,  # A < 0, r < dual_clip: the dual bound (-2) is not active
        -0.9,  # A < 0, r < 1 - clip_low: clipped at 0.9
        -2.0,  # A < 0, r > dual_clip: the dual bound c * A = -2 is active
        1.3,  # A > 0, r > dual_clip: no dual bound for positive advantages
    ]
    s, active = ppo_surrogate(
        ratio.log(),
        torch.zeros(8),
        adv,
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        dual_clip=DUAL_CLIP,
    )
    np.testing.assert_allclose(s.numpy(), expected, rtol=1e-6)
    assert active.tolist() == [False] * 6 + [True, False]


def test_ppo_stats_hand_example():
    """Clip fractions count a sample only where its clip binds: ratio < 1 - clip_low with
    A < 0, ratio > 1 + clip_high with A > 0; masked samples are not counted.

    Catches: the sign conditions dropped (sample 1 would count low, 3 high), clip_low and
    clip_high swapped (0.8 < 1 - 0.3 is false; 1.2 > 1 + 0.1 is true)."""
    ratio = torch.tensor([0.8, 0.8, 1.4, 1.4, 1.2, 1.0, 0.5, 0.85])
    adv = torch.tensor([-1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0, 2.0])
    mask = torch.tensor([True, True, True, True, True, True, False, True])
    dual_active = torch.tensor([False, False, False, False, False, True, True, False])
    logp_old = torch.linspace(-2.0, -0.5, 8)
    stats = ppo_stats(
        logp_old + ratio.log(),
        logp_old,
        adv,
        dual_active,
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        mask=mask,
    )
    assert float(stats["clip_frac_low"]) == pytest.approx(1 / 7)  # sample 0 only
    assert float(stats["clip_frac_high"]) == pytest.approx(1 / 7)  # sample 2 only
    assert float(stats["dual_clip_frac"]) == pytest.approx(1 / 7)  # sample 5 (6 is masked)
    r = ratio.double().numpy()[mask.numpy()]
    assert float(stats["approx_kl"]) == pytest.approx(np.mean(r - 1 - np.log(r)), rel=1e-5)


# ---------------------------------------------------------------------- MAPPO


def _mappo_case(seed: int = 2):
    """A tiny MAPPO (signal game, 2 callers + 1 picker, 6 envs x 16 steps, 1 epoch, 1
    minibatch) with non-default coefficients, and one collected batch in which the policy and
    the critic have "moved": behaviour log-probs shifted by U(-1, 1) (ratios from 0.37 to
    2.7) and stored values by U(-0.3, 0.3) (so the value clip binds). The ValueNorms hold
    non-trivial statistics."""
    cfg = TrainConfig(
        env_fn=FAKE,
        env={"max_cycles": 5, "goal": 1},
        num_envs=6,
        rollout_steps=16,
        hidden_dim=16,
        critic_hidden_dim=16,
        epochs=1,
        num_minibatches=1,
        value_epochs=1,
        gamma=0.9,
        gae_lambda=0.8,
        alpha=ALPHA,
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        dual_clip=DUAL_CLIP,
        ent_coef=ENT_COEF,
        value_clip=VALUE_CLIP,
        value_ensemble=2,
        optimism_offset=OFFSET_INIT,
        parallel_update=False,
        progress=False,
        seed=seed,
    )
    validate_config(cfg)
    torch.manual_seed(seed)
    algo = MAPPO(cfg, None)
    gen = torch.Generator().manual_seed(seed)
    N = algo.layout.n_agents
    algo.value_norm_team.update(1.0 + 2.0 * torch.randn(64, 1, generator=gen))
    algo.value_norm_ind.update(-0.5 + torch.rand(N) + 0.7 * torch.randn(64, N, generator=gen))
    _randomise_actor_heads(algo.policy, gen)
    batch = algo.collect()
    for k, logp in batch.logp.items():
        batch.logp[k] = logp + 2.0 * torch.rand(logp.shape, generator=gen) - 1.0
    batch.values_team = batch.values_team + 0.6 * torch.rand(batch.values_team.shape) - 0.3
    batch.values_individual = (
        batch.values_individual + 0.6 * torch.rand(batch.values_individual.shape) - 0.3
    )
    assert batch.terminated.any() and batch.truncated.any()  # both GAE cases occur
    return algo, batch


def _mappo_reference_advantages(algo: MAPPO, batch, alpha: float) -> dict[str, np.ndarray]:
    """GAE per channel and ensemble head (denormalised values), head mean, whitening per agent
    type by hand, mixed ``alpha * team + (1 - alpha) * individual``."""
    cfg = algo.cfg
    mean_t, var_t = _np_value_norm_moments(algo.value_norm_team)  # [1]
    mean_i, var_i = _np_value_norm_moments(algo.value_norm_ind)  # [N]

    def denorm_team(v: Tensor) -> np.ndarray:  # [T, E, K]
        return v.double().numpy() * np.sqrt(var_t[0]) + mean_t[0]

    def denorm_ind(v: Tensor) -> np.ndarray:  # [T, E, N, K]
        return v.double().numpy() * np.sqrt(var_i)[:, None] + mean_i[:, None]

    T, E, N, K = batch.values_individual.shape
    term, trunc = batch.terminated.numpy(), batch.truncated.numpy()
    r_team = np.repeat(batch.reward_team.double().numpy()[..., None], K, -1)
    r_ind = (batch.reward_individual.double() + batch.reward_penalty.double()).numpy()
    r_ind = np.repeat(r_ind[..., None], K, -1)
    term_k, trunc_k = np.repeat(term[..., None], K, -1), np.repeat(trunc[..., None], K, -1)
    term_nk = np.repeat(term_k[:, :, None], N, 2)
    trunc_nk = np.repeat(trunc_k[:, :, None], N, 2)
    team_adv, team_ret = _np_gae(
        r_team,
        denorm_team(batch.values_team),
        denorm_team(batch.next_values_team),
        term_k,
        trunc_k,
        cfg.gamma,
        cfg.gae_lambda,
    )
    ind_adv, ind_ret = _np_gae(
        r_ind,
        denorm_ind(batch.values_individual),
        denorm_ind(batch.next_values_individual),
        term_nk,
        trunc_nk,
        cfg.gamma,
        cfg.gae_lambda,
    )
    team = np.repeat(team_adv.mean(-1)[..., None], N, -1)  # [T, E, N]
    individual = ind_adv.mean(-1)  # [T, E, N]
    final = np.zeros((T, E, N))
    for t in algo.layout.types:
        ids = list(t.agent_ids)
        final[:, :, ids] = alpha * _np_whiten(team[:, :, ids]) + (1 - alpha) * _np_whiten(
            individual[:, :, ids]
        )
    return {
        "raw": alpha * team + (1 - alpha) * individual,
        "final": final,
        "returns_team": team_ret,
        "returns_individual": ind_ret,
    }


def test_mappo_advantages_match_plain_gae_whitening_and_mix():
    """Catches: mixing with 1 - alpha (raw or whitened), whitening over all agents instead of
    per type, a head dropped from the ensemble mean, a wrong denormalisation."""
    algo, batch = _mappo_case()
    ref = _mappo_reference_advantages(algo, batch, ALPHA)
    mutant = _mappo_reference_advantages(algo, batch, 1 - ALPHA)
    got = algo.advantages(batch, 0.0)
    for name in ("raw", "final", "returns_team", "returns_individual"):
        np.testing.assert_allclose(
            getattr(got, name).double().numpy(), ref[name], rtol=1e-5, atol=1e-5, err_msg=name
        )
    for name in ("raw", "final"):
        assert np.abs(mutant[name] - ref[name]).max() > 0.1, name


def _mappo_plain_policy_terms(
    algo: MAPPO,
    batch,
    advantages: np.ndarray,
    *,
    low: float = CLIP_LOW,
    high: float = CLIP_HIGH,
    dual: float | None = DUAL_CLIP,
    dual_on_every_negative: bool = False,
    offset: float | None = OFFSET_INIT,
) -> dict[str, Tensor]:
    """Policy and entropy terms of the whole rollout as one minibatch, from the batch: the
    actors' logits on ``batch.obs``, ratio to ``batch.logp``, the surrogate on A + b, sums
    over every (step, env, agent) of every type divided by their count; also the clip
    diagnostics (where each clip binds)."""
    T, E = batch.num_steps, batch.num_envs
    count = T * E * algo.layout.n_agents  # every step of a rollout enters the loss
    policy = entropy = torch.zeros((), dtype=torch.float64)
    ratios, advs = [], []
    for t in algo.layout.types:
        k = t.name
        dist = algo.policy.actors[k].sequence(batch.obs[k], batch.mask[k], None, None)
        logp, ent = _plain_logp_entropy(dist.logits, batch.mask[k], batch.actions[k])
        ratio = torch.exp(logp - batch.logp[k].double())
        adv = torch.as_tensor(advantages[:, :, list(t.agent_ids)], dtype=torch.float64)
        if offset is not None:
            adv = adv + offset
        s = _plain_surrogate(
            ratio, adv, low=low, high=high, dual=dual, dual_on_every_negative=dual_on_every_negative
        )
        policy = policy - s.sum() / count
        entropy = entropy - ENT_COEF * ent.sum() / count
        ratios.append(ratio.detach().reshape(-1))
        advs.append(adv.reshape(-1))
    r, a = torch.cat(ratios), torch.cat(advs)
    # where the dual bound is the one taken: A * max(r, 1 - low) < c * A, i.e. max(r, .) > c
    dual_active = (a < 0) & (torch.maximum(r, torch.full_like(r, 1.0 - low)) > DUAL_CLIP)
    return {
        "loss/policy": policy,
        "loss/entropy": entropy,
        "ratio": r,
        "adv": a,
        "clip_frac_low": ((r < 1 - low) & (a < 0)).double().mean(),
        "clip_frac_high": ((r > 1 + high) & (a > 0)).double().mean(),
        "dual_clip_frac": dual_active.double().mean(),
        "approx_kl": (r - 1 - torch.log(r)).mean(),
        "entropy": -entropy / ENT_COEF,
    }


def _policy_mutants(algo: MAPPO, batch, advantages: np.ndarray) -> dict[str, float]:
    @torch.no_grad()
    def loss(**kw) -> float:
        return float(_mappo_plain_policy_terms(algo, batch, advantages, **kw)["loss/policy"])

    return {
        "clip_high used as clip_low": loss(low=CLIP_HIGH),
        "clip_low used as clip_high": loss(high=CLIP_LOW),
        "dual clip on every negative advantage": loss(dual_on_every_negative=True),
        "no dual clip": loss(dual=None),
        "no optimism offset": loss(offset=None),
    }


def _assert_every_region_occurs(ratio: Tensor, adv: Tensor) -> None:
    """The samples cover every region in which a mutation changes the surrogate."""
    regions = {
        "A<0, 1-clip_high < r < 1-clip_low": (adv < 0) & (ratio > 1 - CLIP_HIGH) & (ratio < 0.9),
        "A>0, 1+clip_low < r < 1+clip_high": (adv > 0) & (ratio > 1 + CLIP_LOW) & (ratio < 1.3),
        "A>0, r > 1+clip_high": (adv > 0) & (ratio > 1 + CLIP_HIGH),
        "A<0, r > dual_clip": (adv < 0) & (ratio > DUAL_CLIP),
        "A<0, r < dual_clip": (adv < 0) & (ratio < DUAL_CLIP),
    }
    for name, where in regions.items():
        assert int(where.sum()) >= 3, name


def test_mappo_policy_loss_and_gradient_match_plain():
    """MAPPO's objective on ``policy_units`` (summed over agent types, count of all types) equals
    the plain recomputation from the batch, term by term, and so do its gradients.

    Catches: clip_high used as clip_low (or the reverse), dual clip on every negative
    advantage or dropped, the optimism offset not added, a per-type denominator."""
    algo, batch = _mappo_case()
    advantages = _mappo_reference_advantages(algo, batch, ALPHA)["final"]
    cfg = algo.cfg
    coef = PPOLossConfig(
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        dual_clip=cfg.dual_clip,
        ent_coef=cfg.ent_coef,
    )
    units = algo.policy_units(batch, torch.as_tensor(advantages, dtype=torch.float32))
    count = float(batch.num_steps * batch.num_envs * algo.layout.n_agents)
    terms = [
        algo.policy_update.objective(algo.policy.actors[k], mb, coef, count=count)
        for k, mb in units.items()
    ]
    ref = _mappo_plain_policy_terms(algo, batch, advantages)
    _assert_every_region_occurs(ref["ratio"], ref["adv"])
    params = list(algo.policy.parameters())
    mutants = _policy_mutants(algo, batch, advantages)
    for key in ("loss/policy", "loss/entropy"):
        got = sum(t[key] for t in terms)
        _assert_mutations_detected(
            float(got.detach()), float(ref[key].detach()), mutants if key == "loss/policy" else {}
        )
        _assert_grads_close(
            torch.autograd.grad(got, params, retain_graph=True, allow_unused=True),
            torch.autograd.grad(ref[key], params, retain_graph=True),
        )
    assert "loss/kl" not in terms[0]  # MAPPO has no reference policy


def test_mappo_update_metrics_match_plain_recomputation():
    """``MAPPO.update`` with one epoch and one minibatch reports the losses of that
    minibatch before its step: they equal the plain recomputation, which exercises the wiring
    of every config value (alpha into the whitener, clip_low/clip_high/dual_clip/ent_coef
    into the policy loss, the offset).

    Catches: mixing with 1 - alpha, clip_high used as clip_low, dual clip on every negative
    advantage (loss and ``dual_clip_frac``), ent_coef not applied."""
    algo, batch = _mappo_case()
    advantages = _mappo_reference_advantages(algo, batch, ALPHA)["final"]
    alpha_mutant = _mappo_reference_advantages(algo, batch, 1 - ALPHA)["final"]
    with torch.no_grad():
        ref = _mappo_plain_policy_terms(algo, batch, advantages)
        mutants = _policy_mutants(algo, batch, advantages)
        mutants["mixing with 1 - alpha"] = float(
            _mappo_plain_policy_terms(algo, batch, alpha_mutant)["loss/policy"]
        )
    metrics = algo.update(batch, 0.0)
    _assert_mutations_detected(metrics["loss/policy"], float(ref["loss/policy"]), mutants)
    assert metrics["loss/entropy"] == pytest.approx(float(ref["loss/entropy"]), rel=RTOL)
    assert metrics["entropy"] == pytest.approx(float(ref["entropy"]), rel=RTOL)
    assert metrics["approx_kl"] == pytest.approx(float(ref["approx_kl"]), rel=1e-4)
    # the dual bound is active on some negative advantages, not on all of them
    n_neg = float((ref["adv"] < 0).double().mean())
    assert 0 < float(ref["dual_clip_frac"]) < n_neg - MUTATION_GAP
    assert metrics["dual_clip_frac"] == pytest.approx(float(ref["dual_clip_frac"]), abs=1e-6)


def test_mappo_update_clip_fractions_use_the_offset_advantage():
    """``clip_frac_low``/``clip_frac_high`` are "the fraction of samples where a bound binds"
    (ppo_stats): the sign that decides whether a clip binds is that of the advantage the
    surrogate uses, A + b with the optimism offset b.

    Catches: clip_high used as clip_low in the diagnostics. Fails today (see the report):
    the update's metrics used the advantages *without* the offset."""
    algo, batch = _mappo_case()
    advantages = _mappo_reference_advantages(algo, batch, ALPHA)["final"]
    with torch.no_grad():
        ref = _mappo_plain_policy_terms(algo, batch, advantages)
    metrics = algo.update(batch, 0.0)
    for key in ("clip_frac_low", "clip_frac_high"):
        assert metrics[key] == pytest.approx(float(ref[key]), abs=1e-6), key


def _mappo_plain_value_loss(
    algo: MAPPO, batch, clip_team: bool = True, clip_individual: bool = True
) -> float:
    """The value loss of the whole rollout as one minibatch, before the critic's step: the
    ValueNorms updated with the GAE returns (by hand), returns normalised, then per head
    ``0.5 * mean(max((v - R)^2, (v_old + clip(v - v_old, -eps, eps) - R)^2))``, summed."""
    ref = _mappo_reference_advantages(algo, batch, ALPHA)
    T, E, N, K = batch.values_individual.shape
    ret_team = ref["returns_team"]  # [T, E, K]
    ret_ind = ref["returns_individual"]  # [T, E, N, K]
    mean_t, var_t = _np_value_norm_update(algo.value_norm_team, ret_team.reshape(-1, 1))
    rows_ind = ret_ind.transpose(0, 1, 3, 2).reshape(-1, N)  # every (t, e, k) is one row
    mean_i, var_i = _np_value_norm_update(algo.value_norm_ind, rows_ind)
    target_team = (ret_team - mean_t[0]) / np.sqrt(var_t[0])
    target_ind = (ret_ind - mean_i[:, None]) / np.sqrt(var_i)[:, None]
    with torch.no_grad():
        pred_team, pred_ind = algo.critic(batch.state.reshape(T * E, -1))
    pred_team = pred_team.double().numpy().reshape(T, E, K)
    pred_ind = pred_ind.double().numpy().reshape(T, E, N, K)

    def head(pred, old, target, clipped: bool) -> float:
        err = (pred - target) ** 2
        if clipped:
            v_clip = old + np.clip(pred - old, -VALUE_CLIP, VALUE_CLIP)
            err = np.maximum(err, (v_clip - target) ** 2)
        return 0.5 * float(err.mean())

    old_team = batch.values_team.double().numpy()
    old_ind = batch.values_individual.double().numpy()
    return head(pred_team, old_team, target_team, clip_team) + head(
        pred_ind, old_ind, target_ind, clip_individual
    )


def test_mappo_value_loss_clips_both_heads():
    """The value epochs (``SeedMAPPO.value_epochs_run``; one epoch, one minibatch) report the
    clipped value loss of both heads, team and individual, on ValueNorm-normalised returns.

    Catches: the team head's value clip dropped, the individual head's dropped, the
    ValueNorm not updated before the targets are normalised."""
    algo, batch = _mappo_case()
    reference = _mappo_plain_value_loss(algo, batch)
    mutants = {
        "team head not clipped": _mappo_plain_value_loss(algo, batch, clip_team=False),
        "individual head not clipped": _mappo_plain_value_loss(algo, batch, clip_individual=False),
    }
    metrics = algo.update(batch, 0.0)
    _assert_mutations_detected(metrics["loss/value"], reference, mutants)


# ---------------------------------------------------------------------- GRPO


def _grpo_case(seed: int = 4):
    """A tiny GRPO (signal game, 2 groups x 4 episodes, 1 epoch, 1 minibatch) whose policy
    has moved away from its reference (KL > 0), and one batch of whole episodes whose
    behaviour log-probs are shifted by U(-1, 1)."""
    cfg = TrainConfig(
        algo="grpo",
        env_fn=FAKE,
        env={"max_cycles": 6, "goal": 1},
        num_envs=8,
        group_size=4,
        hidden_dim=16,
        epochs=1,
        num_minibatches=1,
        alpha=ALPHA,
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        dual_clip=DUAL_CLIP,
        ent_coef=ENT_COEF,
        kl_beta=KL_BETA,
        parallel_update=False,
        progress=False,
        seed=seed,
    )
    validate_config(cfg)
    torch.manual_seed(seed)
    algo = GRPO(cfg, None)
    gen = torch.Generator().manual_seed(seed)
    _randomise_actor_heads(algo.policy, gen)  # the reference keeps the initial heads
    seeds = group_seeds(cfg.seed, 0, algo.num_groups)
    batch = collect_group_episodes(algo.vec, algo.layout, algo.policy, seeds, cfg.group_size)
    for k, logp in batch.logp.items():
        batch.logp[k] = logp + 2.0 * torch.rand(logp.shape, generator=gen) - 1.0
    assert not batch.valid.all()  # some episodes end early: padding is masked out
    return algo, batch


def _grpo_reference_advantages(algo: GRPO, batch, alpha: float) -> np.ndarray:
    """Outcome advantages ``[T, E, N]`` with loops: undiscounted returns of valid steps (the
    penalty folded into the individual channel), team returns normalised within each group of
    G episodes, individual returns within group x agent type, mixed by alpha, broadcast to
    the valid steps."""
    E, N, G = batch.num_envs, algo.layout.n_agents, algo.cfg.group_size
    assert batch.group_ids.tolist() == [e // G for e in range(E)]
    valid = batch.valid.numpy()
    r_ind = (batch.reward_individual.double() + batch.reward_penalty.double()).numpy()
    team_ret = np.array(
        [batch.reward_team.double().numpy()[valid[:, e], e].sum() for e in range(E)]
    )
    ind_ret = np.array(
        [[r_ind[valid[:, e], e, n].sum() for n in range(N)] for e in range(E)]
    )  # [E, N]
    team_adv, ind_adv = np.zeros(E), np.zeros((E, N))
    for p in range(E // G):
        envs = list(range(p * G, (p + 1) * G))
        team_adv[envs] = _np_whiten(team_ret[envs])
        for t in algo.layout.types:
            ids = list(t.agent_ids)
            ind_adv[np.ix_(envs, ids)] = _np_whiten(ind_ret[np.ix_(envs, ids)])
    mixed = alpha * team_adv[:, None] + (1 - alpha) * ind_adv  # [E, N]
    return np.where(valid[:, :, None], mixed[None], 0.0)


def _grpo_plain_terms(
    algo: GRPO,
    batch,
    advantages: np.ndarray,
    *,
    low: float = CLIP_LOW,
    high: float = CLIP_HIGH,
    dual_on_every_negative: bool = False,
) -> dict[str, Tensor]:
    """Policy, entropy and KL terms over the valid steps of every episode and agent type,
    divided by their count; KL = kl_beta * k3 with k3 = exp(ref - logp) - (ref - logp) - 1."""
    valid = batch.valid  # [T, E]
    count = sum(float(valid.sum()) * t.n_agents for t in algo.layout.types)
    out = {k: torch.zeros((), dtype=torch.float64) for k in ("policy", "entropy", "kl", "kl_ref")}
    ratios, advs = [], []
    for t in algo.layout.types:
        k = t.name
        m = valid[:, :, None].expand(-1, -1, t.n_agents).double()
        dist = algo.policy.actors[k].sequence(batch.obs[k], batch.mask[k], None, None)
        logp, ent = _plain_logp_entropy(dist.logits, batch.mask[k], batch.actions[k])
        with torch.no_grad():
            ref_dist = algo.reference.actors[k].sequence(batch.obs[k], batch.mask[k], None, None)
            ref_logp, _ = _plain_logp_entropy(ref_dist.logits, batch.mask[k], batch.actions[k])
        ratio = torch.exp(logp - batch.logp[k].double())
        adv = torch.as_tensor(advantages[:, :, list(t.agent_ids)], dtype=torch.float64)
        s = _plain_surrogate(
            ratio,
            adv,
            low=low,
            high=high,
            dual=DUAL_CLIP,
            dual_on_every_negative=dual_on_every_negative,
        )
        log_ratio = ref_logp - logp
        k3 = torch.exp(log_ratio) - log_ratio - 1.0
        behaviour = ref_logp - batch.logp[k].double()
        k3_behaviour = torch.exp(behaviour) - behaviour - 1.0
        out["policy"] = out["policy"] - (s * m).sum() / count
        out["entropy"] = out["entropy"] - ENT_COEF * (ent * m).sum() / count
        out["kl"] = out["kl"] + KL_BETA * (k3 * m).sum() / count
        out["kl_ref"] = out["kl_ref"] + (k3_behaviour * m).sum() / count
        ratios.append(ratio.detach()[valid])
        advs.append(adv[valid])
    out["ratio"], out["adv"] = (
        torch.cat([r.reshape(-1) for r in ratios]),
        torch.cat([a.reshape(-1) for a in advs]),
    )
    return out


def _grpo_mutants(algo: GRPO, batch, advantages: np.ndarray) -> dict[str, float]:
    @torch.no_grad()
    def loss(**kw) -> float:
        return float(_grpo_plain_terms(algo, batch, advantages, **kw)["policy"])

    return {
        "clip_high used as clip_low": loss(low=CLIP_HIGH),
        "clip_low used as clip_high": loss(high=CLIP_LOW),
        "dual clip on every negative advantage": loss(dual_on_every_negative=True),
    }


def test_grpo_loss_terms_and_gradient_match_plain():
    """GRPO's objective on ``episode_units`` (with the reference policy's log-probs) equals the
    plain recomputation: policy, entropy and KL terms and their gradients.

    Catches: GRPO's KL term multiplied by 0 (or by anything but kl_beta), clip_high used as
    clip_low, dual clip on every negative advantage, padding steps entering the loss."""
    algo, batch = _grpo_case()
    adv_ref = _grpo_reference_advantages(algo, batch, ALPHA)
    adv, _ = algo.advantages(batch, 0.0)  # also sets batch.loss_mask
    np.testing.assert_allclose(adv.double().numpy(), adv_ref, rtol=1e-5, atol=1e-5)
    assert np.abs(_grpo_reference_advantages(algo, batch, 1 - ALPHA) - adv_ref).max() > 0.1
    cfg = algo.cfg
    coef = PPOLossConfig(
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        dual_clip=cfg.dual_clip,
        ent_coef=cfg.ent_coef,
    )
    units = episode_units(
        batch,
        torch.as_tensor(adv_ref, dtype=torch.float32),
        algo.layout,
        algo.policy,
        algo.reference_logp(batch),
    )
    count = sum(float(batch.valid.sum()) * t.n_agents for t in algo.layout.types)
    objective = algo.policy_update.objective
    terms = [objective(algo.policy.actors[k], mb, coef, count=count) for k, mb in units.items()]
    ref = _grpo_plain_terms(algo, batch, adv_ref)
    assert float(ref["kl"].detach()) > 10 * MUTATION_GAP  # the policy is away from its reference
    params = list(algo.policy.parameters())
    mutants = {"policy": _grpo_mutants(algo, batch, adv_ref), "kl": {"KL times 0": 0.0}}
    for name in ("policy", "entropy", "kl"):
        got = sum(t[f"loss/{name}"] for t in terms)
        _assert_mutations_detected(
            float(got.detach()), float(ref[name].detach()), mutants.get(name, {})
        )
        _assert_grads_close(
            torch.autograd.grad(got, params, retain_graph=True, allow_unused=True),
            torch.autograd.grad(ref[name], params, retain_graph=True),
        )


def test_grpo_update_metrics_match_plain_recomputation():
    """``GRPO.update`` with one epoch and one minibatch reports that minibatch's terms before
    its step; they equal the plain recomputation (wiring of alpha, the clips, dual clip,
    ent_coef and kl_beta from the config).

    Catches: ``kl_coef`` not passed (KL times 0), mixing with 1 - alpha, clip_high used as
    clip_low, dual clip on every negative advantage."""
    algo, batch = _grpo_case()
    adv_ref = _grpo_reference_advantages(algo, batch, ALPHA)
    adv_mutant = _grpo_reference_advantages(algo, batch, 1 - ALPHA)
    with torch.no_grad():
        ref = _grpo_plain_terms(algo, batch, adv_ref)
        mutants = _grpo_mutants(algo, batch, adv_ref)
        mutants["mixing with 1 - alpha"] = float(
            _grpo_plain_terms(algo, batch, adv_mutant)["policy"]
        )
    metrics = algo.update(batch, 0.0)
    _assert_mutations_detected(metrics["loss/policy"], float(ref["policy"]), mutants)
    _assert_mutations_detected(metrics["loss/kl"], float(ref["kl"]), {"KL times 0": 0.0})
    assert metrics["loss/entropy"] == pytest.approx(float(ref["entropy"]), rel=RTOL)
    assert metrics["kl_ref"] == pytest.approx(float(ref["kl_ref"]), rel=1e-4)
