"""Entropy-dynamics metrics (issue 13 item 2): Cov(log pi, A) over model tokens, before and after STARE's
reweighting, and its quadrant contributions, checked against a brute-force computation."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from stare_verl.methods.metrics import QUADRANTS
from stare_verl.methods.stare import compute_stare_advantage
from stare_verl.methods.stare.config import StareConfig
from stare_verl.methods.stare.controller import StareController
from stare_verl.methods.stare.reweight import stare_reweight


def _batch(b=12, t=20, seed=0, nonfinite=False, ent_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, t, generator=g) > 0.2).float()
    row = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0, 2.0, -2.0, 1.0, 1.0, -1.0, 0.0][:b])
    adv = row.unsqueeze(-1) * mask
    lp = -torch.rand(b, t, generator=g) * 4
    ent = torch.rand(b, t, generator=g) * ent_scale
    if nonfinite:
        lp[0, 3] = float("nan")  # a model token: dropped from everything
        lp[mask == 0] = float("-inf")  # sentinels off the mask
        ent[2, 1] = float("inf")
    return adv, mask, lp, ent


def _brute(adv, mask, lp, ent):
    """Independent float64 reference: covariance and the five class sums over valid model tokens."""
    valid = (mask > 0) & torch.isfinite(lp) & torch.isfinite(ent)
    h = ent[valid].double().mean().item()
    x, a = lp[valid].double(), adv[valid].double()
    prod = (x - x.mean()) * (a - a.mean())
    s = -x
    classes = {
        "pos_high": (a > 0) & (s > h),
        "pos_low": (a > 0) & (s <= h),
        "neg_high": (a < 0) & (s > h),
        "neg_low": (a < 0) & (s <= h),
        "zero_adv": a == 0,
    }
    return prod.mean().item(), {q: prod[c].sum().item() / len(x) for q, c in classes.items()}


@pytest.mark.parametrize(
    ("nonfinite", "ent_scale"),
    [(False, 1.0), (True, 1.0), (False, 7.5)],
    # entropy x 7.5: H_batch ~3.7 nats, so part of L+/L- is below it (the sums' per-token high/low split)
    ids=["finite", "nonfinite", "selected_low"],
)
@pytest.mark.parametrize(
    "cfg",
    [
        StareConfig(target_entropy=10.0, reweight_w=3.0, variant="C2", reweight_m=0.5, top_p_ratio=0.3),
        StareConfig(target_entropy=10.0, reweight_w=1.5, top_p_ratio=0.2),
    ],
    ids=["C2", "O1"],
)
def test_covariance_and_quadrants_match_brute_force(cfg, nonfinite, ent_scale):
    adv, mask, lp, ent = _batch(nonfinite=nonfinite, ent_scale=ent_scale)
    out, m = stare_reweight(adv, mask, lp, ent, StareController(cfg))
    if ent_scale > 1:  # the case is what it says: some reweighted token has surprisal <= H_batch
        changed = (out != adv) & (mask > 0)
        assert bool((-lp[changed] <= m["entropy_control/batch_entropy"]).any())
    assert m["stare/gate_on"] == 1.0 and m["stare/frac_l_plus"] > 0
    for suffix, a in (("", adv), ("_eff", out)):
        cov, parts = _brute(a, mask, lp, ent)
        assert m[f"entropy_control/cov_logp_adv{suffix}"] == pytest.approx(cov, rel=1e-5, abs=1e-9)
        for q in QUADRANTS:
            assert m[f"entropy_control/cov_quadrant{suffix}/{q}"] == pytest.approx(parts[q], rel=1e-5, abs=1e-9), q
        total = m[f"entropy_control/cov_logp_adv{suffix}"]
        assert sum(m[f"entropy_control/cov_quadrant{suffix}/{q}"] for q in QUADRANTS) == pytest.approx(total, rel=1e-12)
    # (float32 row sums on the fast path: ~1e-7 relative)
    # reweighting L+ (high-surprisal, A > 0) by W > 1 lowers the covariance: entropy pushed up
    assert m["entropy_control/cov_logp_adv_eff"] < m["entropy_control/cov_logp_adv"]
    assert m["entropy_control/cov_quadrant_eff/pos_high"] < m["entropy_control/cov_quadrant/pos_high"]


@pytest.mark.parametrize(
    "cfg",
    [StareConfig(target_entropy=0.0), StareConfig(target_entropy=10.0, reweight_w=1.0, reweight_m=1.0, variant="C2")],
    ids=["gate_off", "w_m_one"],
)
def test_eff_equals_base_when_nothing_is_reweighted(cfg):
    adv, mask, lp, ent = _batch(seed=3)
    out, m = stare_reweight(adv, mask, lp, ent, StareController(cfg))
    assert torch.equal(out, adv)
    assert m["entropy_control/cov_logp_adv"] != 0.0
    for key in ["entropy_control/cov_logp_adv"] + [f"entropy_control/cov_quadrant/{q}" for q in QUADRANTS]:
        assert m[key.replace("entropy_control/cov_logp_adv", "entropy_control/cov_logp_adv_eff").replace("cov_quadrant/", "cov_quadrant_eff/")] == m[key]


def test_rewarding_confident_tokens_gives_positive_covariance():
    """The collapse pattern: the rewarded responses are the confident ones (high log-prob). Cov > 0 (entropy
    falls, dH ~ -eta Cov), carried by A > 0 low-surprisal and A < 0 high-surprisal tokens."""
    b, t = 8, 16
    mask = torch.ones(b, t)
    row = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
    adv = row.unsqueeze(-1) * mask
    g = torch.Generator().manual_seed(0)
    lp = torch.where(row[:, None] > 0, -0.05, -2.5) - 0.01 * torch.rand(b, t, generator=g)
    ent = torch.full((b, t), 0.5)
    _, m = stare_reweight(adv, mask, lp, ent, StareController(StareConfig(target_entropy=0.0)))
    assert m["entropy_control/cov_logp_adv"] > 1.0
    assert m["entropy_control/cov_quadrant/pos_low"] > 0 and m["entropy_control/cov_quadrant/neg_high"] > 0
    assert m["entropy_control/cov_quadrant/pos_high"] == 0.0 and m["entropy_control/cov_quadrant/neg_low"] == 0.0


def test_no_valid_token_gives_zeros():
    adv, mask, lp, ent = _batch()
    _, m = stare_reweight(adv * 0, mask * 0, lp, ent, StareController(StareConfig()))
    assert m["entropy_control/cov_logp_adv"] == 0.0 and m["entropy_control/cov_logp_adv_eff"] == 0.0
    assert all(m[f"entropy_control/cov_quadrant/{q}"] == 0.0 for q in QUADRANTS)


def test_grpo_twin_reports_the_metrics():
    """The GRPO-ds twin (W = M = 1) logs the same metrics, eff == base."""
    g = torch.Generator().manual_seed(1)
    b, t = 16, 12
    rewards = torch.zeros(b, t)
    rewards[:, -1] = torch.randint(0, 2, (b,), generator=g).float()
    mask = torch.ones(b, t)
    uid = np.array([f"p{i // 4}" for i in range(b)], dtype=object)
    lp, ent = -torch.rand(b, t, generator=g) * 3, torch.rand(b, t, generator=g) * 0.2
    algo = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "stare": {"reweight_w": 1.0, "reweight_m": 1.0}})
    metrics = {}
    adv, _ = compute_stare_advantage(rewards, mask, uid, algo, old_log_probs=lp, entropys=ent, metrics=metrics)
    cov, _ = _brute(adv, mask, lp, ent)
    assert metrics["stare/gate_on"] == 1.0
    assert metrics["entropy_control/cov_logp_adv"] == pytest.approx(cov, rel=1e-5) and cov != 0
    assert metrics["entropy_control/cov_logp_adv_eff"] == metrics["entropy_control/cov_logp_adv"]


def test_a_token_at_exactly_minus_h_is_split_alike_on_both_paths():
    """H_batch = 0.2667 (not a float32); a token with log-prob float32(-H) is on the same side of the high/low split
    in the NumPy and the torch sums, base and reweighted."""
    ent = torch.tensor([[0.1, 0.2, 0.5], [0.1, 0.2, 0.5]])
    h = ent.double().mean().item()
    assert float(np.float32(-h)) < -h  # float32(-H) is high in float64, not in float32
    lp = torch.tensor([[-h, -1.0, -0.1], [-h, -2.0, -0.05]], dtype=torch.float32)
    mask = torch.ones(2, 3)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    cfg = StareConfig(target_entropy=10.0, reweight_w=2.0, variant="C2", reweight_m=0.5, top_p_ratio=1.0)
    _, m_np = stare_reweight(adv, mask, lp, ent, StareController(cfg), impl="numpy")
    _, m_t = stare_reweight(adv, mask, lp, ent, StareController(cfg), impl="torch")
    keys = [k for k in m_np if k.startswith("entropy_control/cov_")]
    assert len(keys) == 12
    for k in keys:
        assert m_np[k] == pytest.approx(m_t[k], rel=1e-6, abs=1e-9), k


@pytest.mark.parametrize("impl", ["numpy", "torch"])
def test_share_of_selected_tokens_above_their_own_entropy(impl):
    """stare/l_plus_above_entropy and l_minus_above_entropy: of the chosen tokens, the share whose surprisal exceeds
    the entropy of their own state (where STARE's first-order sign is certain), by hand on a small batch."""
    # row 0 (A > 0): surprisals 2.0, 0.1, 1.5 with entropies 1.0, 0.5, 3.0 -> above: yes, no, no
    # row 1 (A < 0): surprisals 3.0, 0.2, 0.7 with entropies 0.5, 0.1, 1.0 -> above: yes, yes, no
    lp = -torch.tensor([[2.0, 0.1, 1.5], [3.0, 0.2, 0.7]])
    ent = torch.tensor([[1.0, 0.5, 3.0], [0.5, 0.1, 1.0]])
    mask = torch.ones(2, 3)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    cfg = StareConfig(target_entropy=10.0, reweight_w=2.0, variant="C2", reweight_m=0.5, top_p_ratio=1.0)
    _, m = stare_reweight(adv, mask, lp, ent, StareController(cfg), impl=impl)
    assert m["stare/l_plus_above_entropy"] == pytest.approx(1 / 3)
    assert m["stare/l_minus_above_entropy"] == pytest.approx(2 / 3)
    # P = 0.34: ceil(0.34 * 3) = 2 highest surprisals per set: L+ {2.0 (above), 1.5 (not)}, L- {3.0, 0.7}
    cfg = StareConfig(target_entropy=10.0, reweight_w=2.0, variant="C2", reweight_m=0.5, top_p_ratio=0.34)
    _, m = stare_reweight(adv, mask, lp, ent, StareController(cfg), impl=impl)
    assert m["stare/l_plus_above_entropy"] == pytest.approx(0.5) and m["stare/l_minus_above_entropy"] == 0.5
    # gate off (target below the batch entropy) or O1 (no L-): -1
    _, m = stare_reweight(adv, mask, lp, ent, StareController(StareConfig(target_entropy=0.01)), impl=impl)
    assert m["stare/l_plus_above_entropy"] == -1.0 and m["stare/l_minus_above_entropy"] == -1.0
    _, m = stare_reweight(adv, mask, lp, ent, StareController(StareConfig(target_entropy=10.0)), impl=impl)
    assert m["stare/l_plus_above_entropy"] >= 0 and m["stare/l_minus_above_entropy"] == -1.0
