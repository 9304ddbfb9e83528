"""The seam every entropy-control method plugs into: one class per method, registered by name.

A method (GRPO-ds, STARE, entropy bonus, adaptive entropy coefficient, Clip-Cov, KL-Cov, 80/20 forking tokens,
entropy advantage, REPO-R; ``../docs/entropy-methods.md`` has the formulas) is one subclass of :class:`EntropyControl`:

- its typed config (a frozen pydantic model, every field documented), read from ``algorithm.<name>`` of a verl
  config for the methods that act in the trainer, validated with messages that name the key;
- the Hydra overrides that select it (:meth:`EntropyControl.launch_overrides`): the verl keys it sets (e.g.
  ``actor.entropy_coeff``, ``actor.policy_loss.loss_mode``) or the advantage estimator it registers;
- what it does with the token statistics our trainer modes hand it (old log-probs and entropy of the pre-update
  policy, :meth:`EntropyControl.advantage`), its per-step settings for the actor update
  (:meth:`EntropyControl.actor_extra`), its controller state (checkpointed with verl's) and its metrics.

Methods whose whole effect is verl configuration (``estimator = None``) run in the trainer as the GRPO-ds twin
(the ``stare`` estimator with W = M = 1), so every method logs the same ``entropy_control/*`` metrics (and the
twin STARE's ``stare/*``). The registry (:data:`METHODS`) is the only place a method is looked up by name.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ValidationError

from stare_verl.methods.group_baseline import GroupConfig, grpo_base
from stare_verl.methods.settings import (  # noqa: F401 - the methods' settings helpers, named here too
    ConfigBoolError,
    MethodConfigError,
    config_bool,
    format_validation_error,
    plain_mapping,
    read_bool,
)


class EntropyInputsMissing(RuntimeError):
    """A method that needs token statistics was called by a trainer that does not pass them."""


TOKEN_STATS_MODES: dict[str, str] = {"token_stats_sync": "sync", "token_stats_colocate_async": "colocate_async"}
"""The trainer modes that hand a method the token statistics it needs (old log-probs and entropy of the pre-update
policy), by name, with the verl V1 mode each reproduces (``stare_verl.trainer``)."""

TRAINER_MODE_ALIASES: dict[str, str] = {
    "stare_sync": "token_stats_sync",
    "stare_colocate_async": "token_stats_colocate_async",
}
"""Older names of :data:`TOKEN_STATS_MODES` (from when STARE was the only method), registered too so that older
recipes keep running."""


def feeds_token_stats(trainer_mode: Any) -> bool:
    """Whether ``trainer.v1.trainer_mode`` names a mode of :data:`TOKEN_STATS_MODES` (or an older alias)."""
    return trainer_mode in TOKEN_STATS_MODES or trainer_mode in TRAINER_MODE_ALIASES


def inputs_missing(estimator: str, trainer_mode: Any = None) -> EntropyInputsMissing:
    """The error for ``algorithm.adv_estimator=<estimator>`` run where the token statistics do not reach it
    (``trainer_mode``: the mode configured, when known)."""
    got = f" with trainer.v1.trainer_mode={trainer_mode}" if trainer_mode is not None else ""
    return EntropyInputsMissing(
        f"algorithm.adv_estimator={estimator}{got}: the method needs the old log-probs and entropy of each token, "
        "which this trainer does not pass to advantage estimators. Use trainer.use_v1=true and "
        f"trainer.v1.trainer_mode={' or '.join(TOKEN_STATS_MODES)} (stare_verl)."
    )


SHARED_METRICS = "entropy_control/"
"""The prefix of the quantities every method logs, each computed once per step: batch entropy, target entropy,
Cov(log pi, A) before / after the method and its quadrant shares (``stare_verl.methods.metrics``), the group
baseline's counts (``stare_verl.methods.group_baseline``)."""


def _algo_get(algorithm_config: Any, key: str, default: Any = None) -> Any:
    if algorithm_config is None:
        return default
    if hasattr(algorithm_config, "get"):
        return algorithm_config.get(key, default)
    return getattr(algorithm_config, key, default)


