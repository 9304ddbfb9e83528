"""Compose and validate the project's verl recipes (Hydra YAMLs under ``recipes/``) without launching.

The recipes are found with :func:`stare_verl.recipe_files.recipes_dir` (package data, so an installed wheel
works from any working directory).
"""

from __future__ import annotations

import contextlib
import difflib
import io
import math
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from stare_verl.recipe_files import recipes_dir, register_resolver

__all__ = ["CONFIG_BOUNDS", "compose_recipe", "config_problem", "is_override", "override_problem", "recipe_names",
           "recipes_dir", "validate_recipe"]

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
        hydra.errors.ConfigCompositionException: a bad override; a key the config does not have (a typo) names the
            nearest key it has, in one line (:func:`_unknown_key`).
        ValueError: a word that is no Hydra override, or one with an empty value (:func:`override_problem`).
        omegaconf.errors.InterpolationResolutionError: an interpolation does not resolve (e.g. a missing file).
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    problem = next(filter(None, map(override_problem, overrides or [])), None)
    if problem:
        raise ValueError(problem)
    folder = Path(folder or recipes_dir())
    if "/" in name.removesuffix(".yaml"):  # e.g. "cpu/shortcot_tiny_stare": its folder is the config dir
        sub, name = name.removesuffix(".yaml").rsplit("/", 1)
        folder = folder / sub
    register_resolver()
    with initialize_config_dir(config_dir=str(folder.resolve()), version_base=None):
        try:
            cfg = compose(config_name=name, overrides=list(overrides or []))
        except ConfigCompositionException as err:
            better = _unknown_key(str(err), overrides or [], lambda: compose(config_name=name))
            if better is None:
                raise
            raise ConfigCompositionException(better) from err
    if resolve:
        OmegaConf.resolve(cfg)
    return cfg


_NO_KEY = re.compile(r"^Could not override '([^']+)'|^Could not delete from config\. '([^']+)' does not exist")


def _unknown_key(message: str, overrides: list[str], base: Any) -> str | None:
    """One line for Hydra's error ``message`` about an override of a key the config does not have (Hydra says
    "To append to your config use +key=value", which for a typo is the wrong advice), naming the nearest key the
    recipe has (``difflib``; ``base()``: the recipe composed without overrides) or an entropy-control method takes
    (``algorithm.<method>.<field>``); None for any other error (Hydra's own message stands)."""
    found = _NO_KEY.match(message)
    if not found:
        return None
    key = found.group(1) or found.group(2)
    given = next((o for o in overrides if o.lstrip("~+").split("=", 1)[0] == key), key)
    from stare_verl.methods import METHODS

    fields = {f"algorithm.{m}.{f}" for m, cls in METHODS.items() for f in cls.Config.model_fields}
    if key in fields:  # a method's setting the recipe does not list: Hydra's advice is the right one
        return f"override {given!r}: {key} is not in this recipe; add it with +{given.lstrip('+~')}"
    keys = _dotted_keys(OmegaConf.to_container(base(), resolve=False)) | fields | {f"algorithm.{m}" for m in METHODS}
    parts = key.split(".")
    depth = max((i for i in range(len(parts)) if ".".join(parts[:i]) in keys), default=0)  # deepest existing section
    parent, rest = ".".join(parts[:depth]), parts[depth + 1 :]
    section = sorted(k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent)
    near = difflib.get_close_matches(parts[depth], section, n=1, cutoff=0.75)
    if near:
        nearest = ".".join([*parts[:depth], near[0], *rest])
        hint = f"did you mean {nearest if nearest in keys else '.'.join([*parts[:depth], near[0]])}?"
    elif section and len(section) <= _LISTED_KEYS:
        hint = f"the keys of {parent or 'the config'}: {', '.join(section)}"
    elif parent and not section:
        hint = f"{parent} holds a value, not keys"
    else:
        hint = f"no key of {parent or 'the config'} is near {parts[depth]}"
    method = parent.removeprefix("algorithm.") if parent.startswith("algorithm.") else None
    if not near and method not in METHODS and not given.startswith("~"):  # a method's section: its fields only
        hint += f" (a key the recipe does not have is added with +{given.lstrip('+')})"
    return f"override {given!r}: no key {key} in this recipe; {hint}"


_LISTED_KEYS = 20
"""The most keys of a section an unknown key's message lists (when none is near it)."""


def _dotted_keys(node: Any, prefix: str = "") -> set[str]:
    """Every key of a nested mapping (sections and leaves), dotted (``algorithm.stare.reweight_w``)."""
    out: set[str] = set()
    if isinstance(node, dict):
        for k, v in node.items():
            out.add(f"{prefix}{k}")
            out |= _dotted_keys(v, f"{prefix}{k}.")
    return out


