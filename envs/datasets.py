"""Dataset builders: verl RLHF parquet for the math families.

Each row has the columns verl's ``RLHFDataset`` reads::

    data_source   str            e.g. "math500", "aime2024", "rg/gsm_symbolic"
    prompt        list[dict]     chat messages (``envs.prompts.build_prompt``)
    ability       str            "math"
    reward_model  {"style": "rule", "ground_truth": str}
    extra_info    {"split", "index", "family", "question", "source_id", ...}

``extra_info["family"]`` selects the reward options preset in ``envs.reward.compute_score``.

Sources (Hugging Face ``datasets``; or ``from_file``: a local .parquet/.jsonl/.json/.csv with the same
fields as the hub dataset):

    gsm8k      openai/gsm8k (config main), splits train/test; question, answer ("... #### 72")
    math500    HuggingFaceH4/MATH-500, split test; problem, answer, subject, level, unique_id
    dapo_math  BytedTsinghua-SIA/DAPO-Math-17k, split train; verl-format rows (prompt, reward_model,
               extra_info.index); the DAPO "Answer:" instructions are stripped, duplicates dropped
    aime2024   HuggingFaceH4/aime_2024, split train (30 problems); id, problem, answer
    aime2025   opencompass/AIME2025, configs AIME2025-I + AIME2025-II, split test; question, answer

Offline procedural sets (no network) come from reasoning-gym, per family (its ``EnvFamily.offline_tasks``).

Network: the hub is probed first (3 s); when it is unreachable (or ``offline=True``) datasets runs in
offline mode and only its cache is used, so a missing dataset fails in about a second with
``DatasetUnavailableError`` instead of minutes of retries.

Bad rows (no question, no answer, an answer that cannot be scored) are never kept silently: they are
dropped and listed with their source index in ``BuildReport.bad`` (the CLI prints them; ``--strict``
makes any bad row an error).

CLI::

    python -m envs.datasets offline --out data/            # reasoning-gym sets for every family
    python -m envs.datasets hub math500 --out data/ --family longcot --style r1_distill
    python -m envs.datasets hub aime2025 --from-file aime25.jsonl --out data/
    python -m envs.datasets all --out data/                # every hub source (needs network or cache)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.contract import LONG_COT, SHORT_COT
from envs.families import env_families, env_family, env_family_names
from envs.prompts import STYLES, build_prompt

__all__ = [
    "SOURCES",
    "BadRow",
    "BuildReport",
    "DatasetUnavailableError",
    "HubSource",
    "build_hub",
    "build_offline",
    "build_rows",
    "hub_mode",
    "hub_reachable",
    "load_records",
    "main",
    "make_row",
    "read_local_records",
    "write_parquet",
]

HF_ENDPOINT = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


class DatasetUnavailableError(RuntimeError):
    """A hub dataset is neither reachable nor cached locally (or a local file is unusable)."""


@dataclass(frozen=True)
class BadRow:
    """A source row that was not kept: its position in the source and why."""

    index: int
    reason: str


@dataclass
class BuildReport:
    """Result of a build: the kept verl rows, the rejected ones and the dropped duplicates."""

    rows: list[dict[str, Any]]
    bad: list[BadRow] = field(default_factory=list)
    duplicates: int = 0


# ----------------------------------------------------------------------------------------------- rows


def make_row(
    question: str,
    answer: str,
    data_source: str,
    index: int,
    split: str,
    family: str = SHORT_COT,
    style: str = "default",
    extra: Mapping[str, Any] | None = None,
    system: str | None = None,
) -> dict[str, Any]:
    """One verl RLHF row.

    Args:
        question: problem text; answer: ground-truth answer string.
        data_source: name used by verl to group validation metrics.
        index: position of the row in the built split; split: "train" / "test".
        family, style: prompt template (``envs.prompts``); ``family`` also goes to ``extra_info``.
        extra: more ``extra_info`` fields (scalars).
        system: system message override for the prompt.
    Raises:
        ValueError: empty question or answer, unknown family/style.
    """
    if not str(answer).strip():
        raise ValueError("empty answer")
    family = env_family(family).name  # ValueError for an unknown one; an alias is written as the name
    info: dict[str, Any] = {"split": split, "index": int(index), "family": family, "question": question.strip()}
    if extra:
        info.update(extra)
    return {
        "data_source": data_source,
        "prompt": build_prompt(question, family, style, system=system),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer).strip()},
        "extra_info": info,
    }


def _scoreable(answer: str) -> bool:
    """The answer, boxed, scores as correct against itself (catches answers our scorer cannot read)."""
    from envs.scoring.verify import answers_equal

    return answers_equal(answer, answer, timeout_s=5.0).equal is True


def build_rows(
    records: Iterable[Mapping[str, Any]],
    to_qa: Callable[[Mapping[str, Any]], tuple[Any, Any, dict[str, Any]]],
    data_source: str,
    split: str,
    family: str = SHORT_COT,
    style: str = "default",
    dedupe: bool = True,
    limit: int | None = None,
    system: str | None = None,
) -> BuildReport:
    """Convert source records to verl rows, reporting bad rows and duplicates.

    Args:
        records: source records (dicts).
        to_qa: maps a record to ``(question, answer, extra_info_fields)``.
        data_source, split, family, style, system: see ``make_row``.
        dedupe: drop records whose question text was already seen (counted in ``duplicates``).
        limit: keep at most this many rows.
    Returns:
        BuildReport; ``extra_info["source_index"]`` is the record's position in ``records``.
    """
    report = BuildReport(rows=[])
    seen: set[str] = set()
    extra_keys: list[str] | None = None
    for i, rec in enumerate(records):
        if limit is not None and len(report.rows) >= limit:
            break
        try:
            q, a, extra = to_qa(rec)
        except Exception as err:  # noqa: BLE001 - malformed record: report it
            report.bad.append(BadRow(i, f"malformed record: {type(err).__name__}: {err}"))
            continue
        q = "" if q is None else str(q).strip()
        a = "" if a is None else str(a).strip()
        if not q:
            report.bad.append(BadRow(i, "empty prompt/question"))
            continue
        if not a or a.lower() in ("none", "nan"):
            report.bad.append(BadRow(i, "missing answer"))
            continue
        if dedupe:
            key = " ".join(q.split())
            if key in seen:
                report.duplicates += 1
                continue
            seen.add(key)
        if not _scoreable(a):
            report.bad.append(BadRow(i, f"answer not scoreable: {a[:80]!r}"))
            continue
        extra = dict(extra or {})
        extra["source_index"] = i
        if extra_keys is None:
            extra_keys = list(extra)
        for k in extra_keys:  # the same extra_info keys on every row (parquet struct)
            extra.setdefault(k, None)
        report.rows.append(
            make_row(q, a, data_source, len(report.rows), split, family, style, extra=extra, system=system)
        )
    return report


def write_parquet(rows: list[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Write verl rows to ``path`` (parent directories created). Returns the path.

    Raises:
        ValueError: no rows.
    """
    import pandas as pd

    if not rows:
        raise ValueError(f"no rows to write to {path}")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(p, index=False)
    return p


