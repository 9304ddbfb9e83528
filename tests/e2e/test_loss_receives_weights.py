"""Proof that STARE's weights reach the loss (issue 13 item 1), through verl's real V1 trainer on the CPU backend.

The launch is the session's shared STARE + loss-probe run (``stare_probe_run``, ``tests/support/stare_probe.py``):
2 ranks, each seeing its half of the batch of 16 in micro-batches of 4, gate forced on (target entropy 100 nats),
P = 0.25, one method setting per step: 1. O1, W = 3;  2. C2, W = 3, M = 0.5;  3. W = M = 1 (the GRPO-ds twin);
then forking tokens, the entropy advantage and the adaptive entropy coefficient.

The advantages are read where the actor's policy loss receives them (a registered policy loss that wraps
verl's vanilla loss), never from the estimator. The expectation is rebuilt from the step's rewards, uid,
mask and old log-probs: GRPO per group (verl's ``grpo_vectorized`` for the exact bits, and an independent
float64 computation), L+ / L- = the top ceil(P * n) surprisal tokens among A > 0 / A < 0 model tokens of the
*whole batch*.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_vectorized_outcome_advantage

from tests.support.stare_probe import ALPHA, COEF0, DELTA, KAPPA, N_STARE, PLAN, RHO, P


@pytest.fixture(scope="module")
def run(stare_probe_run):
    """The shared run's driver-side and loss-side records."""
    res = stare_probe_run
    assert res["error"] is None, res["error"]
    assert res["leaked"] == [] and res["still_alive"] == [], (
        f"processes left after main_ppo exited: {res['leaked']}"
    )
    return res["driver"], res["losses"]


def _key(log_probs: torch.Tensor, mask: torch.Tensor) -> tuple:
    return tuple(log_probs[mask].tolist())


def _reference_grpo(scores: np.ndarray, uid: list) -> np.ndarray:
    """Independent float64 GRPO (unbiased std + 1e-6; verl's singleton convention; equal rewards -> 0)."""
    out = np.zeros(len(scores))
    groups = defaultdict(list)
    for i, u in enumerate(uid):
        groups[u].append(i)
    for rows in groups.values():
        r = scores[rows]
        if len(rows) == 1:
            out[rows] = r / (1.0 + 1e-6)
        elif r.max() - r.min() <= 1e-5 * max(1.0, np.abs(r).max()):
            out[rows] = 0.0
        else:
            out[rows] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    return out


def _top_set(row_adv: np.ndarray, log_probs: torch.Tensor, mask: torch.Tensor, sign: int) -> set:
    """Top ceil(P * n) surprisal tokens among model tokens with the sign, over the whole batch (row, col)."""
    items = [
        (-float(log_probs[i, j]), i, j)
        for i in range(mask.shape[0])
        if (row_adv[i] > 0 if sign > 0 else row_adv[i] < 0)
        for j in range(mask.shape[1])
        if mask[i, j]
    ]
    k = math.ceil(round(P * len(items), 9))
    items.sort(key=lambda x: (-x[0], x[1], x[2]))
    return {(i, j) for _, i, j in items[:k]}


def _expected(d: dict):
    """Per driver row: key, verl's float32 GRPO row value, float64 reference value, and the weight per model
    token (in the order of the row's model tokens)."""
    mask = d["response_mask"] > 0
    lp = d["old_log_probs"]
    assert torch.isfinite(lp[mask]).all() and torch.isfinite(d["entropy"][mask]).all()
    rewards = d["rm_scores"] * mask
    uid = np.array(d["uid"], dtype=object)
    verl_adv, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask.float(), uid)
    scores = rewards.sum(-1).double().numpy()
    ref = _reference_grpo(scores, d["uid"])
    row_verl = np.where(ref == 0, 0.0, verl_adv[torch.arange(len(uid)), mask.float().argmax(-1)].numpy())
    stare = d["stare"]
    l_plus = _top_set(ref, lp, mask, +1) if stare["reweight_w"] != 1.0 else set()
    l_minus = _top_set(ref, lp, mask, -1) if stare["variant"] == "C2" else set()
    rows = []
    for i in range(mask.shape[0]):
        cols = mask[i].nonzero()[:, 0].tolist()
        weights = [
            stare["reweight_w"] if (i, j) in l_plus else stare.get("reweight_m", 1.0) if (i, j) in l_minus else 1.0
            for j in cols
        ]
        rows.append((_key(lp[i], mask[i]), float(row_verl[i]), float(ref[i]), np.array(weights)))
    return rows, len(l_plus), len(l_minus)


def _loss_rows(losses: list) -> dict:
    out = defaultdict(list)
    for rec in losses:
        mask = rec["response_mask"].bool()
        for i in range(mask.shape[0]):
            if mask[i].any():
                out[_key(rec["old_log_prob"][i], mask[i])].append(rec["advantages"][i][mask[i]])
    return out


