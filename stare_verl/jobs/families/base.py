"""The jobs' family descriptor (:class:`JobFamily`) and its registry.

A job family is what ``--family`` names (``tooluse``, ``shortcot``, ``longcot``, or a registered new one): its
environment family (``envs.family.EnvFamily``: names, agent loop, reward entry, row builder, prompts), the
reasoning-gym task table and demonstrations of its CPU default, the cold-start SFT's defaults and the accuracy RL
needs from it, its CPU and GPU recipes, the defaults of ``make compare`` and the held-out evaluation's turn handling.
Code asks the descriptor (:func:`job_family`); no module compares the names. The built-ins live in
``stare_verl.jobs.families.tooluse`` and ``.cot`` and are registered on first lookup; a new family is an ``envs``
folder with its ``EnvFamily`` plus a ``JobFamily`` passed to :func:`register_job_family`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from envs.family import EnvFamily, env_family

__all__ = [
    "DEFAULT_FAMILY",
    "JobFamily",
    "PretrainedTask",
    "job_families",
    "job_family",
    "job_family_names",
    "register_job_family",
    "row_job_family",
    "unregister_job_family",
]

DEFAULT_FAMILY = "tooluse"
"""The family of ``--family``'s default (``make train-tooluse``, ``make compare``, the SFT and evaluation CLIs)."""


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class JobFamily:
    """One family as the jobs see it.

    Attributes:
        name: the job spelling (``--family``, run folders ``runs/<name>-<method>-seed<s>``, ``make train-<name>``).
        env: the ``envs.family`` name of its rows and reward (``extra_info["family"]``), see :attr:`env_family`.
        task_table: reasoning-gym generator -> config of its CPU default's problems (mixed evenly).
        demonstrations: ``(problems, seed=, per_problem=) -> (demos, rejected)``: the cold-start SFT's
            demonstrations (objects with ``tools``, ``prompt()``, ``messages()``, ``assistant_texts()``: see
            ``stare_verl.jobs.demo.sft.encode_demo``); ``rejected`` are the problems left without one.
        accepts: whether a generated question (its ``metadata["expression"]``) belongs to the family (None: all).
        demos_per_problem: demonstrations per SFT problem (``SFTConfig.n_train`` demonstrations come from
            ``n_train // demos_per_problem`` problems).
        sft_defaults: ``SFTConfig`` fields the caller did not set (a ``model`` dict is merged under the caller's).
        legacy_sft_key: the SFT cache key leaves ``family`` and ``demos_per_problem`` out (tool use: its keys
            predate the field, and existing checkpoints must still be found); else both are in it.
        min_sft_accuracy: held-out greedy accuracy the SFT checkpoint needs before RL (``--min-sft-accuracy``).
        cpu_recipe: ``recipes/cpu/<cpu_recipe>_<method>.yaml`` (the tiny model's).
        gpu_recipe: ``recipes/<gpu_recipe>_<method>.yaml`` (None: no GPU recipe).
        tool_config: the tool config of its GPU recipe, relative to ``recipes/`` (None: no tool, no sandbox).
        compare_steps, compare_seeds: ``make compare``'s default RL steps per run and seeds per method.
        compare_dir: ``make compare``'s default output folder under ``runs/``.
        reward_options: ``envs.reward`` options every row of the family carries (``extra_info["reward_options"]``),
            so training and the held-out evaluation score alike.
        pretrained: the family's task for a pretrained model (``--model NAME|PATH``; :meth:`for_pretrained`), None
            when the family has none.
        distinct_expressions: splits are disjoint by expression, not only by question text (a small pool of sums
            asked in several wordings: the held-out problems must be sums RL never saw).
    """

    name: str
    env: str
    task_table: Mapping[str, Mapping[str, Any]]
    demonstrations: Callable[..., tuple[list, list]]
    accepts: Callable[[str], bool] | None = None
    demos_per_problem: int = 1
    sft_defaults: Mapping[str, Any] = field(default_factory=dict)
    legacy_sft_key: bool = False
    min_sft_accuracy: float = 0.5
    cpu_recipe: str = ""
    gpu_recipe: str | None = None
    tool_config: str | None = None
    compare_steps: int = 30
    compare_seeds: tuple[int, ...] = (0, 1, 2)
    compare_dir: str = ""
    reward_options: Mapping[str, Any] = field(default_factory=dict)
    pretrained: PretrainedTask | None = None
    distinct_expressions: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "task_table", _frozen({k: _frozen(v) for k, v in self.task_table.items()}))
        object.__setattr__(self, "sft_defaults", _frozen(self.sft_defaults))
        object.__setattr__(self, "reward_options", _frozen(self.reward_options))
        object.__setattr__(self, "compare_seeds", tuple(self.compare_seeds))
        if not self.cpu_recipe:
            object.__setattr__(self, "cpu_recipe", f"{self.name}_tiny")
        if not self.compare_dir:
            object.__setattr__(self, "compare_dir", f"compare-{self.name}")
        if not self.task_table:
            raise ValueError(f"family {self.name!r}: empty task table")
        if self.demos_per_problem < 1:
            raise ValueError(f"family {self.name!r}: demos_per_problem must be >= 1")

    @property
    def env_family(self) -> EnvFamily:
        """Its environment family (``envs.family.env_family(self.env)``)."""
        return env_family(self.env)

    @property
    def multi_turn(self) -> bool:
        """Whether its episodes run the tool loop, so that ``--max-turns`` (assistant turns per episode) applies to
        its RL recipe and held-out evaluation (else one turn)."""
        return self.env_family.tool_use

    def eval_turns(self, max_turns: int) -> int:
        """Assistant turns of one held-out episode given ``--max-turns``."""
        return max_turns if self.multi_turn else 1

    @property
    def is_pretrained(self) -> bool:
        """Whether this is a family's pretrained-model variant (:meth:`for_pretrained`)."""
        return self.cpu_recipe.endswith("_real")

    def for_pretrained(self) -> JobFamily:
        """The family as a pretrained model's CPU run sees it: the same name and environment, the
        :attr:`pretrained` task's problems, reward options and recipe (``recipes/cpu/<recipe>_<method>.yaml``).

        Raises:
            ValueError: the family has no pretrained-model task.
        """
        if self.pretrained is None:
            raise ValueError(f"family {self.name!r} has no task for a pretrained model (--model): use the tiny model")
        if self.is_pretrained:
            return self
        task = self.pretrained
        return replace(self, task_table=task.task_table, accepts=task.accepts, reward_options=task.reward_options,
                       cpu_recipe=task.recipe, min_sft_accuracy=0.0, distinct_expressions=True)  # fmt: skip

    def accepts_expression(self, expression: str) -> bool:
        """Whether a generated question with this ``metadata["expression"]`` belongs to the family."""
        return self.accepts is None or bool(self.accepts(expression))


