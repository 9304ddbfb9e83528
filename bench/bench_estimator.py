"""Median time of the `stare` estimator vs verl's `grpo_vectorized`, 30% padding, gate forced on.

On CPU tensors (as verl's driver holds them), torch with 2 threads: sizes 512 x 8192 and 64 x 16384, variants O1
(default) and C2, the estimator called as the trainer calls it (with the run's controller, so the config is parsed
once per run, not once per call), the two timed alternately in one process (median of the per-pair ratios): target
ratio <= 3. Both sides run on torch's OpenMP threads (the estimator's compiled passes inside torch's own parallel
regions, stare_verl.methods.stare.omp), so both wait alike for a thread the machine's load holds up; the header prints
the load average. The ratio also depends on which side's freed [B, T] output the allocator returned to the kernel
(docs/results/estimator-speed.md). Where CUDA is available, sizes 512 x 8192 and 1024 x 16384 on CUDA tensors:
target <= 10 ms for 1024 x 16384. The gate is forced on (entropy below target) so the reweighting path is timed.

Also the cost of the entropy-dynamics metrics (Cov(log pi, A) and its quadrants, GRPO and effective
advantage): the estimator as shipped vs the same without the metrics, paired on CPU; target ratio <= 1.10.
"Without" replaces the covariance sums by zeros and the compiled log-prob pass (stare_verl.methods.stare.kernels, which also
gives the rows' high-surprisal counts and sums) by the pass the estimator needs anyway, the one that checks the
model tokens' log-probs are finite (an einsum row sum, as before the metrics existed). Both on the step-by-step
NumPy path (chunked scope and dtypes the fused path does not take): the fused whole-batch path
(stare_verl.methods.stare.fused) accumulates the metrics' sums inside its two passes, with no pass of their own.

What the CPU estimator reads and writes (compute_stare_advantage on CPU tensors, whole-batch scope): the rewards once
(row sums; the per-response GRPO advantages, no [B, T] GRPO advantages), pass A (the mask's padding, to find where
each response ends; log-probs, entropies and mask up to that end; the set rows' log-probs once more, from cache, for
the window copy), pass B (log-probs and mask, the entropies only of rows with a NaN or inf, and the [B, T] effective
advantages written once). verl's grpo_vectorized reads the rewards and the mask and writes one [B, T] tensor.
"""

import statistics
import time

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_grpo_vectorized_outcome_advantage

from stare_verl.methods.stare import compute_stare_advantage
from stare_verl.methods.stare.config import parse_stare_config
from stare_verl.methods.stare.controller import StareController

CPU_SIZES = [(512, 8192), (64, 16384)]
GPU_SIZES = [(512, 8192), (1024, 16384)]
CPU_THREADS = 2
GROUP, REPEATS = 8, 15
COV_TARGET_RATIO = 1.10
CPU_TARGET_RATIO, GPU_TARGET_MS = 3.0, 10.0


