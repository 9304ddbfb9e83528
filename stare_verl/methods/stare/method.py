"""STARE (arXiv 2606.19236) as an entropy-control method: ``algorithm.adv_estimator=stare``, config
``algorithm.stare`` (:class:`stare_verl.methods.stare.config.StareConfig`), the gate/schedule controller
checkpointed as ``stare_state.json``, and the ``stare`` advantage estimator registered in verl
(:func:`compute_stare_advantage`). The math: :func:`stare_verl.methods.stare.reweight.stare_reweight` (STARE
steps 2-6) on the GRPO group baseline (step 1, :mod:`stare_verl.methods.group_baseline`).

verl's ``compute_advantage`` passes only rewards, mask, uid and config to registered estimators; STARE also needs
the pre-update policy's log-probs and entropy, which the token-statistics trainer modes (``stare_verl.trainer``)
hand it; any other caller gets a clear error instead of silent GRPO.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import ValidationError

from stare_verl.methods.base import (
    EntropyControl,
    MethodConfigError,
    _hydra_value,
    format_validation_error,
    inputs_missing,
    plain_mapping,
)
from stare_verl.methods.group_baseline import GroupConfig, group_advantage, group_row_advantage
from stare_verl.methods.stare.config import StareConfig, parse_stare_config
from stare_verl.methods.stare.controller import StareController
from stare_verl.methods.stare.reweight import stare_reweight, stare_reweight_rows

ESTIMATOR_NAME = "stare"


class Stare(EntropyControl):
    """Surprisal-guided token-level advantage reweighting while the batch entropy is below the target."""

    name: ClassVar[str] = "stare"
    summary: ClassVar[str] = "STARE: weight W on the top-P surprisal tokens of A > 0 (C2: M on A < 0) below the target"
    Config: ClassVar[type] = StareConfig
    estimator: ClassVar[str] = ESTIMATOR_NAME
    recipe: ClassVar[str] = "stare"
    target_key: ClassVar[str] = "target_entropy"
    state_file: ClassVar[str] = "stare_state.json"
    metric_prefix: ClassVar[str] = "stare/"
    shared_metrics_were_own: ClassVar[bool] = True
    title_metrics: ClassVar[dict[str, str]] = {"W": "w", "M": "m"}

    def __init__(self, config: StareConfig):
        super().__init__(config)
        self.controller = StareController(config)

    @classmethod
    def parse(cls, raw: Any, where: str | None = None) -> StareConfig:
        """Only the keys given are set (so :meth:`launch_overrides` passes only those on)."""
        where = where or "algorithm.stare"
        try:
            return StareConfig(**plain_mapping(raw, where))
        except ValidationError as err:
            raise MethodConfigError(format_validation_error(err, where, StareConfig)) from None

    @classmethod
    def from_algorithm(cls, algorithm_config: Any) -> Stare:
        return cls(parse_stare_config(algorithm_config))

    @classmethod
    def group_config(cls, algorithm_config: Any) -> GroupConfig:
        """STARE's own baseline settings: ``algorithm.stare.norm_adv_by_std_in_grpo`` (falling back to
        ``algorithm.norm_adv_by_std_in_grpo``), ``epsilon`` and ``zero_variance_tol``.

        Raises:
            StareConfigError: an invalid ``algorithm.stare`` or a boolean key that holds no boolean.
        """
        c = parse_stare_config(algorithm_config)
        return GroupConfig(c.norm_adv_by_std_in_grpo is not False, c.epsilon, c.zero_variance_tol)

    @classmethod
    def verl_estimator(cls):
        """:func:`compute_stare_advantage` (it also takes a ``controller``)."""
        return compute_stare_advantage

    def launch_overrides(self) -> list[str]:
        """Only the keys set explicitly: the recipe's ``algorithm.stare`` holds the family's calibrated values."""
        return [f"++algorithm.stare.{k}={_hydra_value(v)}" for k, v in self.config.model_dump(exclude_unset=True).items()]

    def advantage(self, token_level_rewards, response_mask, index, algorithm_config, old_log_probs, entropys,
                  metrics):  # fmt: skip
        """STARE steps 1-6 with this run's controller (:func:`stare_advantages`)."""
        return stare_advantages(token_level_rewards, response_mask, index, old_log_probs, entropys, self.controller,
                                metrics)  # fmt: skip

    def reshape(self, advantages: torch.Tensor, response_mask, old_log_probs, entropys, metrics) -> torch.Tensor:
        out, step_metrics = stare_reweight(advantages, response_mask, old_log_probs, entropys, self.controller)
        metrics.update(step_metrics)
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state)