# ------------------------------------------------------------------------------------------- sources


def _first(rec: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in rec and rec[k] is not None:
            return rec[k]
    return None


def _gsm8k_qa(rec):
    sol = str(_first(rec, "answer") or "")
    if "####" not in sol:
        return _first(rec, "question"), None, {}
    ans = sol.rsplit("####", 1)[1].strip().replace(",", "")
    return _first(rec, "question"), ans, {}


def _math500_qa(rec):
    extra = {
        "subject": _first(rec, "subject"),
        "level": None if _first(rec, "level") is None else int(_first(rec, "level")),
        "source_id": _first(rec, "unique_id"),
    }
    return _first(rec, "problem", "question"), _first(rec, "answer"), extra


_DAPO_PREFIX = re.compile(
    r"^\s*Solve the following math problem step by step\.\s*The last line of your response should be of the "
    r"form Answer: \$Answer \(without quotes\) where \$Answer is the answer to the problem\.\s*"
)
_DAPO_SUFFIX = re.compile(r"\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*$")


def _dapo_qa(rec):
    prompt = rec.get("prompt")
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, list) and prompt:
        content = prompt[-1]["content"] if isinstance(prompt[-1], Mapping) else str(prompt[-1])
    else:
        content = _first(rec, "problem", "question", "prompt")
    q = _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", str(content or "")))
    rm = rec.get("reward_model") or {}
    ans = rm.get("ground_truth") if isinstance(rm, Mapping) else None
    if ans is None:
        ans = _first(rec, "answer", "solution")
    ei = rec.get("extra_info") or {}
    return q, ans, {"source_id": str(ei.get("index")) if isinstance(ei, Mapping) and ei.get("index") else None}


