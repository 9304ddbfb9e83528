"""Entropy-control methods: one class per method (:mod:`stare_verl.methods.base`), looked up here by name.

``METHODS`` maps each name to its class; :func:`get_method` and :func:`parse_method_spec` (``name[:key=value,...]``,
the harness's spelling of a method with settings) are the only ways the rest of the project names a method;
:func:`method_for_config` finds the method a verl config selects (by ``algorithm.adv_estimator``).
"""

from __future__ import annotations

import functools
from typing import Any

from stare_verl.methods.adaptive_entropy import AdaptiveEntropy
from stare_verl.methods.base import EntropyControl, EntropyInputsMissing, MethodConfigError
from stare_verl.methods.clip_cov import ClipCov
from stare_verl.methods.entropy_adv import EntropyAdv
from stare_verl.methods.entropy_bonus import EntropyBonus
from stare_verl.methods.forking import Forking
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

__all__ = ["ESTIMATORS", "METHODS", "EntropyControl", "EntropyInputsMissing", "MethodConfigError", "estimator_fn", "get_method",
           "method_for_config", "parse_method_spec", "register"]  # fmt: skip


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
        MethodConfigError: an unknown method, a malformed ``key=value`` or an invalid setting (named).
    """
    name, _, rest = spec.partition(":")
    cls = get_method(name.strip())
    raw: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise MethodConfigError(f"method {spec!r}: settings are key=value separated by commas, got {item!r}")
        raw[key.strip()] = value.strip()
    return cls(cls.parse(raw, where=f"method {name}"))


def method_for_config(algorithm_config: Any) -> EntropyControl | None:
    """The method verl's ``algorithm`` section selects through ``adv_estimator`` (validated), or None when the
    estimator is none of ours (verl's own run unchanged).

    Raises:
        MethodConfigError: the method's ``algorithm.<name>`` section is invalid.
    """
    get = algorithm_config.get if hasattr(algorithm_config, "get") else lambda k, d=None: getattr(algorithm_config, k, d)
    cls = ESTIMATORS.get(get("adv_estimator", None))
    return None if cls is None else cls.from_algorithm(algorithm_config)


def _needs_trainer_error(cls: type[EntropyControl]) -> EntropyInputsMissing:
    from stare_verl.estimator import STARE_TRAINER_MODES

    return EntropyInputsMissing(
        f"algorithm.adv_estimator={cls.estimator} needs the old log-probs and entropy of each token, which this "
        f"trainer does not pass to advantage estimators. Use trainer.v1.trainer_mode={' or '.join(STARE_TRAINER_MODES)}"
        " from stare_verl, with trainer.use_v1=true."
    )


@functools.cache
def estimator_fn(cls: type[EntropyControl]):
    """The function registered in verl under ``cls.estimator`` (one per class, so registering twice is a no-op):
    verl's estimator signature plus ``old_log_probs``, ``entropys``, ``method`` (the run's instance, which holds
    the controller state) and ``metrics``; returns ``(advantages, returns)``, the method's effective advantages.

    Raises (when called):
        EntropyInputsMissing: without ``old_log_probs`` / ``entropys`` (a trainer mode that cannot feed it).
    """
    if cls.estimator == "stare":
        from stare_verl.estimator import compute_stare_advantage

        return compute_stare_advantage

    def compute(token_level_rewards, response_mask, index=None, config=None, old_log_probs=None, entropys=None,
                method=None, metrics=None, **kwargs):  # fmt: skip
        if old_log_probs is None or entropys is None:
            raise _needs_trainer_error(cls)
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
