"""An environment family as one descriptor (verl-free; code asks it instead of comparing names).

A family (short CoT, long CoT, tool use, or a new one) is an :class:`EnvFamily`: its name (one spelling everywhere,
``extra_info["family"]``), older spellings it still answers to, the verl agent loop its rows name, its reward entry
and think-mode preset, its tool (if any), its system prompt, its offline reasoning-gym task mix, and the row builder
that makes a verl RLHF row one of its rows. Each family folder exposes one: ``envs.cot.SHORT_COT_FAMILY`` /
``LONG_COT_FAMILY``, ``envs.tool_use.TOOL_USE_FAMILY``; ``envs.families`` registers them (model: SkyRL's
``skyrl_gym.envs.register``, one small object per environment, registered by id).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["FAMILY_SYSTEM", "EnvFamily"]


class _FamilySystem:
    def __repr__(self) -> str:
        return "<the family's system prompt>"


FAMILY_SYSTEM: Any = _FamilySystem()
"""Default of :meth:`EnvFamily.make_row`'s ``system``: the family's own ``system_prompt``."""


@dataclass(frozen=True)
class EnvFamily:
    """One environment family.

    Attributes:
        name: its one spelling (``extra_info["family"]``, ``reward_kwargs.family``, ``--family``), e.g. ``tooluse``.
        agent_name: the verl agent loop of its rows (``agent_name`` column): ``stare_tool_agent`` for tool use,
            verl's ``single_turn_agent`` for a family without a tool.
        reward_module, reward_function: the reward entry (verl's ``custom_reward_function``: ``path:
            pkg://<reward_module>``, ``name: <reward_function>``), signature of ``envs.reward.compute_score``.
        tool_name: the tool its episodes call (``tools_kwargs`` of its rows; the evaluation runs the tool loop and
            scores the loop's model text, ``extra_info["model_response_text"]``), None for single-turn families.
        system_prompt: the system message of its rows (None: the rows' prompt is kept as it is); a family with one
            gets it in every model style (``envs.prompts.build_prompt``).
        aliases: older spellings that still name it (parquet rows, recipes and run folders written before).
        think: the reward's think-mode preset (``envs.reward.RewardOptions.think``'s default): ``"required"`` (the
            answer counts only after a closed ``</think>``) or ``"auto"``.
        offline_tasks: ``(reasoning-gym task, config overrides)`` of its offline procedural set
            (``envs.datasets.build_offline``), mixed evenly; empty: the family has none.
    """

    name: str
    agent_name: str
    reward_module: str
    reward_function: str = "compute_score"
    tool_name: str | None = None
    system_prompt: str | None = None
    aliases: tuple[str, ...] = ()
    think: Literal["auto", "required"] = "auto"
    offline_tasks: tuple[tuple[str, Mapping[str, Any]], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "aliases", tuple(self.aliases))
        object.__setattr__(self, "offline_tasks", tuple((str(t), dict(c)) for t, c in self.offline_tasks))
        if self.think not in ("auto", "required"):
            raise ValueError(f"family {self.name!r}: think must be 'auto' or 'required', got {self.think!r}")

    def __hash__(self) -> int:  # the task configs are dicts
        return hash((self.name, self.agent_name, self.reward_module, self.tool_name))

    @property
    def tool_use(self) -> bool:
        """Whether its episodes run the multi-turn tool loop."""
        return self.tool_name is not None

    @property
    def reward(self) -> Callable[..., dict[str, Any]]:
        """The reward function (imported on first use: a reward module may import heavy scorers)."""
        return getattr(importlib.import_module(self.reward_module), self.reward_function)

    def compute_score(
        self, data_source: str | None, solution_str: str | None, ground_truth: Any,
        extra_info: Mapping[str, Any] | None = None, **reward_kwargs: Any,
    ) -> dict[str, Any]:
        """The family's reward on one response (``extra_info["family"]`` defaults to :attr:`name`)."""
        info = {"family": self.name, **dict(extra_info or {})}
        return self.reward(data_source, solution_str, ground_truth, info, **reward_kwargs)

    def make_row(
        self, row: Mapping[str, Any], *, system: str | None = FAMILY_SYSTEM,
        create_kwargs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``row`` (a verl RLHF row: ``prompt``, ``reward_model``, ``extra_info``, ...) as a row of this family.

        Sets ``extra_info["family"]`` and ``agent_name``; for a tool family ``extra_info.tools_kwargs`` (the tool's
        ``create_kwargs``, default ``{"data_source": <row data_source>}``: parquet cannot store an empty struct) and
        ``need_tools_kwargs``. The system message: ``system`` (default the family's ``system_prompt``) replaces any in
        the prompt, None drops them; with the default and no family system prompt the prompt is left as it is.

        Returns:
            a new row (the input is not changed).
        Raises:
            ValueError: the prompt has no user message (when it is rewritten).
        """
        out = copy.deepcopy(dict(row))
        text = self.system_prompt if system is FAMILY_SYSTEM else system
        if system is not FAMILY_SYSTEM or text is not None:
            msgs = [m for m in out.get("prompt", []) if m.get("role") != "system"]
            if not any(m.get("role") == "user" for m in msgs):
                raise ValueError(f"a {self.name} row needs a user message in its prompt")
            out["prompt"] = ([{"role": "system", "content": text}] if text is not None else []) + msgs
        out["agent_name"] = self.agent_name
        info = dict(out.get("extra_info") or {})
        info["family"] = self.name
        if self.tool_name is not None:
            kwargs = dict(create_kwargs) if create_kwargs is not None else {"data_source": str(out.get("data_source", ""))}
            info["tools_kwargs"] = {self.tool_name: {"create_kwargs": kwargs}}
            info["need_tools_kwargs"] = True
        out["extra_info"] = info
        return out
