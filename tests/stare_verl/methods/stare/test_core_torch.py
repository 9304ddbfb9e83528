"""The torch path of STARE's selection (``stare_verl.methods.stare.core_torch``) equals the NumPy path (``stare_verl.methods.stare.core``)
bit for bit, ties at the threshold included, on CPU tensors here and on CUDA tensors where a GPU exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stare_verl.methods.stare import core, core_torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _inputs(seed: int, b: int = 24, t: int = 40, grid: float | None = None):
    """Advantages constant per row (some 0), ragged mask, log-probs (on a coarse grid: many ties), entropy."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    row_adv = torch.randint(-2, 3, (b,), generator=g).float() * 0.5
    adv = row_adv[:, None] * mask
    if grid is None:
        logp = -torch.rand(b, t, generator=g) * 5.0
    else:
        logp = -(torch.randint(0, 5, (b, t), generator=g).float() * grid)
    ent = torch.rand(b, t, generator=g) * 0.5
    return adv, mask, logp, ent


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grid", [None, 0.5])
@pytest.mark.parametrize("ratio", [0.1, 0.37, 1.0])
def test_select_top_surprisal_matches(device, grid, ratio):
    for seed in range(5):
        _, mask, logp, _ = _inputs(seed, grid=grid)
        cand = mask.numpy() > 0
        ref_sel, ref_thr = core.select_top_surprisal(logp.numpy(), cand, ratio)
        sel, thr = core_torch.select_top_surprisal(logp.to(device), torch.from_numpy(cand).to(device), ratio)
        assert sel.device.type == device
        assert np.array_equal(sel.cpu().numpy(), ref_sel), (seed, ratio)
        assert thr == ref_thr


@pytest.mark.parametrize("device", DEVICES)
def test_select_top_surprisal_tie_rule(device):
    """k = 4 of 8: 3.0, then the first three 2.0 surprisals in row-major order (core's own example)."""
    s = torch.tensor([[1.0, 2.0, 2.0, 2.0], [2.0, 0.5, 2.0, 3.0]], device=device)
    sel, thr = core_torch.select_top_surprisal(-s, torch.ones_like(s, dtype=torch.bool), 0.5)
    assert thr == 2.0
    assert sel.tolist() == [[False, True, True, True], [False, False, False, True]]
    empty, none = core_torch.select_top_surprisal(-s, torch.zeros_like(s, dtype=torch.bool), 0.5)
    assert none is None and not empty.any()


@pytest.mark.parametrize("device", DEVICES)
def test_token_masks_match(device):
    _, mask, logp, ent = _inputs(3)
    logp[2, 0], ent[5, 1], logp[7, 39] = float("nan"), float("inf"), float("-inf")
    ref = core.token_masks(mask.numpy(), logp.numpy(), ent.numpy())
    got = core_torch.token_masks(mask.to(device), logp.to(device), ent.to(device))
    assert np.array_equal(got.valid.cpu().numpy(), ref.valid)
    assert (got.n_model, got.n_valid) == (ref.n_model, ref.n_valid)
    assert got.entropy_sum == pytest.approx(ref.entropy_sum, rel=1e-6)
    with pytest.raises(ValueError, match="response_mask must be"):
        core_torch.token_masks(mask[0].to(device), logp[0].to(device), ent[0].to(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk", [None, 5])
@pytest.mark.parametrize("grid", [None, 0.5])
def test_sets_and_reweight_match(device, chunk, grid):
    for seed in range(4):
        adv, mask, logp, ent = _inputs(seed, grid=grid)
        masks = core.token_masks(mask.numpy(), logp.numpy(), ent.numpy())
        row = adv.numpy().sum(axis=1)
        ref_sets = [
            (core.select_token_set(row, logp.numpy(), masks.valid, 0.2, sign, chunk), w)
            for sign, w in ((+1, 1.1), (-1, 0.9))
        ]
        ref = core.reweight_advantages(adv.numpy(), ref_sets)
        valid = torch.from_numpy(masks.valid).to(device)
        sets = [
            (
                core_torch.select_token_set(
                    adv.to(device).sum(dim=1), logp.to(device), valid, 0.2, sign, chunk
                ),
                w,
            )
            for sign, w in ((+1, 1.1), (-1, 0.9))
        ]
        for (r, _), (s, _) in zip(ref_sets, sets, strict=True):
            assert (s.count, s.threshold) == (r.count, r.threshold)
        out = core_torch.reweight_advantages(adv.to(device), sets)
        assert out.device.type == device and out.dtype == adv.dtype
        assert np.array_equal(out.cpu().numpy(), ref), seed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("scope", ["batch", "chunk"])
def test_stare_reweight_paths_agree(device, variant, scope):
    """stare_reweight through torch (on ``device``) equals the NumPy path: advantages bit for bit, metrics equal
    up to summation order and precision, on ragged batches with ties at the thresholds."""
    from stare_verl.methods.stare.config import StareConfig
    from stare_verl.methods.stare.controller import StareController
    from stare_verl.methods.stare.reweight import stare_reweight

    cfg = StareConfig(variant=variant, top_p_ratio=0.15, target_entropy=5.0, scope=scope,
                      chunk_size=7 if scope == "chunk" else None)  # fmt: skip
    for seed in range(4):
        adv, mask, logp, ent = _inputs(seed, b=32, t=48, grid=0.5 if seed % 2 else None)
        ref, ref_met = stare_reweight(adv, mask, logp, ent, StareController(cfg), impl="numpy")
        args = [x.to(device) for x in (adv, mask, logp, ent)]
        out, met = stare_reweight(*args, StareController(cfg), impl="auto" if device == "cuda" else "torch")
        assert out.device.type == device
        assert ref_met["stare/gate_on"] == 1.0 and ref_met["stare/frac_l_plus"] > 0
        assert torch.equal(out.cpu(), ref), seed
        # sums (entropy, covariance classes) accumulate in float64 on the device, in float32 in NumPy
        assert met == pytest.approx(ref_met, rel=1e-5, abs=1e-6)
