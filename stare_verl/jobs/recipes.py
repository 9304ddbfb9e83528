"""Compose and validate the project's verl recipes (Hydra YAMLs under ``recipes/``) without launching.

The recipes are found with :func:`stare_verl.recipe_files.recipes_dir` (package data, so an installed wheel
works from any working directory).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from stare_verl.recipe_files import recipes_dir, register_resolver

__all__ = ["compose_recipe", "is_override", "override_problem", "recipe_names", "recipes_dir", "validate_recipe"]

_OVERRIDE = re.compile(r"^(~|\+\+?)?[A-Za-z_][\w.@/\-\[\]]*(=|$)")


def is_override(text: str) -> bool:
    """Whether a command-line word is written as a Hydra override (``key=value``, ``+key=value``, ``++key=value``,
    ``~key``, ``~key=value``; the key a dotted name): what ends the values of a list option (``--seeds 0 1
    key=value``). A method spec (``stare:reweight_w=2``) or a number is none."""
    return bool(_OVERRIDE.match(text)) and ("=" in text or text.startswith("~"))


def override_problem(text: str) -> str | None:
    """Why ``text`` is no Hydra override a run should take, as one line naming it, or None when it is one.

    Hydra's own grammar decides what parses (``hydra.core.override_parser``); on top of it an empty value
    (``actor_rollout_ref.actor.optim.lr=``, which Hydra reads as the empty string and verl would meet only at
    launch) is refused: ``key=null`` is the explicit null, ``key=''`` the explicit empty string; ``~key=`` (delete
    only where the key is the empty string) likewise: ``~key`` deletes.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides([text])[0]
    except Exception as err:  # noqa: BLE001 - hydra's OverrideParseException: its reason, one line
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        why = next((ln for ln in lines if not ln.startswith(("Error parsing", "See "))), lines[0] if lines else "")
        return (f"override {text!r} is no Hydra override (key=value, +key=value, ++key=value or ~key)"
                + (f": {why}" if why else ""))  # fmt: skip
    head, eq, value = text.partition("=")
    if eq and not value.strip():
        key = parsed.key_or_group
        if parsed.is_delete():
            return f"override {text!r} has an empty value: ~{key} deletes {key}"
        return f"override {text!r} gives {key} no value: write one, {head}=null for null or {head}='' for an empty string"
    return None


def recipe_names(folder: Path | None = None) -> list[str]:
    """Names of the launchable recipes (top-level YAMLs) in ``folder`` (default: :func:`recipes_dir`).

    Raises:
        FileNotFoundError: no recipes folder (see :func:`recipes_dir`).
    """
    return sorted(p.stem for p in Path(folder or recipes_dir()).glob("*.yaml"))


def compose_recipe(
    name: str, overrides: list[str] | None = None, folder: Path | None = None, resolve: bool = True
) -> DictConfig:
    """Compose recipe ``name`` on verl's ppo_trainer config with Hydra overrides, as ``main_ppo`` would.
    ``name`` may name a sub-folder of ``folder`` (default: :func:`recipes_dir`), e.g. ``cpu/shortcot_tiny_stare``.
    ``resolve``: resolve the interpolations (the ``${stare_verl.recipe_file:...}`` resolver is registered first).

    Raises:
        FileNotFoundError: no recipes folder (see :func:`recipes_dir`).
        hydra.errors.MissingConfigException: no such recipe.
        hydra.errors.ConfigCompositionException: a bad override.
        ValueError: a word that is no Hydra override, or one with an empty value (:func:`override_problem`).
        omegaconf.errors.InterpolationResolutionError: an interpolation does not resolve (e.g. a missing file).
    """
    from hydra import compose, initialize_config_dir

    problem = next(filter(None, map(override_problem, overrides or [])), None)
    if problem:
        raise ValueError(problem)
    folder = Path(folder or recipes_dir())
    if "/" in name.removesuffix(".yaml"):  # e.g. "cpu/shortcot_tiny_stare": its folder is the config dir
        sub, name = name.removesuffix(".yaml").rsplit("/", 1)
        folder = folder / sub
    register_resolver()
    with initialize_config_dir(config_dir=str(folder.resolve()), version_base=None):
        cfg = compose(config_name=name, overrides=list(overrides or []))
    if resolve:
        OmegaConf.resolve(cfg)
    return cfg


def validate_recipe(cfg: DictConfig) -> Any:
    """Validate a composed config with verl's own checks and config dataclasses, plus ours.

    Checks verl's ``validate_config``, the rollout section as ``RolloutConfig``, the algorithm section as
    ``AlgoConfig`` (without ``stare``), ``algorithm.stare`` with pydantic, that the estimator and trainer
    mode are registered and that the reward manager, custom reward function and tool config load.

    Returns:
        The parsed config of the entropy-control method the estimator selects (``StareConfig`` for ``stare``),
        or None when the estimator is none of ours. Whether the trainer can run it is
        :func:`stare_verl.methods.check_runnable`.

    Raises:
        Exception: whatever verl or our validation raises for a config that would fail at launch.
    """
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.import_utils import load_extern_object
    from verl.workers.config import RolloutConfig

    # verl prints "All configuration checks passed" on success, which reads wrongly right above one of our
    # errors below: keep its other output (warnings), drop that line.
    with contextlib.redirect_stdout(io.StringIO()) as out:
        validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))
    for line in out.getvalue().splitlines():
        if line.strip() and "checks passed" not in line:
            print(line)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout, dataclass_type=RolloutConfig)
    algo: dict[str, Any] = OmegaConf.to_container(cfg.algorithm, resolve=True)  # type: ignore[assignment]
    from stare_verl.methods import ESTIMATORS, METHODS, check_runnable
    from stare_verl.methods.settings import config_bool, read_bool

    estimator = cfg.algorithm.adv_estimator
    # the trainer mode, the entropy and the boolean keys every method reads (read by the project's reader: 0 and
    # "false" are false, "maybe", 2 and null are errors naming the key), before verl's dataclass reads them its way
    method = check_runnable(cfg)
    if estimator not in ESTIMATORS and "norm_adv_by_std_in_grpo" in algo:
        norm = algo["norm_adv_by_std_in_grpo"]
        config_bool(norm, "algorithm.norm_adv_by_std_in_grpo")
        if isinstance(norm, str):  # 0 and 1 read by truthiness are false and true: only a string reads wrongly
            raise ValueError(
                f"algorithm.norm_adv_by_std_in_grpo={norm!r}: verl's own estimator {estimator} reads this key by "
                "Python truthiness (a non-empty string is true); write true or false (or 1 or 0)"
            )
    read_bool(cfg.algorithm.get("rollout_correction") or {}, "bypass_mode", False, "algorithm.rollout_correction")

    for name in METHODS:  # the methods' own sections (algorithm.stare, algorithm.forking, ...) are ours
        algo.pop(name, None)
    omega_conf_to_dataclass(OmegaConf.create(algo))
    get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    get_trainer_cls(cfg.trainer.v1.trainer_mode)
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    resolve_reward_manager_cls(cfg)
    fn = cfg.reward.get("custom_reward_function") or {}
    if fn.get("path"):
        load_extern_object(fn.path, fn.name)
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if mt.enable and mt.tool_config_path and not os.path.exists(mt.tool_config_path):
        raise FileNotFoundError(
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path: {mt.tool_config_path}"
        )
    return None if method is None else method.config