@pytest.mark.parametrize("step", range(N_STARE), ids=["O1_W3", "C2_W3_M05", "W1_M1"])
def test_loss_receives_stare_advantages(run, step):
    driver, losses = run
    assert [d["step"] for d in driver] == list(range(len(PLAN)))
    d = driver[step]
    assert d["stare"] == PLAN[step]
    at_loss = _loss_rows(losses)
    rows, n_plus, n_minus = _expected(d)
    if PLAN[step]["reweight_w"] != 1.0:
        assert n_plus > 0
    if PLAN[step]["variant"] == "C2":
        assert n_minus > 0
    seen_plus = seen_minus = 0
    for key, row_verl, row_ref, weights in rows:
        got = at_loss.get(key)
        assert got, "a training row never reached the policy loss"
        assert len(got) == 1, "a row reached the loss more than once in one epoch"
        a = got[0]
        # what the loss got is the GRPO row value times the weight...
        np.testing.assert_allclose(a.double().numpy(), weights * row_ref, rtol=1e-5, atol=1e-7)
        # ...bit for bit: verl's float32 GRPO value, times float32(W or M) on the selected tokens only
        w32 = torch.tensor(weights, dtype=torch.float32)
        exact = torch.where(w32 == 1.0, torch.tensor(row_verl, dtype=torch.float32), torch.tensor(row_verl, dtype=torch.float32) * w32)
        assert torch.equal(a, exact)
        seen_plus += int(((w32 > 1) & (a != 0)).sum())
        seen_minus += int(((w32 < 1) & (a != 0)).sum())
    assert seen_plus == n_plus and seen_minus == n_minus
    if PLAN[step]["reweight_w"] == 1.0:
        assert seen_plus == 0 and seen_minus == 0


def test_every_loss_row_belongs_to_a_step(run):
    driver, losses = run
    keys = set()
    for d in driver:
        mask = d["response_mask"] > 0
        keys.update(_key(d["old_log_probs"][i], mask[i]) for i in range(mask.shape[0]))
    at_loss = _loss_rows(losses)
    assert set(at_loss) <= keys
    assert sum(len(v) for v in at_loss.values()) == sum(d["response_mask"].shape[0] for d in driver)


def _grpo_rows(d: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's model-token mask and its GRPO advantage per token (float64 reference), ``[B, T]``."""
    mask = d["response_mask"] > 0
    ref = _reference_grpo((d["rm_scores"] * mask).sum(-1).double().numpy(), d["uid"])
    return mask, torch.from_numpy(ref)[:, None].expand(mask.shape) * mask


def _step_losses(d: dict, losses: list) -> list[tuple[torch.Tensor, dict]]:
    """(row index, loss-side record) of each of the step's rows, found by their old log-probs."""
    mask = d["response_mask"] > 0
    rows = {_key(d["old_log_probs"][i], mask[i]): i for i in range(mask.shape[0]) if mask[i].any()}
    out = []
    for rec in losses:
        m = rec["response_mask"].bool()
        for j in range(m.shape[0]):
            i = rows.get(_key(rec["old_log_prob"][j], m[j]))
            if i is not None:
                out.append((i, rec["advantages"][j][m[j]], rec))
    assert len(out) == len(rows), "a training row never reached the policy loss, or reached it twice"
    return out


def test_loss_receives_forking_token_advantages(run):
    """80/20: the loss gets the GRPO advantage on the top ceil(rho * n) entropy model tokens of the batch, 0 on
    the rest."""
    driver, losses = run
    d = driver[N_STARE]
    assert d["stare"] == PLAN[N_STARE]
    mask, grpo = _grpo_rows(d)
    ent = d["entropy"]
    n = int(mask.sum())
    k = math.ceil(RHO * n)
    threshold = torch.sort(ent[mask], descending=True).values[k - 1]
    expected = torch.where(mask & (ent >= threshold), grpo, torch.zeros_like(grpo))
    kept = 0
    for i, a, _ in _step_losses(d, losses):
        np.testing.assert_allclose(a.double().numpy(), expected[i][mask[i]].numpy(), rtol=1e-5, atol=1e-7)
        kept += int((expected[i][mask[i]] != 0).sum())
    assert 0 < kept <= k


def test_loss_receives_entropy_advantages(run):
    """Cheng et al.: the loss gets A + min(alpha * H, abs(A) / kappa) on every model token."""
    driver, losses = run
    d = driver[N_STARE + 1]
    mask, grpo = _grpo_rows(d)
    expected = grpo + torch.minimum(ALPHA * d["entropy"].double(), grpo.abs() / KAPPA) * mask
    changed = 0
    for i, a, _ in _step_losses(d, losses):
        np.testing.assert_allclose(a.double().numpy(), expected[i][mask[i]].numpy(), rtol=1e-5, atol=1e-6)
        changed += int((expected[i][mask[i]] != grpo[i][mask[i]]).sum())
    assert changed > 0


def test_loss_runs_with_the_adaptive_entropy_coefficient_of_its_step(run):
    """Adaptive entropy: H < target, so the coefficient rises by delta and the loss of that step (only) runs with
    it; every other step's loss keeps the recipe's entropy_coeff of 0. The advantage is plain GRPO."""
    driver, losses = run
    d = driver[N_STARE + 2]
    mask, grpo = _grpo_rows(d)
    for i, a, rec in _step_losses(d, losses):
        assert rec["entropy_coeff"] == pytest.approx(COEF0 + DELTA)
        np.testing.assert_allclose(a.double().numpy(), grpo[i][mask[i]].numpy(), rtol=1e-5, atol=1e-7)
    for other in driver[: N_STARE + 2]:
        assert {rec["entropy_coeff"] for _, _, rec in _step_losses(other, losses)} == {0.0}
