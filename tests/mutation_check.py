"""Mutation check of the update: plant each known bug in the working tree, run the default
(not slow) tests of the update, restore the file, and say whether the tests caught it.

    .venv/bin/python tests/mutation_check.py            # every mutant
    .venv/bin/python tests/mutation_check.py kl_times_zero,entropy_sign [TEST FILES...]

Each mutant is one exact text replacement in the library (the bugs tests/test_update_reference.py
was written against, plus dropped gradient clipping and a flipped entropy sign). A mutant
whose text is not found stops the check (the code moved: update the mutant). Exit status 1
when any mutant survives. The file is restored even when interrupted; do not commit while it
runs. Not collected by pytest (its name does not start with ``test_``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

MUTANTS = {
    "mix_1_minus_alpha": (
        "marl/algos/mappo.py",
        "raw = self.cfg.alpha * team + (1 - self.cfg.alpha) * individual",
        "raw = (1 - self.cfg.alpha) * team + self.cfg.alpha * individual",
    ),
    "clip_low_high_swapped": (
        "marl/core/losses.py",
        "surr2 = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages",
        "surr2 = ratio.clamp(1.0 - clip_high, 1.0 + clip_low) * advantages",
    ),
    "value_clip_dropped": (
        "marl/core/losses.py",
        "err = torch.max(err, (clipped - returns) ** 2)",
        "err = err",
    ),
    "dual_clip_every_negative": (
        "marl/core/losses.py",
        "active = neg & (surr < bound)\n    return torch.where(neg, torch.max(surr, bound), surr)",
        "active = neg\n    return torch.where(neg, bound, surr)",
    ),
    "kl_times_zero": (
        "marl/algos/grpo.py",
        'return {"loss/kl": kl_coef * per_run_sum(k3 * mask, count) / count}',
        'return {"loss/kl": 0.0 * kl_coef * per_run_sum(k3 * mask, count) / count}',
    ),
    "clip_frac_any_sign": (
        "marl/core/losses.py",
        '"clip_frac_low": ((ratio < 1.0 - clip_low) & (advantages < 0)).float(),',
        '"clip_frac_low": (ratio < 1.0 - clip_low).float(),',
    ),
    "grad_clip_dropped": (
        "marl/algos/ppo.py",
        "return clip_grads_per_seed_(grads, self.max_grad_norm)",
        "return clip_grads_per_seed_(grads, None)",
    ),
    "entropy_sign": (
        "marl/algos/ppo.py",
        '"loss/entropy": -coef.ent_coef * entropy_sum / count,',
        '"loss/entropy": coef.ent_coef * entropy_sum / count,',
    ),
}
os.chdir(Path(__file__).resolve().parent.parent)  # the paths below are the repository's
TESTS = sys.argv[2:] or [
    "tests/test_update_reference.py",
    "tests/test_mappo.py",
    "tests/test_grpo.py",
    "tests/test_objectives.py",
    "tests/test_policy_objective.py",
]
survived = []
for name in sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] != "all" else MUTANTS:
    path, old, new = MUTANTS[name]
    src = Path(path).read_text()
    if src.count(old) != 1:
        sys.exit(f"mutant {name}: its text occurs {src.count(old)} times in {path}, not once")
    Path(path).write_text(src.replace(old, new))
    try:
        t = time.time()
        r = subprocess.run(
            [
                ".venv/bin/python",
                "-m",
                "pytest",
                "-q",
                "-x",
                "-m",
                "not slow",
                "-p",
                "no:cacheprovider",
                "-n",
                "2",
                *TESTS,
            ],
            capture_output=True,
            text=True,
        )
        last = [l for l in r.stdout.splitlines() if l.strip()][-1]
        caught = r.returncode != 0
        if not caught:
            survived.append(name)
        verdict = "caught" if caught else "SURVIVED"
        print(f"{name}: {verdict} ({last}) {time.time() - t:.0f}s", flush=True)
    finally:
        Path(path).write_text(src)
sys.exit(1 if survived else 0)
