"""STARE selection, gate and weights on hand-made batches.

Every test runs through each path of :func:`stare_verl.methods.stare.reweight.stare_reweight`: NumPy (CPU tensors), torch on
CPU tensors, and torch on CUDA tensors (marked ``gpu``, skipped without CUDA).
"""

import functools
import math

import numpy as np
import pytest
import torch

from stare_verl.methods.stare.config import StareConfig
from stare_verl.methods.stare.controller import StareController
from stare_verl.methods.stare.core import select_top_surprisal, top_count
from stare_verl.methods.stare.reweight import stare_reweight


def _on_cuda(fn):
    """``fn`` with its tensor arguments moved to CUDA and its result back on the CPU."""

    def wrapped(*args, **kwargs):
        args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
        out, metrics = fn(*args, **kwargs)
        assert out.device.type == "cuda"
        return out.cpu(), metrics

    return wrapped


@pytest.fixture(autouse=True, params=["numpy", "torch", pytest.param("cuda", marks=pytest.mark.gpu)])
def path(request, monkeypatch):
    """Run the test with ``stare_reweight`` bound to one path (NumPy, torch on CPU, torch on CUDA)."""
    impl = "torch" if request.param == "cuda" else request.param
    fn = functools.partial(stare_reweight, impl=impl)
    monkeypatch.setitem(globals(), "stare_reweight", _on_cuda(fn) if request.param == "cuda" else fn)
    return request.param


def _batch(seed=0, b=4, t=10, adv=(1.0, -1.0, 0.5, -0.5), mask=None):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g) * 5.0  # distinct surprisals
    m = torch.ones(b, t) if mask is None else mask
    a = torch.tensor(adv).unsqueeze(-1) * m
    return a, m, logp


def _expected_top(adv, mask, logp, p, sign):
    """Independent reference: sort (surprisal, flat index) in Python."""
    items = []
    b, t = adv.shape
    for i in range(b):
        for j in range(t):
            if mask[i, j] > 0 and (adv[i, j] > 0 if sign > 0 else adv[i, j] < 0):
                items.append((-float(logp[i, j]), i * t + j))
    k = math.ceil(round(p * len(items), 9))
    items.sort(key=lambda x: (-x[0], x[1]))
    return {idx for _, idx in items[:k]}


def _ratio_sets(out, adv):
    omega = torch.where(adv != 0, out / torch.where(adv != 0, adv, 1), torch.ones_like(adv))
    return omega


@pytest.mark.parametrize("entropies,gates", [([0.60, 0.40, 0.25, 0.15], [False, False, True, True])])
def test_case1_o1_gate_and_top10_positive(entropies, gates):
    ctrl = StareController(StareConfig())  # O1, P=0.1, W=1.1, target 0.3
    adv, mask, logp = _batch(b=4, t=25)
    for h, gate in zip(entropies, gates, strict=True):
        ent = torch.full_like(logp, h)
        out, met = stare_reweight(adv, mask, logp, ent, ctrl)
        assert met["stare/gate_on"] == float(gate)
        assert met["entropy_control/batch_entropy"] == pytest.approx(h)
        omega = _ratio_sets(out, adv).flatten()
        expected = _expected_top(adv, mask, logp, 0.1, +1)
        assert len(expected) == 5  # ceil(0.1 * 50)
        if gate:
            assert {i for i, w in enumerate(omega.tolist()) if w != 1.0} == expected
            assert all(omega[i].item() == pytest.approx(1.1) for i in expected)
        else:
            assert torch.equal(out, adv)


def test_case2_c2_gate_only_below_target():
    ctrl = StareController(StareConfig(variant="C2"))
    adv, mask, logp = _batch(b=4, t=25)
    for h, gate in zip([0.2, 0.5, 1.2, 2.0], [True, False, False, False], strict=True):
        out, met = stare_reweight(adv, mask, logp, torch.full_like(logp, h), ctrl)
        assert met["stare/gate_on"] == float(gate)
        omega = _ratio_sets(out, adv).flatten()
        if gate:
            plus, minus = _expected_top(adv, mask, logp, 0.1, +1), _expected_top(adv, mask, logp, 0.1, -1)
            assert {i for i, w in enumerate(omega.tolist()) if w > 1} == plus
            assert {i for i, w in enumerate(omega.tolist()) if w < 1} == minus
            assert omega[sorted(minus)].tolist() == pytest.approx([0.9] * len(minus))
            assert met["stare/frac_l_minus"] == pytest.approx(len(minus) / 100)
            assert met["stare/frac_l_plus"] == pytest.approx(len(plus) / 100)
            s_plus = [-float(logp.flatten()[i]) for i in plus]
            assert met["stare/surprisal_threshold_plus"] == pytest.approx(min(s_plus))
        else:
            assert torch.equal(out, adv)  # nothing amplified or damped at or above target
            assert met["stare/mean_weight"] == 1.0
            # the metrics report what was applied: no set selected with the gate off
            assert met["stare/frac_l_plus"] == met["stare/frac_l_minus"] == 0.0
            assert met["stare/surprisal_threshold_plus"] == met["stare/surprisal_threshold_minus"] == -1.0


