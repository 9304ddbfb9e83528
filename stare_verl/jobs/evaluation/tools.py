"""The tools of tool-use episodes: loaded from a verl tool config (:func:`load_tools`) and run by the training
loop's tool-call runner (:func:`tool_runner`).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from stare_verl.jobs.evaluation.settings import EvalSettings

__all__ = ["default_tool_config", "load_tools", "tool_runner"]


def default_tool_config() -> Path:
    """The project's tool config, ``recipes/tool_use/tool_config.yaml`` (what :func:`load_tools` reads without one
    given; it may be absent from an install without the recipes)."""
    from stare_verl.recipe_files import recipes_dir

    return recipes_dir() / "tool_use" / "tool_config.yaml"


def load_tools(tool_config: str | Path | None = None) -> dict[str, Any]:
    """The tools of a verl tool config YAML (``multi_turn.tool_config_path``), by name.

    ``None``: the project's ``recipes/tool_use/tool_config.yaml`` when present, else ``code_interpreter`` with
    its defaults. Tools are built with verl's ``initialize_tools_from_config``.

    Raises:
        FileNotFoundError: ``tool_config`` given but missing. ValueError: a file that is no readable YAML, no
            mapping with a non-empty ``tools`` list, or whose tools verl cannot build (an unknown ``class_name``,
            a bad schema); the message names the file. envs.sandbox.SandboxUnavailable: no sandbox.
    """
    if tool_config is None:
        default = default_tool_config()
        if default.is_file():
            tool_config = default
    if tool_config is None:
        from envs.tools.code_interpreter import CodeInterpreterTool

        tool = CodeInterpreterTool({"type": "native", "session_key": "trajectory"})
        return {tool.tool_schema.function.name: tool}
    if Path(tool_config).is_dir():
        raise ValueError(f"tool config {tool_config} is a folder: give the YAML file")
    if not Path(tool_config).is_file():
        raise FileNotFoundError(f"tool config {tool_config} does not exist")
    _check_tool_config(Path(tool_config))  # before verl is imported: its import warnings do not bury the error
    from verl.tools.tool_registry import initialize_tools_from_config

    from envs.sandbox import SandboxUnavailable

    try:
        with contextlib.redirect_stdout(sys.stderr):  # verl prints each tool schema
            tools = initialize_tools_from_config(str(tool_config))
    except SandboxUnavailable:
        raise
    except Exception as err:  # noqa: BLE001 - verl's own errors (an unknown class, a bad schema): one line
        raise ValueError(f"tool config {tool_config}: verl cannot build its tools: {_one_line(err)}") from None
    return {t.tool_schema.function.name: t for t in tools}


def _one_line(err: BaseException) -> str:
    """``Type: message`` with the message's lines folded into one (OmegaConf's errors span several)."""
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _check_tool_config(path: Path) -> None:
    """Raise ValueError unless ``path`` is readable YAML holding a mapping with a non-empty ``tools`` list of
    mappings, each naming a ``class_name`` (verl's tool config format, ``multi_turn.tool_config_path``)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    try:
        raw = OmegaConf.load(path)
    except Exception as err:  # noqa: BLE001 - binary or malformed file: one line naming it
        raise ValueError(f"tool config {path} is no readable YAML: {_one_line(err)}") from None
    tools = raw.get("tools") if isinstance(raw, DictConfig) else None
    if not isinstance(tools, ListConfig) or len(tools) == 0:
        raise ValueError(f"tool config {path} is no verl tool config: expected a mapping with a non-empty `tools` "
                         "list (see recipes/tool_use/tool_config.yaml)")  # fmt: skip
    for i, tool in enumerate(tools):
        if not isinstance(tool, DictConfig) or not tool.get("class_name"):
            raise ValueError(f"tool config {path}: tools[{i}] names no class_name")


def tool_runner(tools: dict[str, Any], settings: EvalSettings, tool_timeout_s: float | None = None) -> Any:
    """The training loop's ``envs.tool_use.episode.ToolCallRunner`` over ``tools`` with the settings' per-turn
    call limit, observation cut and deadline (``tool_timeout_s`` overrides ``settings.tool_timeout_s``)."""
    from envs.tool_use.episode import ToolCallRunner

    return ToolCallRunner(
        tools,
        max_parallel_calls=settings.max_parallel_calls,
        tool_timeout_s=settings.tool_timeout_s if tool_timeout_s is None else tool_timeout_s,
        max_tool_response_chars=settings.max_tool_response_chars,
        truncate_side=settings.tool_response_truncate_side,
    )
