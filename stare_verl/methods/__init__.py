"""Entropy-control methods: one class per method (:mod:`stare_verl.methods.base`), looked up here by name.

``METHODS`` maps each name to its class; :func:`get_method` and :func:`parse_method_spec` (``name[:key=value,...]``,
the harness's spelling of a method with settings) are the only ways the rest of the project names a method;
:func:`method_for_config` finds the method a verl config selects (by ``algorithm.adv_estimator``).
"""

from __future__ import annotations

import functools
from typing import Any

from stare_verl.methods.adaptive_entropy import AdaptiveEntropy
from stare_verl.methods.base import (
    SHARED_METRICS,
    TOKEN_STATS_MODES,
    TRAINER_MODE_ALIASES,
    EntropyControl,
    EntropyInputsMissing,
    MethodConfigError,
    feeds_token_stats,
    inputs_missing,
    read_bool,
)
from stare_verl.methods.clip_cov import ClipCov
from stare_verl.methods.entropy_adv import EntropyAdv
from stare_verl.methods.entropy_bonus import EntropyBonus
from stare_verl.methods.forking import Forking
from stare_verl.methods.group_baseline import GroupConfig
from stare_verl.methods.grpo import Grpo
from stare_verl.methods.kl_cov import KlCov
from stare_verl.methods.repo_r import RepoR
from stare_verl.methods.stare import Stare

METHODS: dict[str, type[EntropyControl]] = {
    cls.name: cls for cls in (Grpo, Stare, EntropyBonus, AdaptiveEntropy, ClipCov, KlCov, Forking, EntropyAdv,
                           RepoR)
}
"""Every method by name, in the order tables list them (the baseline first)."""

ESTIMATORS: dict[str, type[EntropyControl]] = {cls.estimator: cls for cls in METHODS.values() if cls.estimator}
"""The methods that act in the trainer, by the ``algorithm.adv_estimator`` each registers in verl."""

__all__ = ["ESTIMATORS", "METHODS", "SHARED_METRICS", "TOKEN_STATS_MODES", "TRAINER_MODE_ALIASES", "EntropyControl",
           "EntropyInputsMissing", "MethodConfigError", "check_runnable", "estimator_fn", "get_method",
           "group_config_of", "inputs_missing", "method_for_config", "metric_names", "metric_prefixes",
           "parse_method_spec", "recorded_method", "register"]  # fmt: skip


def get_method(name: str) -> type[EntropyControl]:
    """The method class called ``name``.

    Raises:
        MethodConfigError: no such method (the message lists the known ones).
    """
    try:
        return METHODS[name]
    except KeyError:
        raise MethodConfigError(f"unknown method {name!r}; known methods: {', '.join(METHODS)}") from None


def parse_method_spec(spec: str) -> EntropyControl:
    """``"name"`` or ``"name:key=value,key=value"`` -> the method with those settings (validated).

    Raises:
        MethodConfigError: an unknown method, a malformed ``key=value``, a setting given twice or an invalid
            setting (named).
    """
    name, _, rest = spec.partition(":")
    cls = get_method(name.strip())
    raw: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise MethodConfigError(f"method {spec!r}: settings are key=value separated by commas, got {item!r}")
        if key.strip() in raw:  # never last-wins: one of the two values is a typo
            raise MethodConfigError(f"method {spec!r}: setting {key.strip()} given twice; give each setting once")
        raw[key.strip()] = value.strip()
    return cls(cls.parse(raw, where=f"method {name}"))


def recorded_method(spec: Any) -> EntropyControl | None:
    """The method a run recorded (``summary.json``'s ``method``, a :func:`parse_method_spec` spelling), or None when
    ``spec`` is no string or names no method this version reads (an old name, a setting since removed): for the
    readers of finished runs (plots, tables), which show what they can and never fail on an old run."""
    if not isinstance(spec, str):
        return None
    try:
        return parse_method_spec(spec)
    except ValueError:  # MethodConfigError (an unknown name, a malformed or invalid setting)
        return None


def method_for_config(algorithm_config: Any) -> EntropyControl | None:
    """The method verl's ``algorithm`` section selects through ``adv_estimator`` (validated), or None when the
    estimator is none of ours (verl's own run unchanged).

    Raises:
        MethodConfigError: the method's ``algorithm.<name>`` section is invalid.
    """
    cls = ESTIMATORS.get(_algo_get(algorithm_config, "adv_estimator"))
    return None if cls is None else cls.from_algorithm(algorithm_config)


def _algo_get(section: Any, key: str, default: Any = None) -> Any:
    if section is None:
        return default
    return section.get(key, default) if hasattr(section, "get") else getattr(section, key, default)


def group_config_of(algorithm_config: Any) -> GroupConfig:
    """The GRPO group baseline a run of verl's ``algorithm`` section computes its advantages from: the settings
    of the method its ``adv_estimator`` selects (:meth:`EntropyControl.group_config`; STARE's ``algorithm.stare``
    for STARE and the methods run as its GRPO-ds twin), :meth:`GroupConfig.from_algorithm` for verl's own
    estimators. Two runs are comparable only when these are equal.

    Raises:
        MethodConfigError: an invalid method section or a boolean key that holds no boolean.
    """
    cls = ESTIMATORS.get(_algo_get(algorithm_config, "adv_estimator"))
    return cls.group_config(algorithm_config) if cls is not None else GroupConfig.from_algorithm(algorithm_config)


