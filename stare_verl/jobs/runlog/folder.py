"""Run folders: :class:`RunFolder` (the paths of ``runs/<run>/``) and the latest checkpoint of a verl checkpoint folder.

**Latest checkpoint** has one meaning in this project, verl's own (``verl.utils.checkpoint.checkpoint_manager.
find_latest_ckpt_path``, what a resumed run starts from): in a verl checkpoint folder
(``trainer.default_local_dir``), the step N written in ``latest_checkpointed_iteration.txt``, provided its
``global_step_N`` folder exists (:func:`latest_checkpoint_step`). Its Hugging Face model folder
(``global_step_N/actor/huggingface`` of RL, ``global_step_N/huggingface`` of verl's SFT trainer) counts only when it
holds weights (:func:`latest_hf_checkpoint`). A different question, "which run under ``runs/`` was checkpointed
last", has its own name: :meth:`RunFolder.newest`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# verl's checkpoint tracker (``get_checkpoint_tracker_filename``): the latest saved step, what a resume loads.
CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"
RL_HF_SUBDIR = "actor/huggingface"  # a global_step_N folder's HF model (checkpoint.save_contents with hf_model)
SFT_HF_SUBDIR = "huggingface"  # the same for verl's SFT trainer
_WEIGHTS = ("*.safetensors", "*.bin")


def has_hf_weights(folder: str | Path) -> bool:
    """Whether ``folder`` is a loadable Hugging Face model folder: ``config.json`` and at least one
    ``*.safetensors`` / ``*.bin`` weight file. Never raises (a missing folder is False)."""
    d = Path(folder)
    return (d / "config.json").is_file() and any(any(d.glob(p)) for p in _WEIGHTS)


def latest_checkpoint_step(checkpoints: str | Path) -> int | None:
    """The latest checkpoint step of a verl checkpoint folder (module docstring): the N in its
    ``latest_checkpointed_iteration.txt`` when ``global_step_N`` exists; None when the tracker is missing or not
    an integer, or its step folder is gone (verl then starts from scratch). Never raises."""
    root = Path(checkpoints)
    try:
        step = int((root / CHECKPOINT_TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None
    return step if (root / f"global_step_{step}").is_dir() else None


def latest_hf_checkpoint(checkpoints: str | Path, hf_subdir: str = RL_HF_SUBDIR) -> Path | None:
    """``<checkpoints>/global_step_N/<hf_subdir>`` of the latest checkpoint (:func:`latest_checkpoint_step`)
    when it holds weights (:func:`has_hf_weights`); None otherwise (an older step is never taken instead).
    ``hf_subdir``: :data:`RL_HF_SUBDIR` (verl's PPO trainer) or :data:`SFT_HF_SUBDIR` (its SFT trainer).
    Never raises."""
    step = latest_checkpoint_step(checkpoints)
    if step is None:
        return None
    hf = Path(checkpoints) / f"global_step_{step}" / hf_subdir
    return hf if has_hf_weights(hf) else None


def hf_checkpoints(checkpoints: str | Path, hf_subdir: str = RL_HF_SUBDIR) -> list[tuple[int, Path]]:
    """Every ``<checkpoints>/global_step_N/<hf_subdir>`` that holds weights (:func:`has_hf_weights`), as
    ``(N, path)`` in increasing N, up to the latest checkpoint (:func:`latest_checkpoint_step`): a step folder
    past it (one being written when a run stopped) is not taken. ``[]`` when there is none. Never raises."""
    latest = latest_checkpoint_step(checkpoints)
    if latest is None:
        return []
    found = []
    try:
        folders = list(Path(checkpoints).glob("global_step_*"))
    except OSError:
        return []
    for d in folders:
        step = _step_of(d.name.removeprefix("global_step_"))
        if step is not None and step <= latest and has_hf_weights(d / hf_subdir):
            found.append((step, d / hf_subdir))
    return sorted(found)


def _step_of(text: str) -> int | None:
    """The step of a ``global_step_<N>`` folder as verl names it (ASCII digits, no leading zero; "05", "²" or
    "٣" are not steps); None otherwise."""
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        return None
    return int(text)


@dataclass(frozen=True)
class RunFolder:
    """The folder of one RL run (``runs/<family>-<method>-seed<seed>`` or ``RUN_DIR``), as ``stare-verl train``
    writes it and ``compare`` and the evaluation read it. Attributes are paths; nothing is created or read until
    a method says so.

    Layout: ``checkpoints/`` (verl's ``trainer.default_local_dir``: ``global_step_N/actor/huggingface`` and the
    tracker), ``logs/`` (verl's metric parts ``verl_metrics.<time>.jsonl`` and Hydra's output), ``data/``
    (train/val parquet), ``metrics.jsonl`` (the selected metrics of all parts), ``plots/``, ``eval_before.json``
    / ``eval_after.json`` (held-out evaluations; ``eval_before.json`` is reused by a resumed run),
    ``summary.json`` (written last: its presence means the run finished) and ``train.log``.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def checkpoints(self) -> Path:
        """verl's checkpoint folder of the run: ``checkpoints/``; for a folder that is itself a
        ``trainer.default_local_dir`` (its own tracker file, no ``checkpoints/``), the folder itself."""
        sub = self.path / "checkpoints"
        if not sub.is_dir() and (self.path / CHECKPOINT_TRACKER).is_file():
            return self.path
        return sub

    @property
    def logs(self) -> Path:
        """``logs/``: verl's metric parts and Hydra's run folder."""
        return self.path / "logs"

    @property
    def data(self) -> Path:
        """``data/``: the run's train/val parquet files."""
        return self.path / "data"

    @property
    def metrics(self) -> Path:
        """``metrics.jsonl``: one line per step (:func:`stare_verl.jobs.runlog.metrics.write_metrics_jsonl`)."""
        return self.path / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        """``summary.json``: written when the run finished."""
        return self.path / "summary.json"

    @property
    def train_log(self) -> Path:
        """``train.log``: the run's own lines, then everything verl printed."""
        return self.path / "train.log"

    @property
    def plots(self) -> Path:
        """``plots/``: the PNG files of :func:`stare_verl.jobs.runlog.plots.plot_run` and ``dashboard.png``
        (``stare_verl.jobs.dashboard``)."""
        return self.path / "plots"

    @property
    def eval_before(self) -> Path:
        """``eval_before.json``: the held-out evaluation before RL (kept across resumes)."""
        return self.path / "eval_before.json"

    @property
    def eval_after(self) -> Path:
        """``eval_after.json``: the held-out evaluation of the latest checkpoint after RL."""
        return self.path / "eval_after.json"

    def verl_metric_parts(self) -> list[Path]:
        """verl's file-logger parts under ``logs/``, oldest first (one per invocation of the run)."""
        return sorted(self.logs.glob("verl_metrics.*.jsonl"))

    def new_verl_metric_part(self) -> Path:
        """The path of this invocation's verl file-logger part (``logs/verl_metrics.<local time>.jsonl``; not
        created)."""
        return self.logs / f"verl_metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl"

    def checkpoint_step_dir(self, step: int) -> Path:
        """``checkpoints/global_step_<step>`` (whether or not it exists)."""
        return self.checkpoints / f"global_step_{step}"

    def latest_step(self) -> int | None:
        """The latest checkpoint step (:func:`latest_checkpoint_step` of ``checkpoints``); None: none. Never raises."""
        return latest_checkpoint_step(self.checkpoints)

    def latest_checkpoint(self) -> Path | None:
        """The HF model folder of the latest checkpoint (``checkpoints/global_step_N/actor/huggingface``) when it
        holds weights, else None (:func:`latest_hf_checkpoint`). Never raises."""
        return latest_hf_checkpoint(self.checkpoints, RL_HF_SUBDIR)

    def hf_checkpoints(self) -> list[tuple[int, Path]]:
        """``(step, HF model folder)`` of every checkpoint with weights, oldest first (:func:`hf_checkpoints`)."""
        return hf_checkpoints(self.checkpoints, RL_HF_SUBDIR)

    def is_finished(self) -> bool:
        """Whether the run wrote its ``summary.json``."""
        return self.summary.is_file()

    def read_metrics(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` (blank lines skipped).

        Raises:
            FileNotFoundError: no ``metrics.jsonl`` (the run did not get that far); ValueError: a malformed line.
        """
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    def read_summary(self) -> dict[str, Any]:
        """``summary.json`` as a dict. Raises FileNotFoundError (run not finished) or ValueError (malformed)."""
        return json.loads(self.summary.read_text())

    def write_summary(self, summary: dict[str, Any]) -> Path:
        """Write ``summary.json`` (indented JSON); returns its path. Raises OSError / TypeError (not JSON)."""
        self.summary.write_text(json.dumps(summary, indent=1))
        return self.summary

    @classmethod
    def newest(cls, runs_dir: str | Path) -> RunFolder | None:
        """The run under ``runs_dir`` (its direct subfolders) whose latest checkpoint was recorded last (the
        modification time of its tracker file; ties: the larger step, then the name); only runs with a latest
        checkpoint (:meth:`latest_step`) count, with or without HF weights. None when there is none. Never raises.
        """
        best, best_key = None, None
        try:
            children = sorted(p for p in Path(runs_dir).iterdir() if p.is_dir())
        except OSError:
            return None
        for child in children:
            run = cls(child)
            step = run.latest_step()
            if step is None:
                continue
            try:
                mtime = (run.checkpoints / CHECKPOINT_TRACKER).stat().st_mtime
            except OSError:
                continue
            key = (mtime, step, child.name)
            if best_key is None or key > best_key:
                best, best_key = run, key
        return best
