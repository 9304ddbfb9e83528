"""GRPO-ds, the baseline: GRPO with DAPO's clip-higher (0.2 / 0.28), token-mean loss, no KL, no entropy bonus, as the
recipes set it. It runs as STARE's twin: the ``stare`` estimator with W = M = 1 and no adaptive schedule, which is
GRPO-ds exactly (STARE step 6) while logging the same ``stare/*`` metrics as STARE. The methods that only set verl
keys (entropy bonus, Clip-Cov, KL-Cov) start from this twin too (:class:`TwinBased`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from stare_verl.methods.base import EntropyControl

TWIN_PINNED = {"algorithm.stare.reweight_w": "1.0", "algorithm.stare.reweight_m": "1.0",
               "algorithm.stare.adaptive": "false"}  # fmt: skip
"""What the GRPO-ds twin pins, last among the overrides, so that none meant for STARE turns the twin into a STARE
run (W = M = 1, no schedule moving them)."""


class NoConfig(BaseModel):
    """No settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TwinBased(EntropyControl):
    """A method whose whole effect is verl configuration (:meth:`verl_keys`), on the GRPO-ds twin."""

    recipe: ClassVar[str] = "grpo"
    pinned: ClassVar[dict[str, str]] = TWIN_PINNED

    def verl_keys(self) -> dict[str, str]:
        """The verl keys (Hydra paths) and values the method sets."""
        return {}

    def launch_overrides(self) -> list[str]:
        keys = {**self.verl_keys(), **self.pinned}
        return [f"++{k}={v}" for k, v in keys.items()]

    def compose_overrides(self, user: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
        """The user's overrides less those of the pinned keys (``make compare`` passes STARE's settings to every
        method: they must not turn the twin into a STARE run), then the method's keys and the pins. The twin's
        other STARE keys (target entropy, P, ...) follow the overrides, so every method logs the same ``stare/*``
        metrics against the same target."""
        dropped = [o for o in user if o.lstrip("+~").split("=", 1)[0] in self.pinned]
        return [o for o in user if o not in dropped] + self.launch_overrides(), dropped


class Grpo(TwinBased):
    """The GRPO-ds baseline (verl's GRPO with the recipes' DAPO settings)."""

    name: ClassVar[str] = "grpo"
    summary: ClassVar[str] = "GRPO-ds baseline: clip-higher 0.2/0.28, token-mean, no KL (STARE's twin, W = M = 1)"
    Config: ClassVar[type] = NoConfig
