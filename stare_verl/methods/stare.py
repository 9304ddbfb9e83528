"""STARE (arXiv 2606.19236) as an entropy-control method: ``algorithm.adv_estimator=stare``, config
``algorithm.stare`` (:class:`stare_verl.config.StareConfig`), the gate/schedule controller checkpointed as
``stare_state.json``. The math: :func:`stare_verl.stare.stare_reweight` (STARE steps 2-6)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import ValidationError

from stare_verl.config import StareConfig, parse_stare_config
from stare_verl.controller import StareController
from stare_verl.methods.base import (
    EntropyControl,
    MethodConfigError,
    _hydra_value,
    format_validation_error,
    plain_mapping,
)


class Stare(EntropyControl):
    """Surprisal-guided token-level advantage reweighting while the batch entropy is below the target."""

    name: ClassVar[str] = "stare"
    summary: ClassVar[str] = "STARE: weight W on the top-P surprisal tokens of A > 0 (C2: M on A < 0) below the target"
    Config: ClassVar[type] = StareConfig
    estimator: ClassVar[str] = "stare"
    recipe: ClassVar[str] = "stare"
    target_key: ClassVar[str] = "target_entropy"
    state_file: ClassVar[str] = "stare_state.json"

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

    def launch_overrides(self) -> list[str]:
        """Only the keys set explicitly: the recipe's ``algorithm.stare`` holds the family's calibrated values."""
        return [f"++algorithm.stare.{k}={_hydra_value(v)}" for k, v in self.config.model_dump(exclude_unset=True).items()]

    def advantage(self, token_level_rewards, response_mask, index, algorithm_config, old_log_probs, entropys,
                  metrics):  # fmt: skip
        """STARE steps 1-6 with this run's controller (:func:`stare_verl.estimator.stare_advantages`)."""
        from stare_verl.estimator import stare_advantages

        return stare_advantages(token_level_rewards, response_mask, index, old_log_probs, entropys, self.controller,
                                metrics)  # fmt: skip

    def reshape(self, advantages: torch.Tensor, response_mask, old_log_probs, entropys, metrics) -> torch.Tensor:
        from stare_verl.stare import stare_reweight

        out, step_metrics = stare_reweight(advantages, response_mask, old_log_probs, entropys, self.controller)
        metrics.update(step_metrics)
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state)
