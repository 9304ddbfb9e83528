"""The held-out evaluations around a tiny-model run's RL: accuracy before and after (greedy and T = 1, pass@k with
several samples), the policy's entropy on fixed held-out episodes at each saved checkpoint, and their caches
(the SFT checkpoint's evaluation and episodes next to it, shared by every run from it; the run's evaluation before
RL under the settings it was made with).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from stare_verl.jobs.families import job_family
from stare_verl.jobs.runlog import is_probe_result


def evaluate_heldout(path: Path, sft_cfg, n: int, max_turns: int, samples: int = 1) -> dict[str, Any]:
    """The held-out evaluation of the checkpoint at ``path`` on the first ``n`` held-out problems of ``sft_cfg``'s
    data seed (:func:`stare_verl.jobs.demo.evaluate.evaluate_checkpoint`), greedy and at T = 1 with ``samples``
    samples per problem (``max_turns`` assistant turns where the family's episodes have turns), as
    ``{"T=0": report, "T=1": report}``."""
    from stare_verl.jobs.demo.evaluate import evaluate_checkpoint

    kw: dict[str, Any] = {"family": sft_cfg.family, "samples": samples}
    if job_family(sft_cfg.family).multi_turn:
        kw["max_assistant_turns"] = max_turns

    reports = evaluate_checkpoint(path, n=n, data_seed=sft_cfg.data_seed, n_heldout=sft_cfg.n_heldout, **kw)
    return {f"T={t:g}": rep.to_dict() for t, rep in reports.items()}


def evaluate_sft_cached(sft_dir: Path, sft_cfg, n: int, max_turns: int, samples: int = 1) -> dict[str, Any]:
    """:func:`evaluate_heldout` of the cached SFT checkpoint, itself cached next to it (``eval_n<n>_turns<t>.json``):
    every run from that checkpoint shares one held-out evaluation before RL (greedy and T = 1 sampling with a
    fixed seed, so a rerun would give the same numbers). Written atomically, as runs may share the cache."""
    turns = job_family(sft_cfg.family).eval_turns(max_turns)
    cached = sft_dir / (f"eval_n{n}_turns{turns}" + (f"_k{samples}" if samples > 1 else "") + ".json")
    if cached.is_file():
        try:
            return json.loads(cached.read_text())
        except ValueError:
            pass  # a torn or foreign file: evaluate again
    ev = sft_report_eval(sft_dir, sft_cfg, n, max_turns, samples) or evaluate_heldout(sft_dir, sft_cfg, n, max_turns,
                                                                                       samples)  # fmt: skip
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(ev, indent=1))
    os.replace(tmp, cached)
    return ev


def heldout_entropy_curve(sft_dir: Path, ckpts: list[tuple[int, Path]], n: int, name: str) -> dict[str, Any] | None:
    """The policy's entropy on fixed episodes over RL (``entropy_report``'s ``heldout_entropy``):
    ``stare_verl.jobs.demo.evaluate.reference_entropy`` of the SFT checkpoint (``before``, step 0) and of each RL
    checkpoint of ``ckpts`` (``(step, HF model folder)``, oldest first; ``after``: the last) on the first ``n``
    held-out problems' demonstrations, as ``{"before", "after", "by_step": [{"step": s, **probe}, ...]}``. The
    episodes and the SFT checkpoint's value are cached next to it (``heldout_entropy_n<n>.json``, written
    atomically: runs share the cache), so a run from a cached checkpoint reads its RL checkpoints only (~3 s each on
    2 cores). A diagnostic, never the reason a trained run reports nothing: an earlier checkpoint that cannot be
    read is left out of ``by_step`` with a warning; when the probe itself fails (no sandbox, no demonstration) or
    the last checkpoint cannot be read, a warning and None."""
    from stare_verl.jobs.demo.evaluate import heldout_entropy, heldout_episodes

    cached = sft_dir / f"heldout_entropy_n{n}.json"

    def warn(what: str, err: Exception) -> None:
        print(f"[{name}] warning: {what} ({type(err).__name__}: {err})", file=sys.stderr, flush=True)

    try:
        if not ckpts:
            raise ValueError("no RL checkpoint with weights")
        try:
            ref = json.loads(cached.read_text())
            episodes, before = ref["episodes"], ref["before"]
            if not (is_probe_result(before) and isinstance(episodes, list) and episodes
                    and all(isinstance(e, list) and len(e) == 2 for e in episodes)):  # fmt: skip
                raise ValueError("not the probe's cache")
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or a torn / foreign file: build it again
            print(f"[{name}] held-out entropy: building {cached.name} (the held-out demonstrations)", flush=True)
            episodes = heldout_episodes(sft_dir, n)
            before = heldout_entropy(sft_dir, episodes)
            tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"episodes": episodes, "before": before}))
            os.replace(tmp, cached)
    except Exception as err:
        warn("no held-out entropy", err)
        return None
    by_step = [{"step": 0, **before}]
    for i, (step, path) in enumerate(ckpts):
        try:
            by_step.append({"step": step, **heldout_entropy(path, episodes)})
        except Exception as err:
            if i < len(ckpts) - 1:
                warn(f"held-out entropy of step {step} left out ({path})", err)
                continue
            warn(f"no held-out entropy: the last checkpoint ({path}) cannot be read; if the cached episodes are at "
                 f"fault, delete {cached} to build them again", err)  # fmt: skip
            return None
    after = {k: v for k, v in by_step[-1].items() if k != "step"}
    return {"before": before, "after": after, "by_step": by_step}


def sft_report_eval(sft_dir: Path, sft_cfg, n: int, max_turns: int, samples: int) -> dict[str, Any] | None:
    """The SFT's own final held-out evaluation (``sft_report.json``'s ``heldout``) in :func:`evaluate_heldout`'s
    form, when it is the same evaluation: all ``n_heldout`` problems, one sample per problem, greedy and T = 1 with
    seed 0, the default assistant turns. It ran on the in-memory model that was saved (the same numbers as loading
    it again: checked on the tool-use default), so the first run of a checkpoint does not evaluate it twice (~16 s
    on 2 cores). None when anything differs, or the report lacks it."""
    from stare_verl.jobs.demo.evaluate import DEFAULT_MAX_ASSISTANT_TURNS
    from stare_verl.jobs.demo.sft import read_report

    if samples != 1 or n != sft_cfg.n_heldout:
        return None
    if job_family(sft_cfg.family).multi_turn and max_turns != DEFAULT_MAX_ASSISTANT_TURNS:
        return None
    try:
        heldout = read_report(sft_dir)["heldout"]
        ev = {"T=0": heldout["T=0.0"], "T=1": heldout["T=1.0"]}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return ev if all(_is_eval_entry(v, n) for v in ev.values()) else None


def _is_eval_entry(v: Any, n: int) -> bool:
    """Whether ``v`` is one temperature's evaluation of ``n`` problems, one sample each, with an accuracy in [0, 1]
    (what :func:`format_eval` and the summary read)."""
    if not isinstance(v, dict):
        return False
    acc, count, spp = v.get("accuracy"), v.get("n"), v.get("samples_per_problem", 1)
    numeric = isinstance(acc, (int, float)) and not isinstance(acc, bool)
    return numeric and 0.0 <= acc <= 1.0 and type(count) is int and count == n and spp == 1


def format_eval(ev: dict[str, Any]) -> str:
    """A held-out evaluation (``{"T=0": report, ...}``) in one line: accuracy, pass@k with several samples."""

    def one(k: str, v: dict[str, Any]) -> str:
        spp = v.get("samples_per_problem", 1)
        if spp <= 1:
            return f"{k}: acc {v['accuracy']:.3f} ({v['n']} problems)"
        passes = ", ".join(f"pass@{kk} {p:.3f}" for kk, p in v.get("pass_at_k", {}).items())
        return f"{k}: acc {v['accuracy']:.3f}, {passes} ({v['n'] // spp} problems x {spp})"

    return ", ".join(one(k, v) for k, v in ev.items())


def cached_eval_before(path: Path, key: dict[str, Any], evaluate) -> dict[str, Any]:
    """The run's held-out evaluation before RL (``path``, ``eval_before.json``), made by ``evaluate()`` unless a file
    made with the same settings ``key`` is there (``eval_before.key.json`` beside it): a cached one of other settings
    (another --eval-samples, --n-eval, --max-turns or model: a resumed run given other options) is evaluated again,
    never reused."""
    key_file = path.with_name(path.name.removesuffix(".json") + ".key.json")
    try:
        if json.loads(key_file.read_text()) == key:
            cached = json.loads(path.read_text())
            if isinstance(cached, dict) and cached:
                return cached
    except (OSError, ValueError):
        pass  # no key (an earlier version's cache), a torn key or a torn evaluation: evaluated again
    key_file.unlink(missing_ok=True)
    result = evaluate()
    path.write_text(json.dumps(result, indent=1))
    key_file.write_text(json.dumps(key))
    return result