def test_case3_padding_never_selected():
    mask = torch.tensor([[1, 1, 0, 0, 0, 0]], dtype=torch.float32)
    logp = torch.tensor([[-0.1, -2.0, -9, -9, -9, -9]])
    adv = torch.ones(1, 6) * mask
    ctrl = StareController(StareConfig(top_p_ratio=0.5))
    out, met = stare_reweight(adv, mask, logp, torch.zeros_like(logp), ctrl)
    assert out[0].tolist() == pytest.approx([1.0, 1.1, 0, 0, 0, 0])
    assert met["stare/surprisal_threshold_plus"] == pytest.approx(2.0)
    assert met["stare/frac_l_plus"] == 0.5


@pytest.mark.parametrize("sentinel", [1.0, float("-inf"), float("nan"), 50.0])
def test_case4_sentinels_at_masked_positions_change_nothing(sentinel):
    adv, _, logp = _batch(b=4, t=12)
    mask = torch.ones(4, 12)
    mask[:, 8:] = 0
    mask[1, 5:] = 0
    adv = adv * mask
    ent = torch.full_like(logp, 0.1)
    ref_out, ref_met = stare_reweight(adv, mask, logp, ent, StareController(StareConfig(variant="C2")))
    logp2, ent2 = logp.clone(), ent.clone()
    logp2[mask == 0] = sentinel
    ent2[mask == 0] = sentinel
    out, met = stare_reweight(adv, mask, logp2, ent2, StareController(StareConfig(variant="C2")))
    assert torch.equal(out, ref_out)
    for k in ("stare/surprisal_threshold_plus", "stare/surprisal_threshold_minus", "entropy_control/batch_entropy"):
        assert met[k] == ref_met[k]
    assert met["stare/nonfinite_tokens"] == 0
    assert (out[mask == 0] == 0).all()


def test_exact_count_with_ties_and_deterministic():
    s = np.array([[1.0, 2.0, 2.0, 2.0], [2.0, 0.5, 2.0, 3.0]])
    cand = np.ones(s.shape, dtype=bool)
    sel, thr = select_top_surprisal(-s, cand, 0.5)  # k = 4: 3.0 then the first three 2.0s in row-major order
    assert thr == 2.0
    assert sel.tolist() == [[False, True, True, True], [False, False, False, True]]
    sel2, _ = select_top_surprisal(-s, cand, 0.5)
    assert (sel == sel2).all()


def test_top_count_is_exact_ceil():
    assert top_count(0.1, 30) == 3  # naive float ceil(0.1 * 30) gives 4
    assert top_count(0.1, 31) == 4
    assert top_count(0.1, 0) == 0
    assert top_count(1.0, 7) == 7
    assert top_count(0.05, 1) == 1


def test_degenerate_batches_are_defined():
    ctrl = StareController(StareConfig())
    # all rewards equal -> A == 0 everywhere -> nothing selected, advantages zero
    zeros = torch.zeros(4, 5)
    out, met = stare_reweight(zeros, torch.ones(4, 5), -torch.rand(4, 5), torch.zeros(4, 5), ctrl)
    assert torch.equal(out, zeros) and met["stare/frac_l_plus"] == 0.0
    assert met["stare/surprisal_threshold_plus"] == -1.0
    # all rows with an empty mask -> gate off; the batch entropy is undefined (NaN, not a 0.0 that reads as a
    # collapse), every other metric is finite
    out, met = stare_reweight(zeros, torch.zeros(4, 5), torch.zeros(4, 5), torch.zeros(4, 5), ctrl)
    assert met["stare/gate_on"] == 0.0 and met["entropy_control/model_tokens"] == 0.0
    assert math.isnan(met.pop("entropy_control/batch_entropy"))
    assert all(math.isfinite(v) for v in met.values())
    # no A > 0 token at all, C2: L- still chosen, L+ empty
    adv = -torch.ones(2, 5)
    out, met = stare_reweight(
        adv,
        torch.ones(2, 5),
        -torch.arange(10.0).view(2, 5),
        torch.zeros(2, 5),
        StareController(StareConfig(variant="C2")),
    )
    assert met["stare/frac_l_plus"] == 0.0 and met["stare/frac_l_minus"] == pytest.approx(0.1)
    assert out[1, 4].item() == pytest.approx(-0.9) and (out.flatten()[:-1] == -1).all()


