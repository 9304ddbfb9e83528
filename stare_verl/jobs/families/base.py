"""The jobs' family descriptor (:class:`JobFamily`) and the problems its CPU default works on (:class:`Problem`).

A job family is what ``--family`` names (``tooluse``, ``shortcot``, ``longcot``, or a registered new one): it holds
its environment family (``envs.family.EnvFamily``: its one name and older aliases, agent loop, reward entry, row
builder, prompts) and adds the reasoning-gym task table and demonstrations of its CPU default, the cold-start SFT's
defaults and the accuracy RL needs from it, its CPU and GPU recipes, the defaults of ``make compare`` and the
held-out evaluation's turn handling. Code asks the descriptor (``stare_verl.jobs.families.registry.job_family``);
no module compares the names. The built-ins live in ``stare_verl.jobs.families.tooluse`` and ``.cot``; a new family
is an ``envs`` folder with its ``EnvFamily`` plus a ``JobFamily`` passed to ``register_job_family``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from envs.contract import TOOL_USE
from envs.family import EnvFamily

__all__ = [
    "DATA_SOURCE_PREFIX",
    "DEFAULT_FAMILY",
    "DemoError",
    "JobFamily",
    "PretrainedTask",
    "Problem",
]

DEFAULT_FAMILY = TOOL_USE
"""The family of ``--family``'s default (``make train-tooluse``, ``make compare``, the SFT and evaluation CLIs)."""

DATA_SOURCE_PREFIX = "rg"  # as envs.tool_use.task's offline rows


class DemoError(RuntimeError):
    """The sandbox failed, or printed something other than one line per expression."""


@dataclass(frozen=True)
class Problem:
    """One reasoning-gym question with a Python expression that computes its answer.

    Attributes:
        task: generator name (a key of its family's :attr:`JobFamily.task_table`).
        question: the question text as the generator wrote it.
        answer: ground-truth answer (str, an integer for these tasks).
        expression: ``metadata["expression"]``, valid Python.
        index: position within the generator's dataset (under the split's seed).
    """

    task: str
    question: str
    answer: str
    expression: str
    index: int

    @property
    def data_source(self) -> str:
        """``rg/<task>``: verl groups validation metrics by this."""
        return f"{DATA_SOURCE_PREFIX}/{self.task}"

    @property
    def code(self) -> str:
        """The program a correct demonstration runs."""
        return f"print({self.expression})"


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class JobFamily:
    """One family as the jobs see it.

    Attributes:
        env: its environment family (rows, reward, agent loop, tool); its ``name`` is the family's one name
            (:attr:`name`: ``--family``, ``extra_info["family"]``, run folders ``runs/<name>-<method>-seed<s>``,
            ``make train-<name>``), its ``aliases`` the older spellings still accepted (:attr:`aliases`).
        task_table: reasoning-gym generator -> config of its CPU default's problems (mixed evenly).
        demonstrations: ``(problems, seed=, per_problem=) -> (demos, rejected)``: the cold-start SFT's
            demonstrations (objects with ``tools``, ``prompt()``, ``messages()``, ``assistant_texts()``: see
            ``stare_verl.jobs.demo.encode.encode_demo``); ``rejected`` are the problems left without one.
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

    env: EnvFamily
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
        if not isinstance(self.env, EnvFamily):
            raise TypeError(f"JobFamily.env must be an envs.family.EnvFamily, got {type(self.env).__name__}")
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
    def name(self) -> str:
        """Its one name (its environment family's)."""
        return self.env.name

    @property
    def aliases(self) -> tuple[str, ...]:
        """Older spellings that still name it (its environment family's)."""
        return self.env.aliases

    @property
    def multi_turn(self) -> bool:
        """Whether its episodes run the tool loop, so that ``--max-turns`` (assistant turns per episode) applies to
        its RL recipe and held-out evaluation (else one turn)."""
        return self.env.tool_use

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
