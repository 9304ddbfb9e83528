"""Command line of the evaluation: ``python -m stare_verl.jobs.evaluation`` (and ``stare-verl eval``).

Against a server (SGLang / vLLM, OpenAI chat-completions)::

    python -m stare_verl.jobs.evaluation --url http://localhost:30000 --model Qwen2.5-7B \\
        --data data/tooluse/aime2024_test.parquet --k 32 --temperature 1.0 --top-p 0.7 \\
        --max-tokens 8192 --concurrency 64

Without ``--url``: the newest local checkpoint under ``runs/`` (or ``--checkpoint DIR``, or ``--model`` a prepared
registered model or a model folder) on this CPU, on its run's ``val.parquet`` (or ``--data``).

Writes ``--out`` (per-sample JSONL; default under ``runs/eval/``), ``<out stem>.summary.json`` and prints a
table. Running the same command again resumes: answered samples are not asked again.
Exit status (:mod:`stare_verl.jobs.exits`): 0 done; 2 refused before anything was asked (a bad option, a missing or
malformed data file or checkpoint, results on disk from other settings); 1 failed while running (the server
cannot be reached or fails, the sandbox is unavailable: what was answered is kept); 130 interrupted (the same).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import sys
from pathlib import Path

from stare_verl.jobs.exits import INTERRUPTED, RUN_FAILED, USAGE_ERROR
from stare_verl.validation import error_text

__all__ = ["add_arguments", "build_parser", "main", "run"]


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the evaluation options to ``p`` (for a ``stare-verl eval`` subcommand); returns ``p``."""
    g = p.add_argument_group("server (omit --url to evaluate a local checkpoint on CPU)")
    g.add_argument("--url", default=None, help="OpenAI-compatible server, e.g. http://localhost:30000 (/v1 optional)")
    g.add_argument("--model", default=None,
                   help="with --url: the served model's name (default: the server's only model); without: the model "
                        "evaluated on this CPU, a prepared registered model (smollm2-135m) or a model folder")
    g.add_argument("--api-key", default=None, help="bearer token (default $OPENAI_API_KEY; SGLang/vLLM need none)")
    g.add_argument("--concurrency", type=int, default=64, help="requests in flight (default 64)")
    g.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")
    g.add_argument("--retries", type=int, default=5, help="retries on 5xx/timeouts/connection errors (default 5)")
    g = p.add_argument_group("local checkpoint")
    g.add_argument("--checkpoint", default=None, help="HF model folder (default: newest under --runs-dir)")
    g.add_argument("--runs-dir", default="runs", help="where `make train-tooluse` writes runs (default runs)")
    g.add_argument("--batch-size", type=int, default=64, help="sequences decoded together on CPU (default 64)")
    g = p.add_argument_group("data and sampling")
    g.add_argument("--data", default=None, help="verl parquet built by envs.datasets / envs.tool_use.task")
    g.add_argument("--limit", type=int, default=None, help="first N problems only")
    g.add_argument("--k", type=int, default=32, help="samples per problem (default 32)")
    g.add_argument("--temperature", type=float, default=1.0, help="default 1.0")
    g.add_argument("--top-p", type=float, default=0.7, help="default 0.7")
    g.add_argument("--max-tokens", type=int, default=None,
                   help="response budget in tokens (tool use: model + tool tokens of all turns); default: server's")
    g.add_argument("--seed", type=int, default=0, help="base request seed (-1: send none)")
    g.add_argument("--pass-k", type=int, nargs="+", default=None, help="k of pass@k (default 1,2,4,..,k)")
    g = p.add_argument_group("tool use")
    g.add_argument("--tools", choices=["auto", "on", "off"], default="auto",
                   help="tool loop for tool-use rows (auto), every row (on) or none (off)")
    g.add_argument("--tool-config", default=None, help="verl tool config YAML (default recipes/tool_use/tool_config.yaml)")
    g.add_argument("--tool-choice", choices=["omit", "auto", "none"], default="omit",
                   help="tool_choice sent with tools (vLLM without --enable-auto-tool-choice: none)")
    g.add_argument("--max-turns", type=int, default=8, help="assistant turns per episode (default 8)")
    g.add_argument("--max-tool-response-chars", type=int, default=1024, help="observation cut (default 1024)")
    g.add_argument("--tool-timeout", type=float, default=60.0, help="seconds per tool call (default 60)")
    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, help="per-sample JSONL (default runs/eval/<model>/<data>_k<k>_....jsonl)")
    g.add_argument("--summary", default=None, help="summary JSON (default <out stem>.summary.json)")
    g.add_argument("--overwrite", action="store_true", help="start over instead of resuming --out")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The standalone parser of ``python -m stare_verl.jobs.evaluation``."""
    p = argparse.ArgumentParser(prog="python -m stare_verl.jobs.evaluation", description=__doc__.split("\n")[0])
    return add_arguments(p)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_") or "model"


def _default_out(base: Path, name: str, data: Path, a: argparse.Namespace) -> Path:
    stem = data.name.removesuffix(".parquet").removesuffix(".jsonl")
    return base / _slug(name) / f"{stem}_k{a.k}_t{a.temperature:g}_p{a.top_p:g}.jsonl"


async def _api(a: argparse.Namespace, settings, problems, data: Path):
    from stare_verl.jobs.evaluation.client import ChatClient, ClientConfig
    from stare_verl.jobs.evaluation.runner import load_tools, run_api_eval

    cfg = ClientConfig(url=a.url, model=a.model, max_concurrency=a.concurrency, request_timeout_s=a.request_timeout,
                       max_retries=a.retries, **({"api_key": a.api_key} if a.api_key else {}))
    # the tools first: a bad tool config is the caller's input, refused before the server is asked or a file made
    tools = load_tools(a.tool_config) if any(p.tool_use for p in problems) else {}
    async with ChatClient(cfg) as client:
        try:
            model = await client.check_model()
            out = Path(a.out) if a.out else _default_out(Path(a.runs_dir) / "eval", model, data, a)
            a.resolved_out = out  # for the interruption message
            results = _results_file(out, settings.fingerprint(model, str(data.resolve())), a.overwrite)
        except BaseException:
            await _close_tools(tools)
            raise
        try:
            print(f"evaluating {model} at {cfg.url} on {data} ({len(problems)} problems x {settings.k}) -> {out}",
                  file=sys.stderr)
            records = await run_api_eval(problems, client, settings, results, tools=tools,
                                         progress=not a.no_progress)
        finally:
            results.close()
            await _close_tools(tools)
        return records, out, {"model": model, "url": cfg.url}


def _results_file(out: Path, fingerprint, overwrite: bool):
    """:class:`~stare_verl.jobs.evaluation.results.ResultsFile` at ``out``; a folder that cannot be made or written
    is a ValueError naming ``--out`` (a refused input), not the OS error alone."""
    from stare_verl.jobs.evaluation.runner import ResultsFile

    try:
        return ResultsFile(out, fingerprint, overwrite=overwrite)
    except OSError as err:
        raise ValueError(f"--out {out}: cannot write there: {err.strerror or err}") from None


async def _close_tools(tools: dict) -> None:
    """Close the tools that hold resources (their sandboxes)."""
    for t in tools.values():
        close = getattr(t, "aclose", None)
        if close is not None:
            await close()


# (option, smallest allowed value) of the numeric options, checked before anything is read or written
OPTION_MINIMA = (("k", 1), ("concurrency", 1), ("retries", 0), ("batch_size", 1), ("limit", 1), ("max_turns", 1),
                 ("max_tool_response_chars", 1), ("max_tokens", 1))  # fmt: skip
# EvalSettings / ClientConfig fields -> the option that sets them (for the one-line error)
FIELD_OPTIONS = {"k": "--k", "temperature": "--temperature", "top_p": "--top-p", "max_tokens": "--max-tokens",
                 "max_turns": "--max-turns", "max_tool_response_chars": "--max-tool-response-chars",
                 "tool_timeout_s": "--tool-timeout", "max_concurrency": "--concurrency", "base_url": "--url",
                 "timeout_s": "--request-timeout", "max_retries": "--retries"}  # fmt: skip


def bad_option(a: argparse.Namespace) -> str | None:
    """The first numeric option below its minimum (``OPTION_MINIMA``), a non-finite / non-positive time, a
    ``--pass-k`` outside 1..k, a ``--url`` that is no server URL (an empty one included: it is not "no URL"), or an
    output path the run could not write or would write over a file it reads or writes (:func:`_bad_output_path`), as
    a one-line message; None when all are fine. Checked before any data is read, any server asked or any file
    written."""
    if getattr(a, "url", None) is not None:
        from stare_verl.jobs.evaluation.client import api_base

        try:
            api_base(a.url)
        except ValueError as err:
            return f"--url: {err}"
    bad_path = _bad_output_path(a)
    if bad_path:
        return bad_path
    for name, low in OPTION_MINIMA:
        v = getattr(a, name, None)
        if v is not None and v < low:
            return f"--{name.replace('_', '-')} must be >= {low}, got {v}"
    for name in ("request_timeout", "tool_timeout", "temperature", "top_p"):
        v = getattr(a, name, None)
        if v is not None and not math.isfinite(v):
            return f"--{name.replace('_', '-')} must be finite, got {v}"
    for name in ("request_timeout", "tool_timeout"):
        v = getattr(a, name, None)
        if v is not None and v <= 0:
            return f"--{name.replace('_', '-')} must be > 0 seconds, got {v}"
    for k in a.pass_k or []:
        if not 1 <= k <= a.k:
            return f"--pass-k {k}: each k of pass@k must lie in 1..--k ({a.k})"
    return None


def _bad_output_path(a: argparse.Namespace) -> str | None:
    """Why ``--out`` or ``--summary`` cannot be used, or None: empty, a folder, in a folder that cannot be made or
    written (:func:`_unwritable_folder`), or the same file as one the run reads (``--data``, ``--tool-config`` or the
    default tool config) or writes (the other output, or the results' ``.lock`` / ``.meta.json``)."""
    from stare_verl.jobs.evaluation.tools import default_tool_config

    def same(x: str | Path, y: str | Path) -> bool:
        return Path(x).resolve() == Path(y).resolve()

    reads = {"--data file": a.data, "--tool-config file": a.tool_config, "default tool config": default_tool_config()}
    writes = {}
    if a.out:
        writes = {"--out file": a.out, "results' lock file": f"{a.out}.lock",
                  "results' settings file": f"{a.out}.meta.json"}  # fmt: skip
    for name in ("out", "summary"):
        v = getattr(a, name, None)
        if v is None:
            continue
        if not v.strip() or Path(v).is_dir():
            return f"--{name} {v!r} is {'a folder' if v.strip() else 'empty'}: give a file path"
        for what, other in (*reads.items(), *(writes.items() if name == "summary" else ())):
            if other and same(v, other):
                return f"--{name} {v!r} is the {what}: the run would write over it; give another path"
        unwritable = _unwritable_folder(Path(v))
        if unwritable:
            return f"--{name} {v!r}: {unwritable}"
    return None


def _unwritable_folder(path: Path) -> str | None:
    """Why the folder of ``path`` cannot be made or written to (its nearest existing ancestor is a file, or no file
    can be made in it: tried with a temporary file, removed at once, so that root's permissions and file systems
    such as ``/proc`` answer as they will), or None when it can."""
    import tempfile

    folder = path.resolve().parent
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None:  # pragma: no cover - "/" exists
        return None
    if not existing.is_dir():
        return f"{existing} is a file, so the folder {folder} cannot be made"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        why = err.strerror or err
        if existing == folder:
            return f"the folder {existing} is not writable ({why})"
        return f"no folder can be made in {existing}: it is not writable ({why})"
    return None


def _validation_line(err) -> str:
    """A pydantic ValidationError as one line naming the command-line options."""
    parts = []
    for e in err.errors():
        field = str(e["loc"][0]) if e.get("loc") else "?"
        parts.append(f"{FIELD_OPTIONS.get(field, field)}: {error_text(e)}")
    return "; ".join(parts)


def _local_model(a: argparse.Namespace) -> Path | None:
    """Without ``--url``, the folder ``--model`` names (a prepared registered model such as ``smollm2-135m``, or a
    Hugging Face folder: :func:`stare_verl.models.registry.resolve_model`), to evaluate on this CPU; None without
    ``--model``.

    Raises:
        ValueError: ``--model`` and ``--checkpoint`` both given, ``--model tiny`` (the jobs train it: give its
            checkpoint), or a model that does not resolve (not registered, not prepared, no loadable folder).
    """
    if a.model is None:
        return None
    from stare_verl.models.registry import ModelError, resolve_model

    if a.checkpoint:
        raise ValueError(f"--model {a.model} and --checkpoint {a.checkpoint} both name the model to evaluate on "
                         "this CPU: give one (with --url, --model names the server's model)")  # fmt: skip
    try:
        model = resolve_model(a.model)
    except ModelError as err:
        raise ValueError(f"{err} (without --url, --model is the model evaluated on this CPU)") from None
    if model.path is None:
        raise ValueError(f"--model {a.model} is the from-scratch model the jobs train: give its checkpoint (--checkpoint "
                         "DIR, or the newest under --runs-dir without either option)")  # fmt: skip
    return model.path


def run(a: argparse.Namespace) -> int:
    """Run an evaluation from parsed arguments (see :func:`add_arguments`); returns the exit status
    (:mod:`stare_verl.jobs.exits`: 2 refused, before anything is asked; 1 failed while running; 130 interrupted)."""
    from pydantic import ValidationError

    bad = bad_option(a)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return USAGE_ERROR

    from envs.sandbox import SandboxUnavailable
    from stare_verl.jobs.evaluation.client import EvalClientError
    from stare_verl.jobs.evaluation.local import (
        LocalCheckpointError,
        check_local_checkpoint,
        find_latest_checkpoint,
        find_run_data,
        heldout_data_for_sft,
        run_local_eval,
    )
    from stare_verl.jobs.evaluation.runner import (
        DatasetError,
        EvalSettings,
        ResumeMismatch,
        load_problems,
    )
    from stare_verl.jobs.evaluation.summary import (
        format_table,
        partial_pass_at,
        summarize,
        unverified_notes,
        write_summary,
    )

    out: Path | None = None
    try:
        settings = EvalSettings(k=a.k, temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens,
                                seed=None if a.seed == -1 else a.seed, max_turns=a.max_turns, tools=a.tools,
                                tool_choice=a.tool_choice, max_tool_response_chars=a.max_tool_response_chars,
                                tool_timeout_s=a.tool_timeout)
        if a.url and a.max_tokens is None:
            print("note: no --max-tokens: the server's default limit applies (reference limits: 3072 short CoT, "
                  "16384 long CoT, 8192 tool use)", file=sys.stderr)
        if a.url:
            if not a.data:
                raise DatasetError("--data is required with --url (a parquet built by envs.datasets / envs.tool_use.task)")
            data = Path(a.data)
            problems = load_problems(data, a.limit, settings.tools)
            records, out, meta = asyncio.run(_api(a, settings, problems, data))
        else:
            ck = _local_model(a) or (Path(a.checkpoint) if a.checkpoint else find_latest_checkpoint(a.runs_dir))
            check_local_checkpoint(ck)  # refused before its results file (a lock, the settings) is written
            if a.data:
                data = Path(a.data)
            else:
                sft_data = heldout_data_for_sft(ck, Path(a.runs_dir) / "eval" / "data" / ck.resolve().name)
                data = sft_data or find_run_data(ck)
            problems = load_problems(data, a.limit, settings.tools)
            if a.out:
                out = Path(a.out)
            else:
                run_dir = next((q for q in ck.resolve().parents if (q / "checkpoints").is_dir()), None)
                base = (run_dir / "eval") if run_dir else Path(a.runs_dir) / "eval"
                out = _default_out(base, "local" if run_dir else ck.name, data, a)
            print(f"evaluating local checkpoint {ck} on {data} ({len(problems)} problems x {settings.k}) -> {out}",
                  file=sys.stderr)
            results = _results_file(out, settings.fingerprint(f"local:{ck.resolve()}", str(data.resolve())),
                                    a.overwrite)  # fmt: skip
            try:
                records = run_local_eval(ck, problems, settings, results, max_batch_size=a.batch_size,
                                         progress=not a.no_progress)
            finally:
                results.close()
            meta = {"model": f"local:{ck}"}
    except KeyboardInterrupt:
        out = out or getattr(a, "resolved_out", None)
        where = f"; answered samples are kept in {out}: run the same command again to resume" if out else ""
        print(f"interrupted{where}", file=sys.stderr)
        return INTERRUPTED
    except ValidationError as err:
        print(f"error: {_validation_line(err)}", file=sys.stderr)
        return USAGE_ERROR
    except (EvalClientError, SandboxUnavailable) as err:  # it ran and could not go on: what was answered is kept
        print(f"error: {err}", file=sys.stderr)
        return RUN_FAILED
    except (DatasetError, ResumeMismatch, LocalCheckpointError, FileNotFoundError, ValueError) as err:  # refused
        print(f"error: {err}", file=sys.stderr)
        return USAGE_ERROR
    meta.update(data=str(data), **settings.model_dump(exclude={"reward_kwargs"}), results=str(out))
    summary = summarize(records, a.pass_k, meta)
    path = Path(a.summary) if a.summary else out.with_name(out.name.removesuffix(".jsonl") + ".summary.json")
    try:
        write_summary(summary, path)
    except OSError as err:  # checked before the run; a folder that changed since: the samples are kept
        print(f"error: cannot write the summary to {path} ({err.strerror or err}); the samples are in {out}: run "
              "again with another --summary to summarise them without asking again", file=sys.stderr)  # fmt: skip
        return RUN_FAILED
    for note in partial_pass_at(summary):
        why = ": that pass@k is over those problems only (marked * in the table)" if " covers " in note else ""
        print(f"warning: {note}{why}", file=sys.stderr)
    for note in unverified_notes(summary):
        print(f"warning: {note}", file=sys.stderr)
    print(format_table(summary))
    print(f"samples: {out}\nsummary: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse ``argv`` and :func:`run`; returns the exit status."""
    from stare_verl.jobs.procs import interrupt_on_termination

    interrupt_on_termination()  # Ctrl-C (even when inherited as ignored), kill, a closed terminal: keep what was answered
    return run(build_parser().parse_args(argv))