@dataclass(frozen=True)
class PretrainedTask:
    """A family's task for a pretrained model (``--model``): chosen so that the model starts between roughly 10% and
    60% correct without any fine-tuning, and scored from the model's own tokens.

    Attributes:
        task_table: reasoning-gym generator -> config (mixed evenly), as :attr:`JobFamily.task_table`.
        reward_options: ``envs.reward`` options of its rows (e.g. ``{"last_number": True}``: a prose answer's last
            number counts when there is no box).
        recipe: ``recipes/cpu/<recipe>_<method>.yaml``; must end in ``_real``.
        accepts: which generated expressions belong (None: all).
        sft_warm_start: whether the model needs the family's demonstrations first (a format it cannot produce).
    """

    task_table: Mapping[str, Mapping[str, Any]]
    reward_options: Mapping[str, Any]
    recipe: str
    accepts: Callable[[str], bool] | None = None
    sft_warm_start: bool = False

    def __post_init__(self) -> None:
        if not self.recipe.endswith("_real"):
            raise ValueError(f"a pretrained task's recipe must end in _real, got {self.recipe!r}")


_REGISTRY: dict[str, JobFamily] = {}
_BUILTINS_LOADED = False


def _builtins() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    from stare_verl.jobs.families.cot import LONGCOT, SHORTCOT
    from stare_verl.jobs.families.tooluse import TOOLUSE

    for fam in (TOOLUSE, SHORTCOT, LONGCOT):  # tool use first: the jobs' default
        _REGISTRY.setdefault(fam.name, fam)


def register_job_family(family: JobFamily, *, replace: bool = False) -> JobFamily:
    """Register ``family`` under its name (its ``env`` must be a registered ``envs.family``); returns it.

    Raises:
        ValueError: the name is taken by another family (unless ``replace``), or its environment family is unknown.
    """
    _builtins()
    env_family(family.env)  # ValueError for an unknown one
    old = _REGISTRY.get(family.name)
    if old is not None and old is not family and not replace:
        raise ValueError(f"family {family.name!r} is already registered")
    _REGISTRY[family.name] = family
    return family


def unregister_job_family(name: str) -> None:
    """Remove a registered family (tests; a built-in comes back only in a new process)."""
    _builtins()
    _REGISTRY.pop(name, None)


def job_family(name: str | JobFamily) -> JobFamily:
    """The family registered as ``name`` (a :class:`JobFamily` is returned as it is, so that a variant such as
    :meth:`JobFamily.for_pretrained` passes through the functions that take a family). Raises ValueError, naming the
    registered ones, for an unknown name."""
    if isinstance(name, JobFamily):
        return name
    _builtins()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown family {name!r}; expected one of {job_family_names()}") from None


def job_families() -> tuple[JobFamily, ...]:
    """Every registered family, the built-ins first."""
    _builtins()
    return tuple(_REGISTRY.values())


def job_family_names() -> tuple[str, ...]:
    """The registered names in registration order (``tooluse``, ``shortcot``, ``longcot``, then new ones)."""
    return tuple(f.name for f in job_families())


def row_job_family(env: str | None, tool_use: bool) -> JobFamily:
    """The job family of an evaluation row with ``extra_info["family"] == env`` run with (``tool_use``) or without
    the tool loop (``envs.family.row_env_family``): the first registered family of that environment family
    (the tool-use family for tool-use rows, short CoT, the reward's default family, for other unknown ones)."""
    from envs.family import row_env_family

    target = row_env_family(env, tool_use).name
    return next(f for f in job_families() if f.env == target)
