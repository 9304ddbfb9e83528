"""One STARE step on a batch: gate, token sets, weights and metrics (pure PyTorch).

Source: STARE steps 2-6 (``docs/stare.md``). The GRPO advantage (step 1) comes from the caller
(the group baseline, ``stare_verl.methods.group_baseline``) so that omega == 1 reproduces it bit for bit.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from stare_verl.methods.stare import core_torch
from stare_verl.methods.stare.controller import StareController
from stare_verl.methods.stare.core import (
    class_sums,
    covariance_sums,
    reweight_advantages,
    reweighted_covariance_sums,
    select_token_set,
    token_masks,
)


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU NumPy view (no copy for CPU float32/float64/int/bool tensors) of a detached tensor; bf16/fp16
    (verl's mixed precision) are widened to float32, which NumPy can hold."""
    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    return t.cpu().numpy()


def stare_reweight(
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    entropys: torch.Tensor,
    controller: StareController,
    impl: str = "auto",
    inplace: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Apply STARE's surprisal-guided reweighting to GRPO advantages, where the batch lives.

    CPU tensors go through NumPy (:mod:`stare_verl.methods.stare.core`), tensors on an accelerator through torch on
    that device (:mod:`stare_verl.methods.stare.core_torch`: selection on the device, only scalars copied to the host). Both give the same
    advantages bit for bit, ties at the threshold included, with one exception: the entropy sums (row sums then a
    float64 total here, a float64 sum there) may differ in their last bits (~1e-8 relative), so a batch entropy
    within that distance of the target can open the gate on one path and not the other.

    Args:
        advantages: ``[B, T]`` float, GRPO advantages (0 where ``response_mask`` is 0).
        response_mask: ``[B, T]`` (bool/int/float), 1 for model-generated tokens, 0 for padding and tool output.
        old_log_probs: ``[B, T]`` float, log-probs (nats) of the sampled tokens under the pre-update policy;
            surprisal is ``-old_log_probs``. Masked positions may hold any value (sentinels, NaN, inf).
        entropys: ``[B, T]`` float, per-token policy entropy (nats) from the same forward pass.
        controller: gate/schedule state; advanced by one step.
        impl: ``"auto"`` (by device, as above), ``"numpy"`` or ``"torch"`` (either path on any device; tests).
        inplace: the NumPy path may write the reweighted values into ``advantages`` (a CPU float32/float64
            tensor the caller owns, as :func:`stare_verl.methods.stare.method.compute_stare_advantage`'s): saves a
            ``[B, T]`` copy. The returned tensor is then ``advantages`` itself when the gate is on.

    Returns:
        ``(advantages_eff, metrics)``: ``[B, T]`` tensor ``omega * advantages`` (exactly 0 where the mask is 0),
        and metrics (floats). STARE's own, ``stare/*``: gate_on, w, m, frac_l_plus,
        frac_l_minus (share of model tokens reweighted: 0 with the gate off, when L+/L- are not selected),
        mean_weight, surprisal_threshold_plus/minus (nats; -1 when the set is empty or the gate is off),
        l_plus_above_entropy / l_minus_above_entropy (share of the set's tokens whose surprisal exceeds their own
        state's entropy, -1 when empty: only for those is the first-order sign of STARE's premise certain, since
        ``Phi = p_a (s_a - H) + C`` with ``C >= 0``; an L+ token with ``s_a < H`` is a rewarded mode token
        whose amplification may lower the entropy instead), nonfinite_tokens. The shared quantities it computes
        on the way, ``entropy_control/*`` (the names every method logs, so the trainer does not compute them
        again): batch_entropy (NaN when no model token has a finite log-prob and entropy: the gate stays off),
        target_entropy, model_tokens, and the entropy-dynamics metrics over valid model tokens (see
        ``core.CovarianceSums.terms``): ``cov_logp_adv`` = Cov(old log-prob, GRPO advantage),
        ``cov_logp_adv_eff`` = the same with ``advantages_eff`` (equal to the former when nothing is
        reweighted), and their contributions ``cov_quadrant[_eff]/{pos_high, pos_low, neg_high,
        neg_low, zero_adv}`` (A > 0 / A < 0 x surprisal above / at-or-below ``batch_entropy``, and A == 0),
        which sum to the covariance. Units: nats x advantage units; dH ~ -eta * Cov (Cui et al. 2025).

    Model tokens whose log-prob or entropy is NaN/inf are left out of the gate and the selection (their
    advantage is unchanged) and counted in ``stare/nonfinite_tokens``.

    Raises:
        ValueError: tensors are not all ``[B, T]`` of one shape, or an unknown ``impl``.
    """
    if advantages.shape != response_mask.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} vs response_mask {tuple(response_mask.shape)}"
        )
    if impl == "auto":
        impl = "numpy" if advantages.device.type == "cpu" else "torch"
    if impl == "torch":
        return _stare_reweight_torch(advantages, response_mask, old_log_probs, entropys, controller)
    if impl != "numpy":
        raise ValueError(f"impl must be auto, numpy or torch, got {impl!r}")
    cfg = controller.config
    adv_np, mask_np = _numpy(advantages), _numpy(response_mask)
    lp_np, ent_np = _numpy(old_log_probs), _numpy(entropys)
    from stare_verl.methods.stare import fused  # numba: imported by the processes that compute an advantage

    if (cfg.scope == "batch" or cfg.chunk_size >= adv_np.shape[0]) and fused.supports(adv_np, lp_np, ent_np, mask_np):
        return _stare_reweight_fused(advantages, adv_np, mask_np, lp_np, ent_np, controller, inplace)
    masks = token_masks(mask_np, lp_np, ent_np)
    decision = controller.step(masks.batch_entropy)
    chunk = cfg.chunk_size if cfg.scope == "chunk" else None
    # outcome advantages are constant along a row's model tokens: read each row at its first model token
    model = mask_np if mask_np.dtype == np.bool_ else mask_np > 0
    if model.shape[1] == 0:  # empty responses: no model token, every row's advantage is 0
        row_adv = np.zeros(model.shape[0], dtype=adv_np.dtype)
    else:
        row_adv = adv_np[np.arange(adv_np.shape[0]), model.argmax(axis=1)] * model.any(axis=1)
    cov_base = covariance_sums(row_adv, masks)
    cov_eff = cov_base
    w_eff, m_eff = 1.0, 1.0
    out = advantages
    l_plus, l_minus = None, None
    if decision.gate_on:  # with the gate off nothing is reweighted, so nothing is selected
        l_plus = select_token_set(row_adv, lp_np, masks.valid, cfg.top_p_ratio, +1, chunk)
        if cfg.variant == "C2":
            l_minus = select_token_set(row_adv, lp_np, masks.valid, cfg.top_p_ratio, -1, chunk)
        w_eff = decision.w
        sets = [(l_plus, w_eff)]
        if l_minus is not None:
            m_eff = decision.m
            sets.append((l_minus, m_eff))
        # _numpy gives a view of `advantages` (same memory) or a copy of ours, which may always be overwritten
        own = inplace or adv_np.ctypes.data != advantages.data_ptr()
        out = torch.from_numpy(reweight_advantages(adv_np, sets, inplace=own)).to(advantages.device)
        cov_eff = reweighted_covariance_sums(cov_base, row_adv, lp_np, sets, decision.batch_entropy)
    above = (_above_entropy_np(l_plus, lp_np, ent_np), _above_entropy_np(l_minus, lp_np, ent_np))
    return out, _metrics(cfg, decision, masks, l_plus, l_minus, w_eff, m_eff, cov_base, cov_eff, above)


def stare_reweight_rows(
    row_advantages: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    entropys: torch.Tensor,
    controller: StareController,
) -> tuple[torch.Tensor, dict[str, float]] | None:
    """:func:`stare_reweight` of the GRPO advantages ``row_advantages[:, None] * response_mask`` without
    materialising them (:func:`stare_verl.methods.stare.fused.fused_reweight_rows`): the same results, the
    effective advantages written once.

    Args:
        row_advantages: ``[B]`` per-response GRPO advantages in the dtype of the ``[B, T]`` advantages they stand
            for (``row_advantages[:, None] * response_mask`` in torch gives those advantages exactly).
        response_mask, old_log_probs, entropys, controller: as for :func:`stare_reweight`.

    Returns:
        As :func:`stare_reweight` (the effective advantages in a new ``[B, T]`` tensor), or None, with the
        controller not advanced, where this path does not apply: tensors off the CPU, chunked scope, or dtypes
        the fused path does not take (the caller then materialises the advantages and calls
        :func:`stare_reweight`).
    """
    cfg = controller.config
    if row_advantages.device.type != "cpu" or row_advantages.dtype not in (torch.float32, torch.float64):
        return None
    if any(t.device.type != "cpu" for t in (response_mask, old_log_probs, entropys)):
        return None
    adv_np, mask_np = _numpy(row_advantages), _numpy(response_mask)
    lp_np, ent_np = _numpy(old_log_probs), _numpy(entropys)
    from stare_verl.methods.stare import fused  # numba: imported by the processes that compute an advantage

    if not (cfg.scope == "batch" or cfg.chunk_size >= mask_np.shape[0]):
        return None
    if not fused.supports(adv_np, lp_np, ent_np, mask_np):
        return None
    decide, decisions = _decider(controller)
    out_np, step = fused.fused_reweight_rows(adv_np, mask_np, lp_np, ent_np, decide, cfg.top_p_ratio, cfg.variant)
    return torch.from_numpy(out_np), _fused_metrics(cfg, decisions[0], step)


def _decider(controller):
    """``(decide, decisions)``: the callback the fused path calls with the batch entropy (one controller step),
    and the list that receives that step's decision."""
    decisions = []

    def decide(batch_entropy):
        decisions.append(controller.step(batch_entropy))
        d = decisions[0]
        return d.gate_on, d.w, d.m

    return decide, decisions


def _stare_reweight_fused(advantages, adv_np, mask_np, lp_np, ent_np, controller, inplace):
    """The NumPy path for whole-batch scope in two compiled passes (:mod:`stare_verl.methods.stare.fused`)."""
    cfg = controller.config
    decide, decisions = _decider(controller)
    from stare_verl.methods.stare import fused

    # _numpy gives a view of `advantages` (same memory) or a copy of ours, which may always be overwritten
    own = inplace or adv_np.ctypes.data != advantages.data_ptr()
    out_np, step = fused.fused_reweight(adv_np, mask_np, lp_np, ent_np, decide, cfg.top_p_ratio, cfg.variant, own)
    decision = decisions[0]
    out = torch.from_numpy(out_np).to(advantages.device) if decision.gate_on else advantages
    return out, _fused_metrics(cfg, decision, step)


def _fused_metrics(cfg, decision, step) -> dict:
    """:func:`_metrics` of a fused step (:class:`stare_verl.methods.stare.fused.FusedStep`)."""
    l_plus, l_minus = step.sets
    w_eff = decision.w if decision.gate_on else 1.0
    m_eff = decision.m if l_minus is not None else 1.0
    above = tuple(-1.0 if s is None or s.count == 0 else s.above / s.count for s in (l_plus, l_minus))
    return _metrics(cfg, decision, step, l_plus, l_minus, w_eff, m_eff, step.cov_base, step.cov_eff, above)


def _above_entropy_np(selected, lp: np.ndarray, ent: np.ndarray) -> float:
    """Share of a selected set's tokens whose surprisal exceeds the entropy of their own state; -1 when empty."""
    if selected is None or selected.count == 0:
        return -1.0
    at = selected.positions  # flat [B * T] indices (cached): no copy of the selected rows
    s = -np.ravel(lp)[at].astype(np.float64)
    return float(np.count_nonzero(s > np.ravel(ent)[at].astype(np.float64)) / selected.count)


def _above_entropy_torch(selected, lp: torch.Tensor, ent: torch.Tensor) -> float:
    """:func:`_above_entropy_np` on tensors (``selected.selected`` is ``[B, T]``)."""
    if selected is None or selected.count == 0:
        return -1.0
    sel = selected.selected
    return float(((-lp[sel]).double() > ent[sel].double()).sum().item() / selected.count)


def _stare_reweight_torch(advantages, response_mask, old_log_probs, entropys, controller):
    """:func:`stare_reweight` with every ``[B, T]`` step on the tensors' device (:mod:`stare_verl.methods.stare.core_torch`);
    only scalars and ``[B]`` / ``[5]`` vectors reach the host."""
    cfg = controller.config
    lp, ent = _widen(old_log_probs.detach()), _widen(entropys.detach())
    adv = _widen(advantages.detach())
    mask = response_mask.detach()
    masks = core_torch.token_masks(mask, lp, ent)
    decision = controller.step(masks.batch_entropy)
    chunk = cfg.chunk_size if cfg.scope == "chunk" else None
    # outcome advantages are constant along a row's model tokens: read each row at its first model token
    model = (mask if mask.dtype == torch.bool else mask > 0).to(torch.uint8)
    if model.shape[1] == 0:  # empty responses: no model token, every row's advantage is 0
        row_adv = adv.new_zeros(model.shape[0])
    else:
        first = model.argmax(dim=1, keepdim=True)
        row_adv = adv.gather(1, first).squeeze(1) * model.amax(dim=1).to(adv.dtype)
    row_adv_np = row_adv.double().cpu().numpy()
    cov_base = class_sums(
        row_adv_np, *core_torch.covariance_row_stats(lp, masks.valid, decision.batch_entropy)
    )
    cov_eff = cov_base
    w_eff, m_eff = 1.0, 1.0
    out = advantages
    l_plus, l_minus = None, None
    if decision.gate_on:
        l_plus = core_torch.select_token_set(row_adv, lp, masks.valid, cfg.top_p_ratio, +1, chunk)
        w_eff = decision.w
        sets = [(l_plus, w_eff)]
        if cfg.variant == "C2":
            l_minus = core_torch.select_token_set(row_adv, lp, masks.valid, cfg.top_p_ratio, -1, chunk)
            m_eff = decision.m
            sets.append((l_minus, m_eff))
        out = core_torch.reweight_advantages(adv, sets)
        d_adv, d_lp_adv = core_torch.reweighted_class_deltas(row_adv, lp, sets, decision.batch_entropy)
        cov_eff = dataclasses.replace(cov_base, adv=cov_base.adv + d_adv, lp_adv=cov_base.lp_adv + d_lp_adv)
    above = (_above_entropy_torch(l_plus, lp, ent), _above_entropy_torch(l_minus, lp, ent))
    return out, _metrics(cfg, decision, masks, l_plus, l_minus, w_eff, m_eff, cov_base, cov_eff, above)


def _widen(t: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 (verl's mixed precision) as float32, as :func:`_numpy` does for the NumPy path."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def _metrics(cfg, decision, masks, l_plus, l_minus, w_eff: float, m_eff: float, cov_base, cov_eff,
             above: tuple[float, float] = (-1.0, -1.0)) -> dict:  # fmt: skip
    """The metrics of one step (see :func:`stare_reweight`), from either path's masks and sets: STARE's own
    (``stare/*``) and the shared quantities it computes anyway (``entropy_control/*``)."""
    n_plus = l_plus.count if l_plus is not None else 0
    n_minus = l_minus.count if l_minus is not None else 0
    n = max(masks.n_model, 1)
    metrics = {
        "stare/gate_on": float(decision.gate_on),
        # NaN, not 0.0, when no model token has a finite log-prob and entropy: 0.0 would read as a collapse
        "entropy_control/batch_entropy": decision.batch_entropy if decision.batch_entropy is not None else math.nan,
        "entropy_control/target_entropy": cfg.target_entropy,
        "stare/w": decision.w,
        "stare/m": decision.m,
        "stare/frac_l_plus": n_plus / n,
        "stare/frac_l_minus": n_minus / n,
        "stare/mean_weight": 1.0 + ((w_eff - 1.0) * n_plus + (m_eff - 1.0) * n_minus) / n,
        "stare/surprisal_threshold_plus": _threshold(l_plus),
        "stare/surprisal_threshold_minus": _threshold(l_minus),
        "stare/l_plus_above_entropy": above[0],
        "stare/l_minus_above_entropy": above[1],
        "entropy_control/model_tokens": float(masks.n_model),
        "stare/nonfinite_tokens": float(masks.n_nonfinite),
    }
    for name, sums in (("", cov_base), ("_eff", cov_eff)):
        cov, parts = sums.terms()
        metrics[f"entropy_control/cov_logp_adv{name}"] = cov
        metrics.update({f"entropy_control/cov_quadrant{name}/{q}": v for q, v in parts.items()})
    return metrics


def _threshold(selected) -> float:
    """Smallest surprisal (nats) in a selected set; -1 when nothing was selected (gate off or empty set)."""
    return float(selected.threshold) if selected is not None and selected.threshold is not None else -1.0
