"""The exit statuses every command shares (:mod:`stare_verl.jobs.exits`): a refused command is status 2 and one
``error:`` line whichever subcommand refused it, and writes nothing; a command that ran and failed is status 1.
(``check`` with a value verl refuses: ``test_recipes.py``.)"""

from __future__ import annotations

import pytest

from stare_verl.jobs import exits
from stare_verl.jobs.cli import main


def _argv(tmp_path, case: str) -> list[str]:
    (tmp_path / "notes.md").write_text("a file without the methods table's markers\n")
    return {
        "check: no such recipe": ["check", "no_such_recipe"],
        "plot: no such run": ["plot", str(tmp_path / "no-run")],
        "methods: no markers": ["methods", "--write", str(tmp_path / "notes.md")],
        "eval: no data file": ["eval", "--url", "http://127.0.0.1:9", "--data", str(tmp_path / "none.parquet"),
                               "--out", str(tmp_path / "out" / "r.jsonl")],
        "eval: no checkpoint": ["eval", "--runs-dir", str(tmp_path / "out"), "--no-progress"],
        "train: unknown method": ["train", "--family", "shortcot", "--method", "nope", "--dry-run"],
        "compare: unknown method": ["compare", "--methods", "nope", "--out", str(tmp_path / "out")],
        "sft data: no such file": ["sft", "data", "--demos", "0", "--retool-file", str(tmp_path / "none.jsonl"),
                                   "--out", str(tmp_path / "out")],
    }[case]  # fmt: skip


@pytest.mark.parametrize(
    "case",
    ["check: no such recipe", "plot: no such run", "methods: no markers", "eval: no data file",
     "eval: no checkpoint", "train: unknown method", "compare: unknown method", "sft data: no such file"],
)  # fmt: skip
def test_a_refused_command_is_status_2_and_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    argv = _argv(tmp_path, case)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv) == exits.USAGE_ERROR == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and err[0].startswith("error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run folder, no results file, no data


def test_tool_use_data_cli_refuses_a_missing_file_as_the_datasets_cli(tmp_path, capsys):
    from envs.datasets import main as datasets_main
    from envs.tool_use.task import main as task_main

    missing = str(tmp_path / "none.jsonl")
    assert task_main(["hub", "math500", "--from-file", missing, "--out", str(tmp_path / "d")]) == 2
    assert datasets_main(["hub", "math500", "--from-file", missing, "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") and "none.jsonl" in line for line in err)


def test_a_server_that_cannot_be_reached_is_status_1(tmp_path, capsys):
    """It ran (the data was read, the server asked) and failed: 1, not a refusal."""
    from envs.datasets import make_row, write_parquet

    data = write_parquet([make_row("1 + 1?", "2", "toy", 0, "test")], tmp_path / "d.parquet")
    argv = ["eval", "--url", "http://127.0.0.1:9", "--model", "m", "--data", str(data), "--retries", "0",
            "--out", str(tmp_path / "r.jsonl"), "--no-progress"]  # fmt: skip
    assert main(argv) == exits.RUN_FAILED == 1
    assert "cannot reach the server" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["train", "--cpu", "--family", "shortcot", "--steps", "1"],
                                     ["train", "--cpu", "--family", "shortcot", "--steps", "1", "--dry-run"],
                                     ["compare", "--family", "shortcot", "--methods", "grpo", "--seeds", "0"]])
def test_a_cache_folder_that_is_a_file_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, command):
    """``$STARE_CACHE_DIR`` naming a file was a traceback deep in the cold-start SFT (a fresh user's find), after the
    run folder was made; the dry run planned a model path under the file. Now one line, status 2, nothing made."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cache.txt").write_text("not a folder")
    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path / "cache.txt"))
    assert main([*command, "--run-dir" if command[0] == "train" else "--out", str(tmp_path / "out")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert err == [f"error: the cache folder {tmp_path / 'cache.txt'} cannot be made: {tmp_path / 'cache.txt'} is a "
                   "file ($STARE_CACHE_DIR)"]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.txt"]


@pytest.mark.parametrize("kind", ["missing", "empty", "no weights"])
def test_eval_refuses_a_checkpoint_it_cannot_load_before_writing_its_results_file(tmp_path, capsys, kind):
    """``eval --checkpoint`` of a folder it cannot load was refused (status 2) after its results file's lock and
    settings were written beside ``--out`` (a fresh user's find); now nothing is written."""
    ck = tmp_path / "ck"
    if kind != "missing":
        ck.mkdir()
    if kind == "no weights":
        (ck / "config.json").write_text("{}")
    from envs.datasets import make_row, write_parquet

    data = write_parquet([make_row("1 + 1?", "2", "toy", 0, "test")], tmp_path / "d.parquet")  # a good data file
    out = tmp_path / "res" / "c1.jsonl"
    assert main(["eval", "--checkpoint", str(ck), "--data", str(data), "--out", str(out), "--no-progress"]) == 2
    assert "is not a Hugging Face model folder with weights" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()


def test_eval_data_errors_name_the_files_line_and_a_folder(tmp_path, capsys):
    """A malformed JSONL row is named by its line in the file (it said "line 1 column 2", the position inside the
    row); a folder given as --data is named a folder (it said "does not exist")."""
    import json as _json

    good = _json.dumps({"prompt": [{"role": "user", "content": "1 + 1?"}], "data_source": "toy",
                        "reward_model": {"ground_truth": "2"}})  # fmt: skip
    (tmp_path / "bad.jsonl").write_text(f"{good}\n\n{{'broken': }}\n")
    base = ["eval", "--url", "http://127.0.0.1:9", "--model", "m", "--no-progress", "--out", str(tmp_path / "o.jsonl")]
    assert main([*base, "--data", str(tmp_path / "bad.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "as JSONL: line 3: " in err and "column 2" in err
    assert main([*base, "--data", str(tmp_path)]) == 2
    assert f"data file {tmp_path} is a folder" in capsys.readouterr().err
