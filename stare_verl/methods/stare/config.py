"""Typed, validated STARE hyperparameters (``algorithm.stare`` in a verl config).

Key names follow the STARE reference code so configs carry over. Defaults are the paper's
(``docs/stare.md``, "Per training step").
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stare_verl.methods.base import (
    ConfigBoolError,
    MethodConfigError,
    config_bool,
    format_validation_error,
    plain_mapping,
    read_bool,
)
from stare_verl.methods.group_baseline import ZERO_VARIANCE_TOL


class StareConfigError(MethodConfigError):
    """Raised when ``algorithm.stare`` holds an invalid or unknown key; the message names the key."""


class StareConfig(BaseModel):
    """STARE hyperparameters.

    Attributes:
        variant: ``"O1"`` amplifies L+ only (default); ``"C2"`` also damps L-.
        top_p_ratio: P, the share of tokens selected among those with A > 0 (and A < 0 for C2), in (0, 1].
        reweight_w: W, the weight of L+ tokens while the gate is on (> 0; 1.1 in the paper, 1.05 for 14B-32B).
        reweight_m: M, the weight of L- tokens for C2 while the gate is on, in (0, 1].
        target_entropy: H_target in nats; the gate is on while the batch token-mean entropy is below it.
        adaptive: adapt W and M by ``alpha`` per step toward the target (state kept across steps).
        alpha: step of the adaptive schedule.
        w_max: upper clip of W under the adaptive schedule (>= 1).
        m_min: lower clip of M under the adaptive schedule, in (0, 1].
        norm_adv_by_std_in_grpo: divide the group-centred reward by the group std (GRPO) or not (Dr.GRPO).
            ``None`` means: use ``algorithm.norm_adv_by_std_in_grpo``.
        epsilon: added to the group std (> 0: a group with equal rewards has std 0).
        zero_variance_tol: a group whose rewards span at most ``tol * max(1, max |r|)`` is zero-variance:
            advantage exactly 0, never in L+/L- (``stare_verl.methods.group_baseline.zero_variance_groups``); 0 = exact equality.
        scope: ``"batch"`` selects L+/L- once over all model tokens of the training batch (default);
            ``"chunk"`` selects within consecutive chunks of ``chunk_size`` sequences, reproducing the
            reference code's per-micro-batch selection for ablations.
        chunk_size: sequences per chunk when ``scope == "chunk"``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf/NaN: a clear error

    variant: Literal["O1", "C2"] = "O1"
    top_p_ratio: float = Field(0.10, gt=0.0, le=1.0)
    reweight_w: float = Field(1.1, gt=0.0)
    reweight_m: float = Field(0.9, gt=0.0, le=1.0)
    target_entropy: float = Field(0.3, ge=0.0)
    adaptive: bool = False
    alpha: float = Field(0.01, ge=0.0)
    w_max: float = Field(1.5, ge=1.0)
    m_min: float = Field(0.5, gt=0.0, le=1.0)
    norm_adv_by_std_in_grpo: bool | None = None
    epsilon: float = Field(1e-6, gt=0.0)
    zero_variance_tol: float = Field(ZERO_VARIANCE_TOL, ge=0.0, lt=1.0)
    scope: Literal["batch", "chunk"] = "batch"
    chunk_size: int | None = Field(None, ge=1)

    @field_validator("adaptive", "norm_adv_by_std_in_grpo", mode="before")
    @classmethod
    def _one_bool_reading(cls, value: Any, info: Any) -> Any:
        """The project's one reading of a boolean key (:func:`config_bool`); ``norm_adv_by_std_in_grpo`` may be
        None (follow ``algorithm.norm_adv_by_std_in_grpo``)."""
        if value is None and info.field_name == "norm_adv_by_std_in_grpo":
            return None
        try:
            return config_bool(value, info.field_name)
        except ConfigBoolError:
            raise ValueError("must be a boolean (true or false)") from None

    @model_validator(mode="after")
    def _check_scope(self) -> StareConfig:
        if self.scope == "chunk" and self.chunk_size is None:
            raise ValueError("scope='chunk' needs chunk_size (sequences per chunk, >= 1)")
        if self.adaptive and self.m_min > self.reweight_m:
            raise ValueError(f"m_min ({self.m_min}) must be <= reweight_m ({self.reweight_m}) when adaptive")
        if self.adaptive and not 1.0 <= self.reweight_w <= self.w_max:
            raise ValueError(
                f"reweight_w ({self.reweight_w}) must lie in [1, w_max={self.w_max}] when adaptive"
            )
        return self


def parse_stare_config(algorithm_config: Any) -> StareConfig:
    """Build a validated ``StareConfig`` from verl's ``algorithm`` section.

    Args:
        algorithm_config: verl's ``algorithm`` DictConfig (or a dict / ``AlgoConfig``); STARE keys are read
            from its ``stare`` entry, missing keys take the paper's defaults. ``norm_adv_by_std_in_grpo``
            falls back to ``algorithm.norm_adv_by_std_in_grpo`` when not set under ``stare``.
            ``None`` gives all defaults.

    Returns:
        A frozen ``StareConfig``.

    Raises:
        StareConfigError: a value out of range, an unknown variant or a misspelt key, or a boolean key
            (``adaptive``, ``norm_adv_by_std_in_grpo`` here or in ``algorithm``) that is no boolean
            (:func:`config_bool`); the message names the key and what is allowed.
    """
    if algorithm_config is None:
        return StareConfig(norm_adv_by_std_in_grpo=True)
    if isinstance(algorithm_config, StareConfig):
        if algorithm_config.norm_adv_by_std_in_grpo is None:  # verl's default baseline: std-normalised GRPO
            return algorithm_config.model_copy(update={"norm_adv_by_std_in_grpo": True})
        return algorithm_config
    get = (
        algorithm_config.get
        if hasattr(algorithm_config, "get")
        else lambda k, d=None: getattr(algorithm_config, k, d)
    )
    try:
        raw = plain_mapping(get("stare", None), "algorithm.stare")
    except MethodConfigError as err:
        raise StareConfigError(str(err)) from None
    if raw.get("norm_adv_by_std_in_grpo") is None:  # verl's key, read as every method reads it
        try:
            raw["norm_adv_by_std_in_grpo"] = read_bool(algorithm_config, "norm_adv_by_std_in_grpo", True, "algorithm")
        except ConfigBoolError as err:
            raise StareConfigError(str(err)) from None
    try:
        return StareConfig(**raw)
    except ValidationError as err:
        raise StareConfigError(format_validation_error(err, "algorithm.stare", StareConfig)) from None
