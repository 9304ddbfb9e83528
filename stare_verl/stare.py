"""One STARE step on a batch: gate, token sets, weights and metrics (pure PyTorch).

Source: STARE steps 2-6 (``docs/stare.md``). The GRPO advantage (step 1) comes from the caller
(verl's estimator, see ``stare_verl.estimator``) so that omega == 1 reproduces it bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

from stare_verl.controller import StareController
from stare_verl.core import reweight_advantages, select_token_set, token_masks


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
) -> tuple[torch.Tensor, dict[str, float]]:
    """Apply STARE's surprisal-guided reweighting to GRPO advantages.

    Args:
        advantages: ``[B, T]`` float, GRPO advantages (0 where ``response_mask`` is 0).
        response_mask: ``[B, T]`` (bool/int/float), 1 for model-generated tokens, 0 for padding and tool output.
        old_log_probs: ``[B, T]`` float, log-probs (nats) of the sampled tokens under the pre-update policy;
            surprisal is ``-old_log_probs``. Masked positions may hold any value (sentinels, NaN, inf).
        entropys: ``[B, T]`` float, per-token policy entropy (nats) from the same forward pass.
        controller: gate/schedule state; advanced by one step.

    Returns:
        ``(advantages_eff, metrics)``: ``[B, T]`` tensor ``omega * advantages`` (exactly 0 where the mask is 0),
        and ``stare/*`` metrics (floats): gate_on, batch_entropy, target_entropy, w, m, frac_l_plus,
        frac_l_minus (share of model tokens reweighted: 0 with the gate off, when L+/L- are not selected),
        mean_weight, surprisal_threshold_plus/minus (nats; -1 when the set is empty or the gate is off),
        model_tokens, nonfinite_tokens.

    Model tokens whose log-prob or entropy is NaN/inf are left out of the gate and the selection (their
    advantage is unchanged) and counted in ``stare/nonfinite_tokens``.

    Raises:
        ValueError: tensors are not all ``[B, T]`` of one shape.
    """
    if advantages.shape != response_mask.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} vs response_mask {tuple(response_mask.shape)}"
        )
    cfg = controller.config
    adv_np, mask_np = _numpy(advantages), _numpy(response_mask)
    lp_np, ent_np = _numpy(old_log_probs), _numpy(entropys)
    masks = token_masks(mask_np, lp_np, ent_np)
    decision = controller.step(masks.batch_entropy)
    chunk = cfg.chunk_size if cfg.scope == "chunk" else None
    # outcome advantages are constant along a row and 0 off the mask: the row sum has the row's sign
    row_adv = adv_np.sum(axis=1)
    w_eff, m_eff = 1.0, 1.0
    out = advantages
    l_plus, l_minus, n_plus, n_minus = None, None, 0, 0
    if decision.gate_on:  # with the gate off nothing is reweighted, so nothing is selected
        l_plus = select_token_set(row_adv, lp_np, masks.valid, cfg.top_p_ratio, +1, chunk)
        n_plus = l_plus.count
        if cfg.variant == "C2":
            l_minus = select_token_set(row_adv, lp_np, masks.valid, cfg.top_p_ratio, -1, chunk)
            n_minus = l_minus.count
        w_eff = decision.w
        sets = [(l_plus, w_eff)]
        if l_minus is not None:
            m_eff = decision.m
            sets.append((l_minus, m_eff))
        out = torch.from_numpy(reweight_advantages(adv_np, sets)).to(advantages.device)
    n = max(masks.n_model, 1)
    metrics = {
        "stare/gate_on": float(decision.gate_on),
        "stare/batch_entropy": decision.batch_entropy if decision.batch_entropy is not None else 0.0,
        "stare/target_entropy": cfg.target_entropy,
        "stare/w": decision.w,
        "stare/m": decision.m,
        "stare/frac_l_plus": n_plus / n,
        "stare/frac_l_minus": n_minus / n,
        "stare/mean_weight": 1.0 + ((w_eff - 1.0) * n_plus + (m_eff - 1.0) * n_minus) / n,
        "stare/surprisal_threshold_plus": _threshold(l_plus),
        "stare/surprisal_threshold_minus": _threshold(l_minus),
        "stare/model_tokens": float(masks.n_model),
        "stare/nonfinite_tokens": float(masks.n_nonfinite),
    }
    return out, metrics


def _threshold(selected) -> float:
    """Smallest surprisal (nats) in a selected set; -1 when nothing was selected (gate off or empty set)."""
    return float(selected.threshold) if selected is not None and selected.threshold is not None else -1.0