@pytest.mark.parametrize("b", [0, 3])
def test_empty_responses_are_defined(b):
    # T = 0 (every response empty) and B = 0: advantages returned unchanged, gate off, nothing selected
    ctrl = StareController(StareConfig(target_entropy=5.0, variant="C2"))
    for t in (0, 4) if b == 0 else (0,):
        adv = torch.zeros(b, t)
        out, met = stare_reweight(adv, torch.ones(b, t), torch.zeros(b, t), torch.zeros(b, t), ctrl)
        assert out.shape == (b, t) and met["stare/gate_on"] == 0.0 and met["entropy_control/model_tokens"] == 0.0
        assert met["stare/frac_l_plus"] == met["stare/frac_l_minus"] == 0.0 and met["entropy_control/cov_logp_adv"] == 0.0
    assert ctrl.steps == (2 if b == 0 else 1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_no_finite_token_leaves_the_gate_off_and_the_entropy_undefined(bad):
    # every model token's log-prob (or entropy) is non-finite: nothing enters the gate, nothing is reweighted
    adv, mask, logp = _batch(b=2, t=6, adv=(1.0, -1.0))
    ctrl = StareController(StareConfig(target_entropy=5.0, variant="C2"))
    for lp, ent in ((torch.full_like(logp, bad), torch.zeros_like(logp)), (logp, torch.full_like(logp, bad))):
        out, met = stare_reweight(adv, mask, lp, ent, ctrl)
        assert torch.equal(out, adv) and met["stare/gate_on"] == 0.0
        assert math.isnan(met["entropy_control/batch_entropy"]) and met["stare/nonfinite_tokens"] == 12.0
        assert met["stare/frac_l_plus"] == met["stare/frac_l_minus"] == 0.0


def test_nonfinite_tokens_ignored_and_counted():
    adv, mask, logp = _batch(b=2, t=10, adv=(1.0, -1.0))
    ent = torch.full_like(logp, 0.1)
    logp[0, 3] = float("nan")
    ent[0, 4] = float("inf")
    logp[1, 0] = float("-inf")
    ctrl = StareController(StareConfig())
    out, met = stare_reweight(adv, mask, logp, ent, ctrl)
    assert met["stare/nonfinite_tokens"] == 3
    assert torch.isfinite(out).all()
    assert out[0, 3] == adv[0, 3] and out[0, 4] == adv[0, 4]
    # the gate's entropy ignores the inf
    assert met["entropy_control/batch_entropy"] == pytest.approx(0.1)
    # 8 valid positive tokens -> exactly one selected
    assert int((out != adv).sum()) == 1


def test_permutation_invariance():
    adv, mask, logp = _batch(b=6, t=16, adv=(1.0, -1.0, 0.3, 0.0, 2.0, -0.4))
    mask[2, 10:] = 0
    adv = adv * mask
    ent = torch.full_like(logp, 0.1)
    cfg = StareConfig(variant="C2", top_p_ratio=0.2)
    out, _ = stare_reweight(adv, mask, logp, ent, StareController(cfg))
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    out_p, _ = stare_reweight(adv[perm], mask[perm], logp[perm], ent[perm], StareController(cfg))
    assert torch.equal(out_p, out[perm])


def test_chunk_scope_equals_selection_per_part():
    adv, mask, logp = _batch(b=4, t=20)
    ent = torch.full_like(logp, 0.1)
    out_chunk, _ = stare_reweight(
        adv, mask, logp, ent, StareController(StareConfig(scope="chunk", chunk_size=2))
    )
    parts = [
        stare_reweight(
            adv[i : i + 2], mask[i : i + 2], logp[i : i + 2], ent[i : i + 2], StareController(StareConfig())
        )[0]
        for i in (0, 2)
    ]
    assert torch.equal(out_chunk, torch.cat(parts))
    out_batch, _ = stare_reweight(adv, mask, logp, ent, StareController(StareConfig()))
    assert not torch.equal(out_chunk, out_batch)  # 2+2 selected per chunk vs 4 over the batch


def test_adaptive_schedule_moves_and_clips():
    cfg = StareConfig(variant="C2", adaptive=True, alpha=0.2, w_max=1.5, m_min=0.5)
    ctrl = StareController(cfg)
    ws, ms = [], []
    for h in [0.1, 0.1, 0.1, 0.1, 0.5, 0.5]:
        d = ctrl.step(h)
        ws.append(round(d.w, 6))
        ms.append(round(d.m, 6))
    assert ws == [1.3, 1.5, 1.5, 1.5, 1.3, 1.1]
    assert ms == [0.7, 0.5, 0.5, 0.5, 0.7, 0.9]
    restored = StareController(cfg)
    restored.load_state_dict(ctrl.state_dict())
    assert (restored.w, restored.m, restored.steps) == (ctrl.w, ctrl.m, 6)
    assert restored.step(0.1) == ctrl.step(0.1)
    with pytest.raises(ValueError, match="version"):
        restored.load_state_dict({"version": 99})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_log_probs_and_entropy(dtype):
    """verl's default mixed precision hands bf16 log-probs/entropy to the estimator."""
    adv, mask, logp = _batch(b=4, t=25)
    ent = torch.full_like(logp, 0.1)
    ref, ref_met = stare_reweight(
        adv, mask, logp.to(dtype).float(), ent.to(dtype).float(), StareController(StareConfig())
    )
    out, met = stare_reweight(adv, mask.long(), logp.to(dtype), ent.to(dtype), StareController(StareConfig()))
    assert out.dtype == adv.dtype and torch.equal(out, ref)
    assert met == ref_met


def test_resume_uses_the_configured_weights_unless_adaptive():
    """Without the adaptive schedule W and M are configuration: a run resumed with a new reweight_w/m uses it
    (only the step count comes from the checkpoint); with it, the saved W/M are restored within the clips."""
    saved = StareController(StareConfig(reweight_w=1.1)).state_dict() | {"steps": 7}
    fixed = StareController(StareConfig(variant="C2", reweight_w=1.5, reweight_m=0.5))
    fixed.load_state_dict(saved)
    assert (fixed.w, fixed.m, fixed.steps) == (1.5, 0.5, 7)
    d = fixed.step(0.01)
    assert (d.w, d.m, fixed.steps) == (1.5, 0.5, 8)
    adaptive = StareController(StareConfig(variant="C2", adaptive=True, w_max=1.3, m_min=0.7))
    adaptive.load_state_dict(saved | {"w": 1.45, "m": 0.6})
    assert (adaptive.w, adaptive.m) == (1.3, 0.7)  # clipped into this run's schedule
    adaptive.load_state_dict(saved | {"w": 1.2, "m": 0.8})
    assert (adaptive.w, adaptive.m, adaptive.steps) == (1.2, 0.8, 7)


@pytest.mark.parametrize(
    "bad",
    [{"w": float("nan")}, {"w": -3.0}, {"m": 0.0}, {"w": "inf"}, {"m": "x"}, {"steps": -1}, {"w": None}],
)
def test_a_corrupt_controller_state_is_refused(bad):
    state = StareController(StareConfig()).state_dict() | bad
    ctrl = StareController(StareConfig(adaptive=True))
    with pytest.raises(ValueError):
        ctrl.load_state_dict(state)
    assert (ctrl.w, ctrl.m, ctrl.steps) == (1.1, 0.9, 0)  # untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_inplace_reweights_our_copy_only_when_allowed(path, dtype):
    """``inplace=False`` (the default) never writes into the caller's advantages; ``inplace=True`` (the estimator's
    own tensor) gives the same values, in ``advantages`` itself where the NumPy path holds a view of it."""
    adv, mask, logp = _batch(b=4, t=25)
    adv = adv.to(dtype)
    ent = torch.full_like(logp, 0.01)  # below the default target: gate on
    cfg = StareConfig(variant="C2", reweight_w=3.0, reweight_m=0.5)
    before = adv.clone()
    ref, ref_met = stare_reweight(adv, mask, logp, ent, StareController(cfg))
    assert torch.equal(adv, before)
    assert ref_met["stare/gate_on"] == 1.0 and not torch.equal(ref.to(dtype), before)
    out, met = stare_reweight(adv, mask, logp, ent, StareController(cfg), inplace=True)
    assert torch.equal(out, ref) and met == ref_met
    view = path == "numpy" and dtype != torch.bfloat16  # bf16 is widened into a copy
    assert torch.equal(adv, out.to(dtype) if view else before)