def _hydra_value(value: Any) -> str:
    """A Python value as a Hydra override value (bools lower-case, floats round-trip)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _same_value(a: str, b: str) -> bool:
    """Whether two Hydra override values are one value: equal numbers, or equal text up to case and quotes."""
    try:
        return float(a) == float(b)
    except ValueError:
        return a.strip().strip("'\"").lower() == b.strip().strip("'\"").lower()


class EntropyControl:
    """One entropy-control method (subclass per method; see the module docstring).

    Class attributes:
        name: the method's name (CLI, harness, run folders, registry key, and ``algorithm.<name>`` section).
        summary: one line for help texts and tables.
        Config: the typed config (frozen pydantic model with documented fields).
        estimator: the ``algorithm.adv_estimator`` it registers in verl (None: verl configuration only, run as
            the GRPO-ds twin).
        recipe: the CPU tiny recipe it starts from, ``recipes/cpu/<family>_tiny_<recipe>.yaml``.
        target_key: the config field holding a target entropy (nats), or None when the method has no target.
        state_file: the file its controller state is kept in inside verl's ``global_step_N`` folders, or None.
        metric_prefix: the prefix of the metrics the method logs of its own (``forking/``), or None. What every
            method logs (batch entropy, target, Cov(log pi, A) and its quadrants) is ``entropy_control/*``
            (:data:`SHARED_METRICS`).
        shared_metrics_were_own: older runs of the method logged the shared quantities under ``metric_prefix``
            (``stare/batch_entropy``): readers of old run folders fall back to those names.
        title_metrics: of its own metrics, those a run's plot title shows when the run's settings were not
            recorded (label -> key under ``metric_prefix``, e.g. STARE's ``{"W": "w", "M": "m"}``).

    Args:
        config: a validated ``Config``.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    Config: ClassVar[type[BaseModel]]
    estimator: ClassVar[str | None] = None
    recipe: ClassVar[str] = "grpo"
    target_key: ClassVar[str | None] = None
    state_file: ClassVar[str | None] = None
    metric_prefix: ClassVar[str | None] = None
    shared_metrics_were_own: ClassVar[bool] = False
    title_metrics: ClassVar[dict[str, str]] = {}

    def __init__(self, config: BaseModel):
        self.config = config

    # --- config --------------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, raw: Any, where: str | None = None) -> BaseModel:
        """Validate ``raw`` (a mapping, None for all defaults) as this method's ``Config``.

        Raises:
            MethodConfigError: a value out of range or an unknown key (named).
        """
        where = where or f"algorithm.{cls.name}"
        try:
            return cls.Config(**plain_mapping(raw, where))
        except ValidationError as err:
            raise MethodConfigError(format_validation_error(err, where, cls.Config)) from None

    @classmethod
    def from_algorithm(cls, algorithm_config: Any) -> EntropyControl:
        """The method built from verl's ``algorithm`` section (its ``algorithm.<name>`` entry)."""
        return cls(cls.parse(_algo_get(algorithm_config, cls.name)))

    @classmethod
    def group_config(cls, algorithm_config: Any) -> GroupConfig:
        """The settings of the GRPO group baseline this method's advantages start from, read from verl's
        ``algorithm`` section (:meth:`GroupConfig.from_algorithm`; a method with settings of its own for it
        overrides this).

        Raises:
            MethodConfigError: a boolean key that holds no boolean, or an invalid section of the method.
        """
        return GroupConfig.from_algorithm(algorithm_config)

    @classmethod
    def verl_estimator(cls) -> Any:
        """The function registered in verl under :attr:`estimator`, when the method brings one with its own
        signature (None: :func:`stare_verl.methods.estimator_fn` builds the common one around :meth:`advantage`)."""
        return None

    def launch_overrides(self) -> list[str]:
        """Hydra overrides that select this method with its config on its ``recipe`` (``++`` adds or replaces)."""
        out = [f"++algorithm.adv_estimator={self.estimator}"] if self.estimator else []
        out += [f"++algorithm.{self.name}.{k}={_hydra_value(v)}" for k, v in self.config.model_dump().items()]
        return out

    def compose_overrides(self, user: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
        """The overrides a run of this method launches with: the user's, then :meth:`launch_overrides` (so the
        method's own settings win); and the user's overrides it drops (none here; see ``TwinBased``)."""
        return [*user, *self.launch_overrides()], []

    def replaced_overrides(self, user: list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
        """The user's Hydra overrides that this method's own settings would silently replace: ``(override,
        "<key>=<the method's value>")`` for each override (``key=value``, ``+key=value``, ``++key=value`` or
        ``~key``) of a key that :meth:`launch_overrides` sets to another value, or of ``algorithm.adv_estimator``
        (which selects the method: :attr:`estimator`, ``stare`` for the twin) (values compared as numbers where
        both are numbers, else case-insensitively as text). Overrides the method drops on purpose (the twin's
        STARE keys, see :meth:`compose_overrides`) are not counted."""
        # the advantage estimator is the method's (the twin-based methods run the recipe's ``stare`` twin)
        own = {"algorithm.adv_estimator": self.estimator or "stare"}
        for o in self.launch_overrides():
            key, _, value = o.lstrip("+~").partition("=")
            own[key] = value
        _, dropped = self.compose_overrides(list(user))
        out = []
        for o in user:
            if o in dropped:
                continue
            key, has_value, value = o.lstrip("+~").partition("=")
            if key in own and (o.startswith("~") or not has_value or not _same_value(value, own[key])):
                out.append((o, f"{key}={own[key]}"))
        return out

    @property
    def label(self) -> str:
        """The method and the settings given explicitly, for run folders and tables: ``forking``,
        ``entropy_bonus-coef0.01``."""
        given = self.config.model_dump(include=self.config.model_fields_set)
        return "-".join([self.name, *(f"{k}{v}" for k, v in given.items())])

    def target_entropy(self) -> float | None:
        """The method's target entropy in nats, or None when it has none."""
        return None if self.target_key is None else float(getattr(self.config, self.target_key))

    # --- a training step -------------------------------------------------------------------------------------
    def advantage(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray,
        algorithm_config: Any,
        old_log_probs: torch.Tensor,
        entropys: torch.Tensor,
        metrics: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(base, effective)`` advantages, both ``[B, T]`` float, 0 where ``response_mask`` is 0: the GRPO base
        (:func:`stare_verl.methods.group_baseline.grpo_base`) and what the actor's update receives after the method's
        change (:meth:`reshape`). ``metrics`` is updated in place."""
        base = grpo_base(token_level_rewards, response_mask, index, algorithm_config, metrics)
        return base, self.reshape(base, response_mask, old_log_probs, entropys, metrics)

    def reshape(
        self,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        old_log_probs: torch.Tensor,
        entropys: torch.Tensor,
        metrics: dict,
    ) -> torch.Tensor:
        """The method's change of the GRPO advantages (``[B, T]`` in, ``[B, T]`` out, a new tensor); the default
        is none (the advantages themselves)."""
        return advantages

    def actor_extra(self) -> dict[str, Any]:
        """Per-step settings for the actor update (``KVBatchMeta.extra_info``), read by
        :func:`stare_verl.verl_compat.ppo_loss_with_step_settings`; none by default."""
        return {}

    # --- controller state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        """JSON-serialisable controller state, or None for a stateless method."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state. Raises ValueError on a corrupt state."""


def finite_model_tokens(response_mask: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: model tokens (mask 1) whose given per-token values are all finite."""
    valid = response_mask.bool() if response_mask.dtype != torch.bool else response_mask.clone()
    for v in values:
        valid &= torch.isfinite(v)
    return valid


def top_share_mask(values: torch.Tensor, valid: torch.Tensor, share: float) -> torch.Tensor:
    """``[B, T]`` bool: the ``ceil(share * n)`` largest ``values`` among the ``n`` ``valid`` tokens (exactly that
    many; ties at the threshold broken by position), over the whole batch. Empty when no token is valid."""
    out = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)  # row-major, whatever valid's layout
    n = int(valid.sum())
    if n == 0:
        return out
    k = min(n, max(1, math.ceil(share * n - 1e-9)))
    flat = torch.where(valid, values.double(), torch.full_like(values, -math.inf, dtype=torch.float64)).flatten()
    idx = torch.topk(flat, k, largest=True, sorted=False).indices
    out.view(-1)[idx] = True
    return out