def _aime_qa(rec):
    sid = _first(rec, "id", "ID", "problem_idx", "unique_id")
    ans = _first(rec, "answer", "Answer")
    if ans is not None:
        ans = str(ans).strip()
        if re.fullmatch(r"0*\d+", ans):
            ans = str(int(ans))  # "033" -> "33"
    return _first(rec, "problem", "question", "Problem"), ans, {"source_id": None if sid is None else str(sid)}


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face dataset: where it lives and how its records map to (question, answer)."""

    name: str
    repo: str
    configs: tuple[str | None, ...]
    splits: Mapping[str, str]  # our split name -> hub split name
    to_qa: Callable[[Mapping[str, Any]], tuple[Any, Any, dict[str, Any]]]
    fields: str  # human-readable schema, for error messages
    default_family: str = SHORT_COT


SOURCES: dict[str, HubSource] = {
    "gsm8k": HubSource(
        "gsm8k", "openai/gsm8k", ("main",), {"train": "train", "test": "test"}, _gsm8k_qa,
        "question, answer ('... #### N')",
    ),
    "math500": HubSource(
        "math500", "HuggingFaceH4/MATH-500", (None,), {"test": "test"}, _math500_qa,
        "problem, answer[, subject, level, unique_id]",
    ),
    "dapo_math": HubSource(
        "dapo_math", "BytedTsinghua-SIA/DAPO-Math-17k", (None,), {"train": "train"}, _dapo_qa,
        "prompt (chat list), reward_model.ground_truth[, extra_info.index]", default_family=LONG_COT,
    ),
    "aime2024": HubSource(
        "aime2024", "HuggingFaceH4/aime_2024", (None,), {"test": "train"}, _aime_qa,
        "problem, answer[, id]", default_family=LONG_COT,
    ),
    "aime2025": HubSource(
        "aime2025", "opencompass/AIME2025", ("AIME2025-I", "AIME2025-II"), {"test": "test"}, _aime_qa,
        "question (or problem), answer", default_family=LONG_COT,
    ),
}


def read_local_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a local dataset file (parquet, jsonl/ndjson, json or csv; csv cells as strings) as dicts.

    Raises:
        DatasetUnavailableError: the file is missing, of another type, or cannot be parsed.
    """
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise DatasetUnavailableError(f"local dataset file not found: {p}")
    suffix = "".join(p.suffixes[-1:]).lower()
    try:
        if suffix == ".parquet":
            df = pd.read_parquet(p)
        elif suffix in (".jsonl", ".ndjson"):
            df = pd.read_json(p, lines=True, dtype=False)
        elif suffix == ".json":
            df = pd.read_json(p, dtype=False)
        elif suffix == ".csv":
            df = pd.read_csv(p, dtype=str, keep_default_na=False)
        else:
            raise DatasetUnavailableError(f"unsupported file type {suffix!r} for {p} (use parquet/jsonl/json/csv)")
    except DatasetUnavailableError:
        raise
    except Exception as err:  # noqa: BLE001 - any parse failure becomes one clear error
        raise DatasetUnavailableError(f"cannot read {p}: {type(err).__name__}: {err}") from err
    return df.to_dict(orient="records")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the hub (``HF_ENDPOINT``) answers an HTTP request within ``timeout_s`` (DNS included: run in a
    thread). Never raises: any failure is False."""
    import threading

    import httpx

    result: list[bool] = []

    def probe() -> None:
        try:
            httpx.head(HF_ENDPOINT, timeout=timeout_s)
            result.append(True)
        except Exception:  # noqa: BLE001 - any failure means unreachable
            result.append(False)

    th = threading.Thread(target=probe, daemon=True)
    th.start()
    th.join(timeout_s + 1.0)
    return bool(result and result[0])


@contextlib.contextmanager
def hub_mode(offline: bool) -> Iterator[None]:
    """Context manager: huggingface_hub/datasets offline mode set to ``offline`` for the duration, restored after
    (they read it at import time). Sets default hub timeouts (``HF_HUB_ETAG_TIMEOUT``,
    ``HF_HUB_DOWNLOAD_TIMEOUT``) when unset. Raises ImportError without ``datasets``/``huggingface_hub``."""
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "30")
    import datasets.config as dc
    import huggingface_hub.constants as hc

    old = (hc.HF_HUB_OFFLINE, dc.HF_HUB_OFFLINE, getattr(dc, "HF_DATASETS_OFFLINE", None))
    hc.HF_HUB_OFFLINE = dc.HF_HUB_OFFLINE = offline
    if old[2] is not None:
        dc.HF_DATASETS_OFFLINE = offline
    try:
        yield
    finally:
        hc.HF_HUB_OFFLINE, dc.HF_HUB_OFFLINE = old[0], old[1]
        if old[2] is not None:
            dc.HF_DATASETS_OFFLINE = old[2]


def load_records(
    name: str,
    split: str,
    from_file: str | os.PathLike | None = None,
    offline: bool | None = None,
    cache_dir: str | None = None,
) -> Iterable[dict[str, Any]]:
    """Raw records of a source split, from a local file (a list) or Hugging Face (a lazy iterator).

    Args:
        name: a key of ``SOURCES``.
        split: one of the source's splits (``SOURCES[name].splits``).
        from_file: local file with the hub dataset's fields (no network used).
        offline: True: cache only; False: hub (no probe); None: probe the hub, offline if unreachable.
        cache_dir: ``datasets`` cache directory (default: its own).
    Raises:
        KeyError: unknown name or split.
        DatasetUnavailableError: not reachable and not cached, or an unreadable local file.
    """
    if name not in SOURCES:
        raise KeyError(f"unknown dataset {name!r}; choose one of {sorted(SOURCES)}")
    src = SOURCES[name]
    if split not in src.splits:
        raise KeyError(f"dataset {name!r} has no split {split!r}; choose one of {sorted(src.splits)}")
    if from_file is not None:
        return read_local_records(from_file)
    if offline is None:
        offline = not hub_reachable()
    import datasets

    parts = []
    with hub_mode(offline):
        for cfg in src.configs:
            try:
                ds = datasets.load_dataset(src.repo, cfg, split=src.splits[split], cache_dir=cache_dir)
            except Exception as err:  # noqa: BLE001 - translate to one clear message
                where = f"{src.repo}" + (f" (config {cfg})" if cfg else "") + f", split {src.splits[split]!r}"
                why = (
                    "huggingface.co is unreachable (or offline mode is on) and it is not in the local "
                    "Hugging Face cache"
                    if offline
                    else f"loading failed: {type(err).__name__}: {str(err)[:200]}"
                )
                raise DatasetUnavailableError(
                    f"cannot load {name} from {where}: {why}. Build it where the hub is reachable (the cache "
                    f"is reused afterwards), or pass a local copy with --from-file PATH "
                    f"(parquet/jsonl/json/csv with fields: {src.fields})."
                ) from err
            parts.append(ds)
    return (dict(r) for ds in parts for r in ds)  # lazy: DAPO-Math-17k has ~1.8M (duplicated) rows


def build_hub(
    name: str,
    split: str | None = None,
    family: str | None = None,
    style: str = "default",
    from_file: str | os.PathLike | None = None,
    offline: bool | None = None,
    limit: int | None = None,
    cache_dir: str | None = None,
) -> BuildReport:
    """Build the verl rows of a hub source (see ``load_records`` for the loading arguments).

    ``split`` defaults to the source's only/first split; ``family`` to the source's default family.
    """
    src = SOURCES[name] if name in SOURCES else None
    if src is None:
        raise KeyError(f"unknown dataset {name!r}; choose one of {sorted(SOURCES)}")
    split = split or next(iter(src.splits))
    records = load_records(name, split, from_file=from_file, offline=offline, cache_dir=cache_dir)
    return build_rows(
        records, src.to_qa, data_source=name, split=split, family=family or src.default_family, style=style,
        limit=limit,
    )


# ------------------------------------------------------------------------------------- reasoning-gym

def offline_tasks(family: str) -> list[tuple[str, dict[str, Any]]]:
    """The offline set's ``(reasoning-gym task, config overrides)`` of ``family`` (a name or alias):
    its ``EnvFamily.offline_tasks``. Raises ValueError for an unknown family or one without an offline set."""
    fam = env_family(family)
    if not fam.offline_tasks:
        raise ValueError(f"family {fam.name!r} has no offline set")
    return [(task, dict(cfg)) for task, cfg in fam.offline_tasks]


_SPLIT_SEED_OFFSET = {"train": 0, "test": 1_000_003}


def _rg_records(family: str, n: int, seed: int) -> list[dict[str, Any]]:
    import reasoning_gym

    tasks = offline_tasks(family)
    per = [n // len(tasks) + (1 if i < n % len(tasks) else 0) for i in range(len(tasks))]
    out: list[dict[str, Any]] = []
    for (task, cfg), k in zip(tasks, per, strict=True):
        if k == 0:
            continue
        ds = reasoning_gym.create_dataset(task, seed=seed, size=k, **cfg)
        for j in range(k):
            e = ds[j]
            out.append({"task": task, "question": e["question"], "answer": e["answer"], "rg_index": j})
    return out


def _rg_qa(rec):
    return rec["question"], rec["answer"], {"task": rec["task"], "source_id": f"{rec['task']}/{rec['rg_index']}"}


def build_offline(
    family: str,
    split: str = "train",
    n: int = 1000,
    seed: int = 0,
    style: str = "default",
    exclude: Iterable[str] = (),
) -> BuildReport:
    """A procedural reasoning-gym set for one family (no network).

    Tasks are mixed evenly (:func:`offline_tasks`); the test split uses a different seed. Questions
    never repeat within a split, and questions in ``exclude`` (e.g. the train split's, to keep the test
    split uncontaminated) are dropped; both are counted in ``duplicates``. ``data_source`` is
    ``"rg/<task>"`` per row.

    Raises:
        ValueError: unknown family or split.
    """
    family = env_family(family).name  # ValueError for an unknown one
    offline_tasks(family)  # ValueError for a family without an offline set
    if split not in _SPLIT_SEED_OFFSET:
        raise ValueError(f"unknown split {split!r}; choose train or test")
    recs = _rg_records(family, n, seed + _SPLIT_SEED_OFFSET[split])
    report = BuildReport(rows=[])
    excluded = {" ".join(str(q).split()) for q in exclude}
    if excluded:
        kept = [r for r in recs if " ".join(r["question"].split()) not in excluded]
        report.duplicates += len(recs) - len(kept)
        recs = kept
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_task.setdefault(r["task"], []).append(r)
    offset = 0
    for task, rs in by_task.items():
        sub = build_rows(rs, _rg_qa, data_source=f"rg/{task}", split=split, family=family, style=style)
        for row in sub.rows:
            row["extra_info"]["index"] = len(report.rows)
            report.rows.append(row)
        report.bad.extend(BadRow(offset + b.index, f"{task}: {b.reason}") for b in sub.bad)
        report.duplicates += sub.duplicates
        offset += len(rs)
    return report


# ----------------------------------------------------------------------------------------------- CLI


def _print_report(label: str, path: Path, rep: BuildReport, max_bad: int = 20) -> None:
    print(f"{label}: {len(rep.rows)} rows -> {path} (bad {len(rep.bad)}, duplicates dropped {rep.duplicates})")
    for b in rep.bad[:max_bad]:
        print(f"  bad row {b.index}: {b.reason}", file=sys.stderr)
    if len(rep.bad) > max_bad:
        print(f"  ... and {len(rep.bad) - max_bad} more bad rows", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring). Returns the exit status: 0 done; 2 refused (an unknown source or
    split, a missing or malformed file, a source neither reachable nor cached), nothing written; 1 written, but with
    bad rows under ``--strict``."""
    ap = argparse.ArgumentParser(prog="python -m envs.datasets", description="Build verl RLHF parquet datasets.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    off = sub.add_parser("offline", help="reasoning-gym procedural sets (no network)")
    off.add_argument("--out", default="data")
    off.add_argument("--families", nargs="+", default=[f.name for f in env_families() if f.offline_tasks],
                     choices=env_family_names(aliases=True))
    off.add_argument("--train-size", type=int, default=2000)
    off.add_argument("--test-size", type=int, default=200)
    off.add_argument("--seed", type=int, default=0)
    off.add_argument("--style", default="default", choices=STYLES)

    hub = sub.add_parser("hub", help="one Hugging Face source (or a local copy of it)")
    hub.add_argument("name", choices=sorted(SOURCES))
    hub.add_argument("--split", default=None)
    hub.add_argument("--family", default=None, choices=env_family_names(aliases=True))
    hub.add_argument("--style", default="default", choices=STYLES)
    hub.add_argument("--from-file", default=None)
    hub.add_argument("--offline", action="store_true", help="use the local HF cache only")
    hub.add_argument("--limit", type=int, default=None)
    hub.add_argument("--out", default="data")

    alls = sub.add_parser("all", help="every Hugging Face source (needs network or a cache)")
    alls.add_argument("--style", default="default", choices=STYLES)
    alls.add_argument("--offline", action="store_true")
    alls.add_argument("--out", default="data")

    for p in (off, hub, alls):
        p.add_argument("--strict", action="store_true", help="exit 1 if any row is bad")
    sub.add_parser("list", help="list sources")
    args = ap.parse_args(argv)

    if args.cmd == "list":
        for s in SOURCES.values():
            print(f"{s.name:10s} {s.repo:36s} configs={list(s.configs)} splits={list(s.splits)} fields: {s.fields}")
        tasks = {f.name: [t for t, _ in f.offline_tasks] for f in env_families() if f.offline_tasks}
        print(f"offline    reasoning-gym tasks: {tasks}")
        return 0

    out = Path(args.out)
    any_bad = False
    try:
        if args.cmd == "offline":
            for fam in dict.fromkeys(env_family(f).name for f in args.families):
                train_q: list[str] = []
                for split, n in (("train", args.train_size), ("test", args.test_size)):
                    rep = build_offline(fam, split, n=n, seed=args.seed, style=args.style, exclude=train_q)
                    train_q = [r["extra_info"]["question"] for r in rep.rows]
                    path = write_parquet(rep.rows, out / fam / f"rg_{split}.parquet")
                    _print_report(f"offline {fam}/{split}", path, rep)
                    any_bad |= bool(rep.bad)
        else:
            jobs = (
                [(args.name, args.split)]
                if args.cmd == "hub"
                else [(n, s) for n, src in SOURCES.items() for s in src.splits]
            )
            offline = True if args.offline else None
            for name, split in jobs:
                fam = env_family(getattr(args, "family", None) or SOURCES[name].default_family).name
                rep = build_hub(
                    name, split, family=fam, style=args.style, from_file=getattr(args, "from_file", None),
                    offline=offline, limit=getattr(args, "limit", None),
                )
                split = split or next(iter(SOURCES[name].splits))
                path = write_parquet(rep.rows, out / fam / f"{name}_{split}.parquet")
                _print_report(f"{name}/{split}", path, rep)
                any_bad |= bool(rep.bad)
    except (DatasetUnavailableError, KeyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if any_bad and args.strict:
        print("error: bad rows found (--strict)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