CONFIG_BOUNDS: tuple[tuple[str, type, str], ...] = (
    ("data.max_prompt_length", int, ">= 1"),
    ("data.max_response_length", int, ">= 1"),
    ("data.train_batch_size", int, ">= 1"),
    ("actor_rollout_ref.actor.optim.lr", float, "(0, 1]"),
    ("actor_rollout_ref.actor.optim.weight_decay", float, ">= 0"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", float, "[0, 1]"),
    ("actor_rollout_ref.actor.optim.clip_grad", float, "> 0"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", int, ">= 1"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", int, ">= 1"),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", int, ">= 1"),
    ("actor_rollout_ref.actor.ppo_epochs", int, ">= 1"),
    ("actor_rollout_ref.actor.clip_ratio", float, "> 0"),
    ("actor_rollout_ref.actor.clip_ratio_low", float, "> 0"),
    ("actor_rollout_ref.actor.clip_ratio_high", float, "> 0"),
    ("actor_rollout_ref.actor.clip_ratio_c", float, "> 1"),
    ("actor_rollout_ref.actor.entropy_coeff", float, ">= 0"),
    ("actor_rollout_ref.actor.kl_loss_coef", float, ">= 0"),
    ("actor_rollout_ref.rollout.n", int, ">= 1"),
    ("actor_rollout_ref.rollout.temperature", float, ">= 0"),
    ("actor_rollout_ref.rollout.top_p", float, "(0, 1]"),
    ("actor_rollout_ref.rollout.top_k", int, ">= -1"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", float, "(0, 1]"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", int, ">= 1"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", int, ">= 1"),
    ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", int, ">= 1"),
    ("actor_rollout_ref.rollout.val_kwargs.n", int, ">= 1"),
    ("actor_rollout_ref.rollout.val_kwargs.temperature", float, ">= 0"),
    ("actor_rollout_ref.rollout.val_kwargs.top_p", float, "(0, 1]"),
    ("algorithm.gamma", float, "[0, 1]"),
    ("algorithm.lam", float, "[0, 1]"),
    ("algorithm.kl_ctrl.kl_coef", float, ">= 0"),
    ("trainer.total_epochs", int, ">= 1"),
    ("trainer.total_training_steps", int, ">= 1"),
    ("trainer.n_gpus_per_node", int, ">= 1"),
    ("trainer.nnodes", int, ">= 1"),
)
"""The numeric keys of a verl config that users commonly override, as ``(dotted key, int or float, allowed
range)``: ``>= 1``, ``> 0``, ``(0, 1]`` (open and closed ends), checked by :func:`config_problem` on the composed
config. verl's own checks (``validate_config``, the ``ActorConfig`` / ``RolloutConfig`` / ``OptimizerConfig``
dataclasses) leave these to the workers, which fail (or train on) them minutes into a run. A key absent from the
config is not checked; the keys of :data:`_NULL_IS_VERLS` may be null. The entropy-control methods' own sections
(``algorithm.stare``, ...) are their pydantic configs' (:func:`validate_recipe`)."""

_NULL_IS_VERLS = frozenset({
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",  # null: the deprecated ppo_micro_batch_size, or dynamic
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.clip_ratio_low",  # null: clip_ratio
    "actor_rollout_ref.actor.clip_ratio_high",
    "actor_rollout_ref.actor.optim.clip_grad",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",  # null: no limit
    "trainer.total_training_steps",  # null: trainer.total_epochs decide
})  # fmt: skip
_RANGE = re.compile(r"^(?:(>=|>) (-?[\d.]+)|([\[(])(-?[\d.]+), (-?[\d.]+)([\])]))$")


def _in_range(value: float, allowed: str) -> bool:
    """Whether ``value`` lies in ``allowed`` (a range of :data:`CONFIG_BOUNDS`)."""
    m = _RANGE.match(allowed)
    if m is None:
        raise ValueError(f"no range: {allowed!r}")
    if m.group(1):
        lo = float(m.group(2))
        return value >= lo if m.group(1) == ">=" else value > lo
    lo, hi = float(m.group(4)), float(m.group(5))
    return (value >= lo if m.group(3) == "[" else value > lo) and (value <= hi if m.group(6) == "]" else value < hi)


def _value_problem(key: str, kind: type, allowed: str, value: Any) -> str | None:
    """``<key> must be <an integer / a number> <range> (got <value>)`` when ``value`` is not a finite number of
    ``kind`` in ``allowed`` (a bool or a string is none; an int is a float's number), else None."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = number and isinstance(value, int)
    else:
        ok = number and math.isfinite(value)
    if ok and _in_range(value, allowed):
        return None
    what = "an integer" if kind is int else "a number"
    where = allowed if allowed[0] in "<>" else f"in {allowed}"
    return f"{key} must be {what} {where} (got {value!r})"


def config_problem(cfg: DictConfig) -> str | None:
    """What in a composed verl config (``cfg``, after the overrides) is out of range, as one line, or None.

    Checks each key of :data:`CONFIG_BOUNDS` present in ``cfg`` (its type and range), that the batch sizes split
    into whole mini- and micro-batches as verl's actor update needs (checked only once the ranges hold), a rollout
    temperature > 0
    where sampling is on (``actor_rollout_ref.rollout.do_sample``, ``val_kwargs.do_sample``), and that
    ``actor_rollout_ref.model.path``, when it is an existing folder here, holds ``config.json`` (a folder that is
    no model; a path missing here may be a hub id or another node's folder). Run before anything is written or
    launched (``stare-verl train`` and its dry run, ``compare``, ``stare-verl check`` via :func:`validate_recipe`).

    Returns:
        The problems, ``"; "``-joined, each ``<key> must be ... (got X)``; None when there are none.
    """
    said = []
    for key, kind, allowed in CONFIG_BOUNDS:
        value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)  # ??? (the driver's): absent
        if value is _ABSENT or (value is None and key in _NULL_IS_VERLS):
            continue
        problem = _value_problem(key, kind, allowed, value)
        if problem:
            said.append(problem)
    rollout = cfg.get("actor_rollout_ref", {}).get("rollout", {})
    for where, section in (("actor_rollout_ref.rollout", rollout), ("actor_rollout_ref.rollout.val_kwargs",
                                                                     rollout.get("val_kwargs", {}))):  # fmt: skip
        temperature = section.get("temperature")
        if section.get("do_sample") is True and temperature == 0 and not isinstance(temperature, bool):
            said.append(f"{where}.temperature must be > 0 when {where}.do_sample is true (got {temperature!r}; "
                        f"0 is greedy: {where}.do_sample=false)")  # fmt: skip
    if not said:
        said.extend(_batch_problems(cfg))
    path = cfg.get("actor_rollout_ref", {}).get("model", {}).get("path")
    folder = Path(path).expanduser() if isinstance(path, str) else None
    if folder is not None and folder.is_dir() and not (folder / "config.json").is_file():
        said.append(f"actor_rollout_ref.model.path must be a model folder with config.json (got {path}, a folder "
                    "without one)")  # fmt: skip
    return "; ".join(said) or None


_ABSENT = object()


def _batch_problems(cfg: DictConfig) -> list[str]:
    """The batch sizes verl's actor update refuses only at its first mini-batch: the rollout batch must split into
    whole mini-batches (``data.train_batch_size`` a multiple of ``actor.ppo_mini_batch_size``, both in prompts), and
    without ``use_dynamic_bsz`` each rank's share of a mini-batch (``ppo_mini_batch_size * rollout.n`` sequences over
    ``trainer.n_gpus_per_node * trainer.nnodes`` ranks) must split into whole micro-batches of
    ``ppo_micro_batch_size_per_gpu`` sequences. Keys absent or not integers (checked before) are skipped."""

    def get(key: str) -> Any:
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None

    said = []
    batch, mini = get("data.train_batch_size"), get("actor_rollout_ref.actor.ppo_mini_batch_size")
    if batch and mini and batch % mini:
        said.append(f"data.train_batch_size must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size (got "
                    f"{batch} and {mini} prompts)")  # fmt: skip
    n, micro = get("actor_rollout_ref.rollout.n"), get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
    ranks = (get("trainer.n_gpus_per_node") or 1) * (get("trainer.nnodes") or 1)
    dynamic = OmegaConf.select(cfg, "actor_rollout_ref.actor.use_dynamic_bsz", default=False) is True
    if mini and n and micro and not dynamic:
        per_rank = mini * n // ranks
        if (mini * n) % ranks or per_rank % micro:
            said.append(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu must divide each rank's mini-batch, "
                        f"ppo_mini_batch_size x rollout.n / ranks = {mini} x {n} / {ranks} sequences (got {micro}; "
                        f"verl would stop at the first update)")  # fmt: skip
    return said


def validate_recipe(cfg: DictConfig) -> Any:
    """Validate a composed config with verl's own checks and config dataclasses, plus ours.

    Checks the numeric keys users override (:func:`config_problem`), verl's ``validate_config``, the rollout
    section as ``RolloutConfig``, the algorithm section as ``AlgoConfig`` (without ``stare``), ``algorithm.stare``
    with pydantic, that the estimator and trainer mode are registered and that the reward manager, custom reward
    function and tool config load.

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

    problem = config_problem(cfg)
    if problem:
        raise ValueError(problem)
    from stare_verl.methods import ESTIMATORS, METHODS, check_runnable
    from stare_verl.methods.settings import config_bool, read_bool

    # ours first (the trainer mode, the method's section, the boolean keys every method reads): a user's own YAML
    # with a bad algorithm.stare value hears about it before verl's mandatory keys it may also lack
    method = check_runnable(cfg)
    # verl prints "All configuration checks passed" on success, which reads wrongly right above one of our
    # errors below: keep its other output (warnings), drop that line.
    with contextlib.redirect_stdout(io.StringIO()) as out:
        validate_config(cfg, need_reference_policy(cfg), need_critic(cfg))
    for line in out.getvalue().splitlines():
        if line.strip() and "checks passed" not in line:
            print(line)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout, dataclass_type=RolloutConfig)
    algo: dict[str, Any] = OmegaConf.to_container(cfg.algorithm, resolve=True)  # type: ignore[assignment]
    estimator = cfg.algorithm.adv_estimator
    # (the boolean keys every method reads were read by the project's reader above: 0 and "false" are false,
    # "maybe", 2 and null are errors naming the key, before verl's dataclass reads them its way)
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
