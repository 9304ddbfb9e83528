"""REPO-R (Petrenko et al., "Entropy-Preserving Reinforcement Learning", ICLR 2026, arXiv 2603.11682, the REPO
family's advantage rescaling, its appendix D.2): each token's advantage is rescaled by the surprisal of the sampled
token, ``s = -log pi_old(a|s) >= 0`` (detached: the pre-update policy's log-prob from the old log-prob pass),

- ``A > 0``: ``A * max(1 + zeta * s, 0)`` = ``A * (1 - zeta * log pi)``, clamped at >= 0;
- ``A < 0``: ``A * max(1 - zeta * s, 0)`` = ``A * (1 + zeta * log pi)`` with the factor clamped at 0, so a negative
  advantage is softened toward 0 but never turned into a reward.

The paper uses a centred log-prob there; this is the practical form with the sampled token's log-prob (as the
public SkyRL implementation does). Only model tokens with a finite log-prob are changed; tool output and padding
(``response_mask`` 0) keep their advantage (0).

Why ``zeta > 0`` raises the entropy: for a softmax policy the step's entropy change is ``dH ~ -eta * Cov(log pi,
A)`` (Cui et al. 2025, arXiv 2505.22617; the same decomposition is the paper's entropy-dynamics analysis). With
``zeta > 0`` a positive advantage grows on rare tokens (low log pi) and a negative one shrinks there, so the
covariance of log pi with the rescaled advantage is lower than with ``A``: the update removes less entropy, the more
the larger ``zeta``. The controller therefore *doubles* zeta while the batch entropy is below the target and
*halves* it while above (unchanged at the target), within ``[zeta_min, zeta_max]``; it is updated with the step's
entropy, then applied to the same step (as the adaptive entropy coefficient). SkyRL's variant also flips zeta's
sign at the lower bound; this one keeps ``zeta >= zeta_min > 0``, so the method never pushes the entropy down. H is
the token-mean entropy of the pre-update policy over model tokens (mask 1, finite entropy); with no such token the
controller does not move. Its state (zeta, steps) is checkpointed as ``repo_r_state.json``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from stare_verl.methods.base import EntropyControl, finite_model_tokens


class RepoRConfig(BaseModel):
    """Attributes:
    zeta: the rescaling coefficient before the first step (per nat of surprisal), in [zeta_min, zeta_max].
    target_entropy: the batch entropy the controller steers to (nats); left unset in a launch, it follows the
        recipe's STARE target (the family's calibrated one).
    zeta_min, zeta_max: the controller's bounds (0 < zeta_min <= zeta_max).
    adaptive: halve/double zeta toward the target each step (False: zeta stays as configured).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    zeta: float = Field(1e-3, gt=0.0)
    target_entropy: float = Field(0.3, ge=0.0)
    zeta_min: float = Field(1e-4, gt=0.0)
    zeta_max: float = Field(0.05, gt=0.0)
    adaptive: bool = True

    @model_validator(mode="after")
    def _check_range(self) -> RepoRConfig:
        if not self.zeta_min <= self.zeta <= self.zeta_max:
            raise ValueError(f"need zeta_min <= zeta <= zeta_max, got {self.zeta_min}, {self.zeta}, {self.zeta_max}")
        return self


def next_zeta(zeta: float, batch_entropy: float | None, cfg: RepoRConfig) -> float:
    """One controller step: ``2 * zeta`` when ``batch_entropy < target``, ``zeta / 2`` when above, clipped into
    ``[zeta_min, zeta_max]``; unchanged at the target, without ``adaptive``, or when ``batch_entropy`` is None/NaN
    (no valid model token)."""
    if not cfg.adaptive or batch_entropy is None or not math.isfinite(batch_entropy):
        return zeta
    if batch_entropy < cfg.target_entropy:
        zeta *= 2.0
    elif batch_entropy > cfg.target_entropy:
        zeta *= 0.5
    return min(max(zeta, cfg.zeta_min), cfg.zeta_max)