def check_runnable(config: Any, feeds: bool | None = None) -> EntropyControl | None:
    """The one rule for whether verl's full config can run the method it selects, checked before any worker
    starts (by the trainer modes, the guard on verl's other trainers and ``stare-verl check``).

    A method of ours (:data:`ESTIMATORS`) needs the token statistics: ``trainer.use_v1=true`` and a trainer mode
    of :data:`TOKEN_STATS_MODES` (or an older alias, :data:`TRAINER_MODE_ALIASES`), and the actor's entropy,
    which verl does not compute with ``algorithm.rollout_correction.bypass_mode=true``. Its section and the group
    baseline's boolean keys are read now, not at the first step.

    Args:
        config: verl's whole config (``algorithm``, ``trainer``), a DictConfig or nested mappings.
        feeds: whether the trainer that will run it hands estimators the token statistics, when the caller
            knows (a trainer checking itself); None: read from ``trainer.use_v1`` / ``trainer.v1.trainer_mode``.

    Returns:
        the method (validated), or None when the estimator is none of ours (verl's own run, nothing checked).

    Raises:
        EntropyInputsMissing: the trainer does not feed the method's token statistics.
        ValueError: ``bypass_mode`` is true (named in the message).
        MethodConfigError: the method's section or a boolean key is invalid.
    """
    algo = _algo_get(config, "algorithm")
    estimator = _algo_get(algo, "adv_estimator")
    if estimator not in ESTIMATORS:
        return None
    trainer = _algo_get(config, "trainer")
    mode = _algo_get(_algo_get(trainer, "v1"), "trainer_mode")
    if feeds is None:
        feeds = read_bool(trainer, "use_v1", False, "trainer") and feeds_token_stats(mode)
    if not feeds:
        raise inputs_missing(estimator, mode)
    if read_bool(_algo_get(algo, "rollout_correction"), "bypass_mode", False, "algorithm.rollout_correction"):
        raise ValueError(
            f"algorithm.adv_estimator={estimator} needs the actor's entropy, which verl does not compute with "
            "algorithm.rollout_correction.bypass_mode=true; set it to false"
        )
    group_config_of(algo)
    return method_for_config(algo)


def metric_prefixes() -> tuple[str, ...]:
    """The prefixes of every metric the methods log: the shared ``entropy_control/`` first, then each method's
    own (``stare/``, ``forking/``, ...), in :data:`METHODS` order."""
    own = dict.fromkeys(cls.metric_prefix for cls in METHODS.values() if cls.metric_prefix)
    return (SHARED_METRICS, *own)


def metric_names(key: str) -> tuple[str, ...]:
    """The names a shared quantity ``key`` (``batch_entropy``, ``cov_logp_adv_eff``, ...) is found under in a
    run's metrics, first found wins: ``entropy_control/<key>``, then the names older runs of a method logged it
    under (``stare/<key>``, :attr:`EntropyControl.shared_metrics_were_own`)."""
    old = [cls.metric_prefix + key for cls in METHODS.values() if cls.shared_metrics_were_own and cls.metric_prefix]
    return (SHARED_METRICS + key, *old)


@functools.cache
def estimator_fn(cls: type[EntropyControl]):
    """The function registered in verl under ``cls.estimator`` (one per class, so registering twice is a no-op):
    verl's estimator signature plus ``old_log_probs``, ``entropys``, ``method`` (the run's instance, which holds
    the controller state) and ``metrics``; returns ``(advantages, returns)``, the method's effective advantages.

    Raises (when called):
        EntropyInputsMissing: without ``old_log_probs`` / ``entropys`` (a trainer mode that cannot feed it).
    """
    own = cls.verl_estimator()
    if own is not None:
        return own

    def compute(token_level_rewards, response_mask, index=None, config=None, old_log_probs=None, entropys=None,
                method=None, metrics=None, **kwargs):  # fmt: skip
        if old_log_probs is None or entropys is None:
            raise inputs_missing(cls.estimator)
        method = method or cls.from_algorithm(config)
        step: dict = {}
        _, eff = method.advantage(token_level_rewards, response_mask, index, config, old_log_probs, entropys, step)
        if metrics is not None:
            metrics.update(step)
        return eff, eff

    compute.__name__ = compute.__qualname__ = f"compute_{cls.name}_advantage"
    compute.__doc__ = f"The ``{cls.estimator}`` advantage estimator: {cls.summary} (stare_verl.methods)."
    return compute


def register() -> None:
    """Register every method's advantage estimator in verl's registry (idempotent)."""
    from verl.trainer.ppo.core_algos import register_adv_est

    for cls in ESTIMATORS.values():
        register_adv_est(cls.estimator)(estimator_fn(cls))