def make_batch(b: int, t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # 30% padding on average: lengths uniform in [0.4 T, T]
    lengths = torch.randint(int(0.4 * t), t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(b, t)
    rewards[torch.arange(b), lengths - 1] = torch.randint(0, 2, (b,), generator=g).float()
    logp = -torch.rand(b, t, generator=g).pow(3) * 6.0
    ent = torch.rand(b, t, generator=g) * 0.3
    uid = np.array([f"q{i // GROUP}" for i in range(b)], dtype=object)
    return rewards, mask, uid, logp, ent


def _time(fn, sync) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def paired_ms(base, other, sync=lambda: None) -> tuple[float, float, float]:
    """Median ms of ``base`` and ``other`` timed alternately (so background load hits both alike), and the
    median of the per-pair ratios."""
    base(), other()  # warm-up
    pairs = [(_time(base, sync), _time(other, sync)) for _ in range(REPEATS)]
    return (
        statistics.median(b for b, _ in pairs) * 1e3,
        statistics.median(o for _, o in pairs) * 1e3,
        statistics.median(o / b for b, o in pairs),
    )


def bench(device: str, b: int, t: int) -> None:
    rewards, mask, uid, logp, ent = (x.to(device) if torch.is_tensor(x) else x for x in make_batch(b, t))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for variant in ("O1", "C2"):
        algo = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "stare": {"variant": variant}})
        # as the trainer calls it (stare_verl.trainer): with the run's controller, its config parsed once per run
        controller = StareController(parse_stare_config(algo))
        grpo, stare, ratio = paired_ms(
            lambda: compute_grpo_vectorized_outcome_advantage(rewards, mask, uid),
            lambda algo=algo, controller=controller: compute_stare_advantage(
                rewards, mask, uid, algo, old_log_probs=logp, entropys=ent, controller=controller
            ),
            sync,
        )
        if device == "cpu":
            target = f"ratio {ratio:5.1f} (target <= {CPU_TARGET_RATIO:g})"
        elif (b, t) == GPU_SIZES[-1]:
            target = f"ratio {ratio:5.1f} (target: stare <= {GPU_TARGET_MS:g} ms)"
        else:
            target = f"ratio {ratio:5.1f}"
        print(
            f"{device:4s} {b:4d} x {t:5d} | grpo_vectorized {grpo:7.1f} ms | stare ({variant}) {stare:7.1f} ms | {target}",
            flush=True,
        )


def bench_covariance(b: int, t: int) -> None:
    """Paired time of the estimator with and without the covariance metrics (NumPy path, O1 and C2)."""
    from unittest import mock

    import stare_verl.methods.stare.fused as fused_mod
    import stare_verl.methods.stare.kernels as kernels_mod
    import stare_verl.methods.stare.reweight as stare_mod
    from stare_verl.methods.stare.core import CovarianceSums, _row_sum

    def no_cov(*args, **kwargs):
        z = np.zeros(5)
        return CovarianceSums(n=z, lp=z, adv=z, lp_adv=z)

    def finiteness_pass_only(log_probs, mask, threshold):
        zeros = np.zeros(log_probs.shape[0])
        return zeros, zeros, _row_sum(log_probs, mask)

    rewards, mask, uid, logp, ent = make_batch(b, t)
    for variant in ("O1", "C2"):
        algo = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "stare": {"variant": variant}})

        def run(algo=algo):
            with mock.patch.object(fused_mod, "supports", lambda *a: False):  # the step-by-step path
                return compute_stare_advantage(rewards, mask, uid, algo, old_log_probs=logp, entropys=ent)

        def run_without(algo=algo):
            with (
                mock.patch.object(stare_mod, "covariance_sums", no_cov),
                mock.patch.object(stare_mod, "reweighted_covariance_sums", no_cov),
                mock.patch.object(kernels_mod, "log_prob_row_stats", finiteness_pass_only),
            ):
                return run(algo)

        without, with_cov, ratio = paired_ms(run_without, run)
        print(
            f"cpu  {b:4d} x {t:5d} | stare ({variant}) without cov metrics {without:7.1f} ms | with {with_cov:7.1f} ms"
            f" | ratio {ratio:5.2f} (target <= {COV_TARGET_RATIO:g})",
            flush=True,
        )


def main() -> None:
    import os

    torch.set_num_threads(CPU_THREADS)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"padding ~30%, gate on, torch threads {torch.get_num_threads()}, CPUs {os.cpu_count()}, load average {load}, "
          f"CUDA {torch.cuda.is_available()}")  # fmt: skip
    for b, t in CPU_SIZES:
        bench("cpu", b, t)
    for b, t in CPU_SIZES:
        bench_covariance(b, t)
    if torch.cuda.is_available():
        for b, t in GPU_SIZES:
            bench("cuda", b, t)


if __name__ == "__main__":
    main()
