"""Reward scorer benchmark: throughput on typical responses and accuracy on a labelled set.

1. Throughput: 1,000 typical responses (reasoning text ending in a boxed integer, fraction or radical;
   half right, a third of the right ones in another written form such as \\dfrac or \\sqrt{12} for
   2\\sqrt{3}), scored one after another in one process (main thread) by
   - ours: ``envs.reward.compute_score`` (extraction, normalisation, fast numeric path, math-verify in
     a worker only where needed; workers started before timing),
   - plain math-verify: ``verify(parse("$gt$"), parse(response))`` on the whole response,
   - verl's ``math_dapo`` and ``math_reward`` scorers.
2. Accuracy on ``bench/data/labelled_answers.jsonl`` (>= 200 hand-labelled pairs, see
   ``bench/data/make_labelled_set.py``) for the same scorers and verl's ``math_verify`` scorer.

Target: ours >= 2,000 responses/s with math-verify's accuracy or better.
Run: python bench/bench_reward.py [--n 1000]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.reward import compute_score  # noqa: E402
from envs.scoring import clear_caches, prewarm  # noqa: E402

STEPS = [
    "First, we rewrite the condition as an equation in $x$ and move every term to one side.",
    "Substituting $y = 2x + 1$ into the second equation gives $x^2 + (2x+1)^2 = 25$.",
    "Expanding, $5x^2 + 4x - 24 = 0$, so by the quadratic formula $x = \\frac{-4 \\pm \\sqrt{496}}{10}$.",
    "Wait, let me double-check the discriminant: $16 + 480 = 496$, which is correct.",
    "However, only the positive root satisfies the constraint $x > 0$.",
    "We count the cases separately: there are $\\binom{5}{2} = 10$ ways for the first group.",
    "Alternatively, we can use complementary counting, which gives the same total.",
    "Let me verify by plugging the value back in: both sides equal $12$.",
    "The area of the triangle is $\\frac{1}{2} \\cdot 6 \\cdot 8 = 24$.",
    "By the Pythagorean theorem the hypotenuse is $\\sqrt{6^2 + 8^2} = 10$.",
    "Hmm, but we must also exclude the degenerate case where two points coincide.",
    "Taking the sum modulo $1000$ we obtain the remainder below.",
]


def _answer(rng: random.Random) -> tuple[str, str, str]:
    """(ground truth, right answer as written by the model, wrong answer)."""
    kind = rng.choice(["int", "frac", "rad"])
    if kind == "int":
        v = rng.randint(0, 999)
        right = rng.choice([str(v), str(v), f"{v:,}" if v >= 1000 else f"{v:03d}"])
        return str(v), right, str(v + rng.choice([-7, -1, 1, 3, 10]))
    if kind == "frac":
        p, q = rng.randint(1, 40), rng.randint(2, 41)
        while p % q == 0:
            q += 1
        gt = rf"\frac{{{p}}}{{{q}}}"
        right = rng.choice([gt, gt, rf"\dfrac{{{p}}}{{{q}}}", rf"\frac{{{2 * p}}}{{{2 * q}}}"])
        return gt, right, rf"\frac{{{q}}}{{{p + 1}}}"
    a, b = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7])
    gt = rf"{a}\sqrt{{{b}}}"
    right = rng.choice([gt, gt, rf"\sqrt{{{a * a * b}}}", rf"{a} \sqrt {b}"])
    return gt, right, rf"{a + 1}\sqrt{{{b}}}"


def typical_responses(n: int, seed: int = 0) -> list[tuple[str, str, bool]]:
    """``n`` (response, ground truth, correct?) triples of typical CoT responses (~1,000 characters)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        gt, right, wrong = _answer(rng)
        ok = rng.random() < 0.5
        body = " ".join(rng.choice(STEPS) for _ in range(rng.randint(6, 12)))
        ending = rng.choice(["Therefore, the final answer is $\\boxed{%s}$.", "**Final Answer**\n\\[\\boxed{%s}\\]"])
        out.append((body + "\n\n" + ending % (right if ok else wrong), gt, ok))
    return out


def _ours(resp: str, gt: str) -> bool:
    return bool(compute_score("bench", resp, gt)["acc"])


def _make_plain_math_verify():
    from math_verify import parse, verify

    def score(resp: str, gt: str) -> bool:
        try:
            return bool(verify(parse("$" + gt + "$"), parse(resp)))
        except Exception:  # noqa: BLE001
            return False

    return score