def repo_r_advantages(advantages: torch.Tensor, response_mask: torch.Tensor, old_log_probs: torch.Tensor,
                      zeta: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """REPO-R's rescaling of one batch.

    Args:
        advantages: ``[B, T]`` float (0 where the mask is 0).
        response_mask: ``[B, T]``, 1 for model tokens, 0 for tool output and padding (never changed).
        old_log_probs: ``[B, T]`` float, log pi_old of the sampled tokens (nats, <= 0), detached here.
        zeta: the coefficient (>= 0).

    Returns:
        ``(advantages_eff, clamped)``: a new ``[B, T]`` tensor of the advantages' dtype, ``A * w`` on model tokens
        with a finite log-prob (``w = max(1 - zeta * log pi, 0)`` for A > 0, ``max(1 + zeta * log pi, 0)`` for
        A < 0) and ``A`` elsewhere; and the ``[B, T]`` bool of the tokens with A != 0 whose factor was clamped at 0.

    Raises:
        ValueError: the tensors' shapes differ, or ``zeta`` is negative or not finite.
    """
    if advantages.shape != response_mask.shape or advantages.shape != old_log_probs.shape:
        raise ValueError(f"REPO-R needs one [B, T] shape, got {tuple(advantages.shape)}, "
                         f"{tuple(response_mask.shape)}, {tuple(old_log_probs.shape)}")  # fmt: skip
    if not (math.isfinite(zeta) and zeta >= 0):
        raise ValueError(f"REPO-R's zeta must be finite and >= 0, got {zeta}")
    valid = finite_model_tokens(response_mask, old_log_probs)
    lp = torch.where(valid, old_log_probs.detach().to(advantages.dtype), torch.zeros_like(advantages))
    sign = torch.sign(advantages)  # +1: 1 - zeta log pi; -1: 1 + zeta log pi; 0: A stays 0
    raw = 1.0 - zeta * sign * lp
    clamped = valid & (raw < 0) & (sign != 0)
    out = advantages * raw.clamp_min(0.0)
    return torch.where(valid, out, advantages), clamped


class RepoR(EntropyControl):
    """Surprisal-proportional rescaling of positive and negative advantages, zeta steered toward a target entropy."""

    name: ClassVar[str] = "repo_r"
    summary: ClassVar[str] = "REPO-R: A>0 x (1 - zeta log pi), A<0 x max(1 + zeta log pi, 0); zeta x2 / /2 toward a target"
    Config: ClassVar[type] = RepoRConfig
    estimator: ClassVar[str] = "repo_r"
    target_key: ClassVar[str] = "target_entropy"
    state_file: ClassVar[str] = "repo_r_state.json"
    metric_prefix: ClassVar[str] = "repo_r/"
    STATE_VERSION: ClassVar[int] = 1

    def __init__(self, config: RepoRConfig):
        super().__init__(config)
        self.zeta = float(config.zeta)
        self.steps = 0

    def launch_overrides(self) -> list[str]:
        """Its section and estimator; a target left unset follows the recipe's STARE target (the family's
        calibrated one), so REPO-R and STARE aim at the same entropy."""
        out = super().launch_overrides()
        if "target_entropy" not in self.config.model_fields_set:
            out = [o if ".target_entropy=" not in o else
                   "++algorithm.repo_r.target_entropy=${algorithm.stare.target_entropy}" for o in out]  # fmt: skip
        return out

    def reshape(self, advantages, response_mask, old_log_probs, entropys, metrics):
        ent_ok = finite_model_tokens(response_mask, entropys)
        h = float(entropys.detach()[ent_ok].double().mean()) if ent_ok.any() else None
        self.zeta = next_zeta(self.zeta, h, self.config)
        self.steps += 1
        out, clamped = repo_r_advantages(advantages, response_mask, old_log_probs, self.zeta)
        valid = finite_model_tokens(response_mask, old_log_probs)
        n = max(int(valid.sum()), 1)
        ratio = (out / torch.where(advantages != 0, advantages, torch.ones_like(advantages))).detach().double()
        pos, neg = valid & (advantages > 0), valid & (advantages < 0)
        metrics["repo_r/zeta"] = self.zeta
        metrics["repo_r/entropy"] = math.nan if h is None else h
        metrics["repo_r/target_entropy"] = self.config.target_entropy
        metrics["repo_r/clamped_frac"] = float(clamped.sum()) / n
        metrics["repo_r/mean_weight_pos"] = float(ratio[pos].mean()) if pos.any() else 1.0
        metrics["repo_r/mean_weight_neg"] = float(ratio[neg].mean()) if neg.any() else 1.0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.STATE_VERSION, "zeta": self.zeta, "steps": self.steps,
                "config": self.config.model_dump()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore zeta (clipped into the current config's bounds) and the step count; without ``adaptive`` zeta
        is configuration, so the configured one is kept and only the step count is restored.

        Raises:
            ValueError: unknown version, a missing key, a non-finite or non-positive zeta, negative steps.
        """
        if not isinstance(state, dict) or state.get("version") != self.STATE_VERSION:
            raise ValueError(f"unsupported REPO-R state {state!r:.80}")
        try:
            zeta, steps = float(state["zeta"]), int(state["steps"])
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            raise ValueError(f"corrupt REPO-R state: {err!r}") from None
        if not math.isfinite(zeta) or zeta <= 0 or steps < 0:
            raise ValueError(f"corrupt REPO-R state: zeta {zeta}, steps {steps}")
        if self.config.adaptive:
            self.zeta = min(max(zeta, self.config.zeta_min), self.config.zeta_max)
        self.steps = steps
