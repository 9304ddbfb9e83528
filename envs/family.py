"""An environment family as one descriptor, registered by name (verl-free; the jobs ask it instead of comparing names).

A family (short CoT, long CoT, tool use, or a new one) is an :class:`EnvFamily`: its name (the data and reward
spelling, ``extra_info["family"]``), the verl agent loop its rows name, its reward entry, its tool (if any), its
system prompt, and the row builder that makes a verl RLHF row one of its rows. Each family folder exposes one:
``envs.cot.SHORT_COT_FAMILY`` / ``LONG_COT_FAMILY``, ``envs.tool_use.TOOL_USE_FAMILY``. They are registered
here on first lookup; a new family registers its own with :func:`register_env_family` (model: SkyRL's
``skyrl_gym.envs.register``, one small object per environment, registered by id).

Lookups: :func:`env_family` (by name), :func:`env_families` (all, built-ins first), :func:`row_env_family` (the
family that scores an evaluation row).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EnvFamily",
    "env_families",
    "env_family",
    "is_tool_family",
    "register_env_family",
    "row_env_family",
    "unregister_env_family",
]


class _FamilySystem:
    def __repr__(self) -> str:
        return "<the family's system prompt>"


FAMILY_SYSTEM: Any = _FamilySystem()
"""Default of :meth:`EnvFamily.make_row`'s ``system``: the family's own ``system_prompt``."""


@dataclass(frozen=True)
class EnvFamily:
    """One environment family.

    Attributes:
        name: the data and reward spelling (``extra_info["family"]``, ``reward_kwargs.family``), e.g. ``tool_use``.
        agent_name: the verl agent loop of its rows (``agent_name`` column): ``stare_tool_agent`` for tool use,
            verl's ``single_turn_agent`` for a family without a tool.
        reward_module, reward_function: the reward entry (verl's ``custom_reward_function``: ``path:
            pkg://<reward_module>``, ``name: <reward_function>``), signature of ``envs.reward.compute_score``.
        tool_name: the tool its episodes call (``tools_kwargs`` of its rows; the evaluation runs the tool loop and
            scores the loop's model text, ``extra_info["model_response_text"]``), None for single-turn families.
        system_prompt: the system message of its rows (None: the rows' prompt is kept as it is).
    """

    name: str
    agent_name: str
    reward_module: str
    reward_function: str = "compute_score"
    tool_name: str | None = None
    system_prompt: str | None = None

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


_REGISTRY: dict[str, EnvFamily] = {}
_BUILTINS_LOADED = False


def _builtins() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    from envs.cot import LONG_COT_FAMILY, SHORT_COT_FAMILY
    from envs.tool_use import TOOL_USE_FAMILY

    for fam in (SHORT_COT_FAMILY, LONG_COT_FAMILY, TOOL_USE_FAMILY):  # the order of envs.contract.FAMILIES
        _REGISTRY.setdefault(fam.name, fam)


def register_env_family(family: EnvFamily, *, replace: bool = False) -> EnvFamily:
    """Register ``family`` under its name; returns it. Raises ValueError for a name already taken by another one
    (unless ``replace``)."""
    _builtins()
    old = _REGISTRY.get(family.name)
    if old is not None and old != family and not replace:
        raise ValueError(f"environment family {family.name!r} is already registered")
    _REGISTRY[family.name] = family
    return family


def unregister_env_family(name: str) -> None:
    """Remove a registered family (tests; a built-in comes back only in a new process)."""
    _builtins()
    _REGISTRY.pop(name, None)


def env_family(name: str) -> EnvFamily:
    """The family registered as ``name``. Raises ValueError (naming the registered ones) for an unknown name."""
    _builtins()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown environment family {name!r}; expected one of {sorted(_REGISTRY)}") from None


def env_families() -> tuple[EnvFamily, ...]:
    """Every registered family, built-ins first."""
    _builtins()
    return tuple(_REGISTRY.values())


def is_tool_family(name: Any) -> bool:
    """Whether ``name`` (e.g. a row's ``extra_info["family"]``) is a registered family whose episodes use a tool."""
    _builtins()
    fam = _REGISTRY.get(name) if isinstance(name, str) else None
    return fam is not None and fam.tool_use


def row_env_family(name: str | None, tool_use: bool) -> EnvFamily:
    """The family whose reward scores a row with ``extra_info["family"] == name`` run with (``tool_use``) or without
    the tool loop: the registered family of that name when its tool use matches, else the built-in tool-use family
    (tool loop) or short CoT (``envs.reward.compute_score``'s default family, which reads ``name`` itself)."""
    from envs.contract import SHORT_COT, TOOL_USE

    _builtins()
    fam = _REGISTRY.get(name) if isinstance(name, str) else None
    if fam is not None and fam.tool_use == bool(tool_use):
        return fam
    return _REGISTRY[TOOL_USE if tool_use else SHORT_COT]