def _make_verl(name: str):
    import importlib

    mod = importlib.import_module(f"verl.utils.reward_score.{name}")

    def score(resp: str, gt: str) -> bool:
        try:
            r = mod.compute_score(resp, gt)
        except Exception:  # noqa: BLE001 - a crash counts as a miss
            return False
        if isinstance(r, dict):
            return bool(r.get("acc", r.get("score", 0) > 0))
        if isinstance(r, tuple):
            r = r[0]
        return float(r) > 0

    return score


def throughput(fn, data, limit_s: float = 60.0) -> tuple[float, float, int]:
    """(responses/s, accuracy vs the labels, n scored) for ``fn`` over ``data`` (stops after limit_s)."""
    t0 = time.perf_counter()
    hits = 0
    n = 0
    for resp, gt, ok in data:
        hits += fn(resp, gt) == ok
        n += 1
        if time.perf_counter() - t0 > limit_s:
            break
    dt = time.perf_counter() - t0
    return n / dt, hits / n, n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # math-verify logs every timeout / parse failure

    prewarm(wait_s=120)
    data = typical_responses(args.n)
    scorers = {"ours (envs.reward)": _ours, "plain math-verify": _make_plain_math_verify()}
    verl_ok = True
    try:
        scorers["verl math_dapo"] = _make_verl("math_dapo")
        scorers["verl math_reward"] = _make_verl("math_reward")
    except Exception as err:  # noqa: BLE001
        verl_ok = False
        print(f"(verl scorers unavailable: {err})")

    print(f"== Throughput: {args.n} typical responses, single process")
    print(f"{'scorer':24s} {'resp/s':>10s} {'acc vs label':>13s} {'n':>6s}")
    for name, fn in scorers.items():
        clear_caches()  # cold: no memoised normalisation / evaluation from earlier passes
        rate, acc, n = throughput(fn, data)
        print(f"{name:24s} {rate:10.0f} {acc:13.3f} {n:6d}")
    methods = Counter(compute_score("bench", r, g)["verify_method"] for r, g, _ in data)
    print("ours, decided by: " + ", ".join(f"{k} {v}" for k, v in methods.most_common()))

    rows = [json.loads(line) for line in (ROOT / "bench" / "data" / "labelled_answers.jsonl").read_text().splitlines()]
    slow = [(r["response"], r["ground_truth"], r["correct"]) for r in rows
            if r["category"] in ("symbolic", "interval", "tuple")]
    print(f"\n== Slow path: {len(slow)} labelled symbolic/interval/tuple answers (math-verify needed), single process")
    for name in ("ours (envs.reward)", "plain math-verify"):
        clear_caches()
        rate, acc, n = throughput(scorers[name], slow)
        print(f"{name:24s} {rate:10.0f} resp/s {acc:13.3f} {n:6d}")
    if verl_ok:
        try:
            scorers["verl math_verify"] = _make_verl("math_verify")
        except Exception as err:  # noqa: BLE001
            print(f"(verl math_verify scorer unavailable: {err})")
    print(f"\n== Accuracy on the labelled set: {len(rows)} pairs "
          f"({sum(r['correct'] for r in rows)} correct, {sum(not r['correct'] for r in rows)} wrong)")
    cats = sorted({r["category"] for r in rows})
    results = {}
    for name, fn in scorers.items():
        res = [fn(r["response"], r["ground_truth"]) == r["correct"] for r in rows]
        results[name] = res
        fp = sum(1 for r, ok in zip(rows, res, strict=True) if not ok and not r["correct"])
        fn_ = sum(1 for r, ok in zip(rows, res, strict=True) if not ok and r["correct"])
        print(f"{name:24s} accuracy {sum(res) / len(res):.3f}  (right answers marked wrong: {fn_}, "
              f"wrong answers marked right: {fp})")
    print("\nper category (accuracy):")
    print(f"{'category':16s}" + "".join(f"{n[:18]:>20s}" for n in scorers))
    for c in cats:
        idx = [i for i, r in enumerate(rows) if r["category"] == c]
        print(f"{c + f' ({len(idx)})':16s}" + "".join(
            f"{sum(results[n][i] for i in idx) / len(idx):20.2f}" for n in scorers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