def stare_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    entropys: torch.Tensor,
    controller: StareController,
    metrics: dict,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """STARE steps 1-6: ``(grpo_advantages, omega * grpo_advantages)``, both ``[B, T]``; with ``inplace`` the first is
    the second (for callers that need only the second). Adds the ``stare/*`` and shared ``entropy_control/*`` metrics
    (see :func:`compute_stare_advantage`) to ``metrics``.

    With ``inplace`` on CPU tensors the GRPO advantages are not materialised: the per-response advantages
    (:func:`group_row_advantage`) go to :func:`stare_reweight_rows`, which writes the effective advantages once;
    where that path does not apply (non-finite rewards, tensors on an accelerator, chunked scope, other dtypes) and
    without ``inplace``, :func:`group_advantage` gives the ``[B, T]`` GRPO advantages and :func:`stare_reweight`
    reweights them. Both give the same results."""
    cfg = controller.config
    got = None
    if inplace and token_level_rewards.device.type == "cpu":
        rows = group_row_advantage(token_level_rewards, response_mask, index, cfg)
        if rows is not None:
            row_adv, zero_var_share = rows
            n_bad = 0
            got = stare_reweight_rows(row_adv, response_mask, old_log_probs, entropys, controller)
    if got is not None:
        eff, step_metrics = got
        base = eff
    else:
        base, n_bad, zero_var_share = group_advantage(token_level_rewards, response_mask, index, cfg)
        eff, step_metrics = stare_reweight(base, response_mask, old_log_probs, entropys, controller, inplace=inplace)
    step_metrics["entropy_control/nonfinite_rewards"] = float(n_bad)
    step_metrics["entropy_control/zero_variance_groups"] = zero_var_share
    metrics.update(step_metrics)
    return base, eff


def compute_stare_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    old_log_probs: torch.Tensor | None = None,
    entropys: torch.Tensor | None = None,
    controller: StareController | None = None,
    metrics: dict | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """STARE advantage: omega * GRPO advantage (STARE steps 1-6, ``docs/stare.md``).

    Args:
        token_level_rewards: ``[B, T]`` float; a response's outcome reward is its row sum.
        response_mask: ``[B, T]``, 1 for model-generated tokens, 0 for padding and tool output.
        index: ``[B]`` group ids (verl's ``uid``, any dtype verl accepts); grouped exactly as verl's
            ``grpo_vectorized`` groups them (:func:`verl_group_codes`: ``"1"`` and ``"01"`` are one group).
        config: verl's ``algorithm`` section; STARE keys under ``algorithm.stare`` (see ``StareConfig``).
        old_log_probs: ``[B, T]`` float log-probs (nats) of the pre-update policy.
        entropys: ``[B, T]`` float per-token entropy (nats) from the same forward pass.
        controller: gate/schedule state kept across steps; a fresh one (stateless behaviour) if None.
        metrics: if given, updated in place with the ``stare/*`` and ``entropy_control/*`` metrics.
        **kwargs: ignored (forward compatibility with verl's calling convention).

    Returns:
        ``(advantages, returns)``, both the same ``[B, T]`` float tensor, exactly 0 where the mask is 0.
        The base is verl's ``grpo_vectorized`` (GRPO or Dr.GRPO) bit for bit, except: a zero-variance group
        (all rewards equal up to float residue, ``zero_variance_tol``) gets exactly 0 where verl leaves a
        rounding residue whose sign would decide L+/L- (``entropy_control/zero_variance_groups``: their share of the
        groups); a response whose outcome reward is NaN/inf gets 0 and stays out of its group's mean/std
        (``entropy_control/nonfinite_rewards``). See :func:`stare_verl.methods.group_baseline.group_advantage`.

    Raises:
        EntropyInputsMissing: ``old_log_probs``/``entropys`` not given (a trainer mode that does not feed them).
        StareConfigError: invalid ``algorithm.stare``.
        ValueError: ``index`` missing or shapes that do not match.
    """
    if old_log_probs is None or entropys is None:
        raise inputs_missing(ESTIMATOR_NAME)
    if index is None:
        raise ValueError("the stare estimator needs `index` (the group uid of each response)")
    if controller is None:
        controller = StareController(parse_stare_config(config))
    step_metrics: dict = {}
    _, advantages = stare_advantages(token_level_rewards, response_mask, index, old_log_probs, entropys, controller,
                                     step_metrics, inplace=True)  # fmt: skip  # ours: no copy needed
    if metrics is not None:
        metrics.update(step_metrics)
    return advantages, advantages
