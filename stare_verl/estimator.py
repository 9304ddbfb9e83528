"""The ``stare`` advantage estimator, registered in verl's advantage-estimator registry.

verl's ``compute_advantage`` passes only rewards, mask, uid and config to registered estimators; STARE also
needs the pre-update policy's log-probs and entropy. The ``stare_*`` trainer modes
(``stare_verl.trainer``) pass them; any other caller gets a clear error instead of silent GRPO.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from stare_verl.config import parse_stare_config
from stare_verl.controller import StareController
from stare_verl.stare import stare_reweight

ESTIMATOR_NAME = "stare"
STARE_TRAINER_MODES = ("stare_sync", "stare_colocate_async")


class StareInputsMissing(RuntimeError):
    """The estimator was called without old log-probs / entropy, i.e. from a trainer that cannot feed it."""


class StareInputs(Mapping):
    """verl's ``algorithm`` config plus STARE's per-batch inputs, passed as ``config`` to verl's
    ``compute_advantage(data, adv_estimator="stare", config=...)`` (which forwards only ``config`` to
    registered estimators). Reads like the wrapped config (``get``, ``[]``, attributes).

    Args:
        algorithm: verl's ``algorithm`` DictConfig (or a dict).
        old_log_probs: ``[B, T]`` float log-probs (nats) of the pre-update policy.
        entropys: ``[B, T]`` float per-token entropy (nats).
        controller: STARE state kept across steps (None: fresh, stateless).
        metrics: dict updated in place with the ``stare/*`` metrics (None: not reported).
    """

    def __init__(
        self,
        algorithm: Any,
        old_log_probs: torch.Tensor,
        entropys: torch.Tensor,
        controller: StareController | None = None,
        metrics: dict | None = None,
    ):
        self.algorithm = algorithm
        self.old_log_probs = old_log_probs
        self.entropys = entropys
        self.controller = controller
        self.metrics = metrics

    @classmethod
    def from_data(
        cls, algorithm: Any, data: Any, controller: StareController | None = None, metrics: dict | None = None
    ) -> StareInputs:
        """Take ``old_log_probs`` and ``entropys`` (or verl's field name ``entropy``) from a DataProto's batch.

        Raises:
            KeyError: the batch holds no old log-probs or no entropy.
        """
        batch = data.batch
        ent_key = "entropys" if "entropys" in batch.keys() else "entropy"
        return cls(algorithm, batch["old_log_probs"], batch[ent_key], controller, metrics)

    def __getitem__(self, key: str) -> Any:
        return self.algorithm[key]

    def __iter__(self):
        return iter(self.algorithm)

    def __len__(self) -> int:
        return len(self.algorithm)

    def __getattr__(self, name: str) -> Any:
        if name == "algorithm":  # not yet set (e.g. during unpickling)
            raise AttributeError(name)
        return getattr(self.algorithm, name)


# verl is imported only here, after the names stare_verl.trainer needs: importing verl runs our plugin, which
# imports stare_verl.trainer, which imports those names, also when this module is the first one imported.
from verl.trainer.ppo.core_algos import (  # noqa: E402
    compute_grpo_vectorized_outcome_advantage,
    register_adv_est,
)


@register_adv_est(ESTIMATOR_NAME)
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
        index: ``[B]`` group ids (verl's ``uid``, any hashable dtype); responses of one prompt share one.
        config: verl's ``algorithm`` section; STARE keys under ``algorithm.stare`` (see ``StareConfig``).
            Through verl's ``compute_advantage`` pass a ``StareInputs`` here, which also carries the
            log-probs, entropy, controller and metrics dict.
        old_log_probs: ``[B, T]`` float log-probs (nats) of the pre-update policy.
        entropys: ``[B, T]`` float per-token entropy (nats) from the same forward pass.
        controller: gate/schedule state kept across steps; a fresh one (stateless behaviour) if None.
        metrics: if given, updated in place with the ``stare/*`` metrics.
        **kwargs: ignored (forward compatibility with verl's calling convention).

    Returns:
        ``(advantages, returns)``, both the same ``[B, T]`` float tensor, exactly 0 where the mask is 0.
        A response whose outcome reward is NaN/inf gets advantage 0 and stays out of its group's mean/std
        (counted in ``stare/nonfinite_rewards``); with finite rewards the base is verl's GRPO exactly.

    Raises:
        StareInputsMissing: ``old_log_probs``/``entropys`` not given (a trainer mode other than ``stare_*``).
        StareConfigError: invalid ``algorithm.stare``.
        ValueError: ``index`` missing or shapes that do not match.
    """
    if isinstance(config, StareInputs):
        old_log_probs = config.old_log_probs if old_log_probs is None else old_log_probs
        entropys = config.entropys if entropys is None else entropys
        controller = config.controller if controller is None else controller
        metrics = config.metrics if metrics is None else metrics
        config = config.algorithm
    if old_log_probs is None or entropys is None:
        raise StareInputsMissing(
            "algorithm.adv_estimator=stare needs the old log-probs and entropy of each token, which this "
            "trainer does not pass to advantage estimators. Use trainer.v1.trainer_mode=stare_sync (or "
            "stare_colocate_async) from stare_verl, with trainer.use_v1=true."
        )
    if index is None:
        raise ValueError("the stare estimator needs `index` (the group uid of each response)")
    if controller is None:
        controller = StareController(parse_stare_config(config))
    cfg = controller.config
    advantages, n_bad = _group_advantage(token_level_rewards, response_mask, index, cfg)
    advantages, step_metrics = stare_reweight(advantages, response_mask, old_log_probs, entropys, controller)
    step_metrics["stare/nonfinite_rewards"] = float(n_bad)
    if metrics is not None:
        metrics.update(step_metrics)
    return advantages, advantages


def _group_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, cfg: Any
) -> tuple[torch.Tensor, int]:
    """verl's GRPO advantage (``grpo_vectorized``), ``[B, T]`` float, and the number of responses whose outcome
    reward (row sum) is NaN or +-inf.

    With every reward finite this is verl's function unchanged. A non-finite reward (a broken reward function)
    would make its whole group's mean and std NaN and the loss NaN; instead such responses get advantage 0 and
    are left out of their group's statistics, which the finite responses of the group keep.
    """
    scores = token_level_rewards.sum(dim=-1)
    bad = ~torch.isfinite(scores)
    n_bad = int(bad.sum())
    kw = {"epsilon": cfg.epsilon, "norm_adv_by_std_in_grpo": bool(cfg.norm_adv_by_std_in_grpo)}
    if n_bad == 0:
        adv, _ = compute_grpo_vectorized_outcome_advantage(token_level_rewards, response_mask, index, **kw)
        return adv, 0
    adv = torch.zeros_like(token_level_rewards)
    keep = (~bad).nonzero(as_tuple=True)[0]
    if keep.numel():
        idx = np.asarray(index)[keep.cpu().numpy()]
        sub, _ = compute_grpo_vectorized_outcome_advantage(token_level_rewards[keep], response_mask[keep], idx, **kw)
        adv[keep] = sub.to(adv.dtype)
    return adv, n_bad
