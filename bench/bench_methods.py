"""What each entropy-control method adds to the advantage step, against the GRPO-ds twin's (the ``stare`` estimator
with W = M = 1, which every method's run pays anyway): the method's ``advantage`` plus the shared
``entropy_control/*`` metrics, paired medians on CPU tensors (as verl's driver holds them), 30% padding.

Sizes: the CPU short-CoT recipe's batch (64 x 48) and a GPU-scale batch (512 x 8192). The second column puts the
added time against a training step: 3.5 s for the CPU recipe (short CoT on 2 cores, generation + log-probs +
update) and, for 512 x 8192, a conservative 60 s step of a 1.5-7B model. Target: every method adds at most 10% to
a step. The methods acting in verl's loss (entropy bonus, Clip-Cov, KL-Cov, the adaptive coefficient's
entropy in the update) cost inside the actor's update: that shows in ``s / step`` of ``make compare``'s table.
"""

import statistics
import time

import numpy as np
import torch

from stare_verl.methods import METHODS, parse_method_spec
from stare_verl.methods.metrics import entropy_dynamics

SIZES = [((64, 48), 3.5), ((512, 8192), 60.0)]
GROUP, REPEATS = 8, 5
TARGET_SHARE = 0.10


def make_batch(b: int, t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, int(0.4 * t)), t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(b, t)
    rewards[torch.arange(b), lengths - 1] = torch.randint(0, 2, (b,), generator=g).float()
    logp = -torch.rand(b, t, generator=g).pow(3) * 6.0
    ent = torch.rand(b, t, generator=g) * 0.3
    uid = np.array([f"q{i // GROUP}" for i in range(b)], dtype=object)
    return rewards, mask, uid, logp, ent


def step_time(spec: str, batch, algo) -> float:
    rewards, mask, uid, logp, ent = batch
    method = parse_method_spec(spec)
    if method.estimator is None:  # runs as the twin in the trainer
        method = parse_method_spec("stare:reweight_w=1.0,reweight_m=1.0")
    t0 = time.perf_counter()
    metrics: dict = {}
    base, eff = method.advantage(rewards, mask, uid, algo, logp, ent, metrics)
    entropy_dynamics(base, eff, mask, logp, ent)
    return time.perf_counter() - t0


def main() -> None:
    algo = {"norm_adv_by_std_in_grpo": True, "stare": {"target_entropy": 1.0}}
    print(f"{'size':>12} {'method':>18} {'median ms':>10} {'added ms':>9} {'of a step':>9}")
    worst = 0.0
    for (b, t), step_s in SIZES:
        batch = make_batch(b, t)
        specs = {name: name for name in METHODS}
        specs["stare"] = "stare:target_entropy=1.0"  # the gate on: the reweighting path is timed
        times = {name: [] for name in specs}
        for spec in specs.values():  # warm-up: first-call imports and allocations are not a step's cost
            step_time(spec, batch, algo)
        for _ in range(REPEATS):  # paired: every method once per round
            for name, spec in specs.items():
                times[name].append(step_time(spec, batch, algo))
        base = statistics.median(times["grpo"])
        for name in specs:
            med = statistics.median(times[name])
            added = max(0.0, med - base)
            share = added / step_s
            worst = max(worst, share)
            print(f"{b:>5} x {t:<5} {name:>18} {med * 1e3:>10.2f} {added * 1e3:>9.2f} {share:>9.2%}")
    verdict = "ok" if worst <= TARGET_SHARE else "OVER TARGET"
    print(f"largest share of a step added by a method: {worst:.2%} (target <= {TARGET_SHARE:.0%}): {verdict}")


if __name__ == "__main__":
    main()
