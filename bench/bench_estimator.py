"""Median time of the `stare` estimator vs verl's `grpo_vectorized` on one 512 x 8192 batch, 30% padding.

Target (issue 2): ratio <= 15 on a 2-core CPU. The gate is forced on (entropy below target) so the
reweighting path is timed, for variant O1 (default) and C2.
"""

import statistics
import time

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_grpo_vectorized_outcome_advantage

from stare_verl.estimator import compute_stare_advantage

B, T, GROUP, REPEATS = 512, 8192, 8, 15


def make_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # 30% padding on average: lengths uniform in [0.4 T, T]
    lengths = torch.randint(int(0.4 * T), T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = torch.randint(0, 2, (B,), generator=g).float()
    logp = -torch.rand(B, T, generator=g).pow(3) * 6.0
    ent = torch.rand(B, T, generator=g) * 0.3
    uid = np.array([f"q{i // GROUP}" for i in range(B)], dtype=object)
    return rewards, mask, uid, logp, ent


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def paired_ms(base, other) -> tuple[float, float, float]:
    """Median ms of ``base`` and ``other`` timed alternately (so background load hits both alike), and the
    median of the per-pair ratios."""
    base(), other()  # warm-up
    pairs = [(_time(base), _time(other)) for _ in range(REPEATS)]
    return (
        statistics.median(b for b, _ in pairs) * 1e3,
        statistics.median(o for _, o in pairs) * 1e3,
        statistics.median(o / b for b, o in pairs),
    )


def main() -> None:
    rewards, mask, uid, logp, ent = make_batch()
    print(f"batch {B} x {T}, padding {1 - mask.mean().item():.1%}, torch threads {torch.get_num_threads()}")
    for variant in ("O1", "C2"):
        algo = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "stare": {"variant": variant}})
        grpo, stare, ratio = paired_ms(
            lambda: compute_grpo_vectorized_outcome_advantage(rewards, mask, uid),
            lambda algo=algo: compute_stare_advantage(
                rewards, mask, uid, algo, old_log_probs=logp, entropys=ent
            ),
        )
        print(
            f"grpo_vectorized {grpo:7.1f} ms | stare ({variant}) {stare:7.1f} ms | ratio {ratio:5.1f} (target <= 15)"
        )


if __name__ == "__main__":
    main()
