"""The evaluation CLI refuses bad options in one line before reading or writing anything (exit 2), names the
option in validation errors, and refuses data rows whose extra_info is not a mapping. No server, no model."""

import json
import re

import pytest

from stare_verl.jobs.evaluation import cli
from stare_verl.jobs.evaluation.runner import DatasetError, load_problems


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),  # used to hang
        (["--k", "0"], "--k must be >= 1, got 0"),
        (["--concurrency", "0"], "--concurrency must be >= 1, got 0"),
        (["--limit", "0"], "--limit must be >= 1, got 0"),
        (["--max-tokens", "-5"], "--max-tokens must be >= 1, got -5"),
        (["--request-timeout", "0"], "--request-timeout must be > 0 seconds, got 0.0"),
        (["--temperature", "nan"], "--temperature must be finite, got nan"),
        (["--k", "2", "--pass-k", "64"], "--pass-k 64: each k of pass@k must lie in 1..--k (2)"),
    ],
)
def test_bad_options_are_one_line_before_anything_runs(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--runs-dir", str(tmp_path / "none"), *argv]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--url", ""], "--url: server URL must start with http:// or https://, got ''"),  # not "no URL"
        (["--url", "   "], "--url: server URL must start with http:// or https://, got '   '"),
        (["--url", "localhost:30000"], "--url: server URL must start with http:// or https://, got 'localhost:30000'"),
        (["--url", "http://local host:30000"], "--url: server URL 'http://local host:30000' is not a valid URL"),
        (["--url", "http://127.0.0.1:99999"], "--url: server URL 'http://127.0.0.1:99999': port 99999 is not in"),
        (["--out", "."], "--out '.' is a folder: give a file path"),
        (["--out", ""], "--out '' is empty: give a file path"),
        (["--summary", "."], "--summary '.' is a folder: give a file path"),
    ],
)
def test_bad_url_and_output_paths_are_refused_before_data_or_server(argv, message, tmp_path, capsys, monkeypatch):
    """Refused in one line before the data is read (--data names no file here) or a server is asked."""
    monkeypatch.chdir(tmp_path)
    assert cli.main([*argv, "--data", str(tmp_path / "missing.parquet"), "--runs-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {message}") and "\n" not in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_validation_errors_name_the_option(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--url", "http://127.0.0.1:9/v1", "--data", "x.jsonl", "--top-p", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --top-p: ") and "\n" not in err


@pytest.mark.parametrize("extra", [[1, 2], "split=test", 3])
def test_rows_with_a_non_mapping_extra_info_are_named(extra, tmp_path):
    row = {"prompt": [{"role": "user", "content": "1+1?"}], "data_source": "x",
           "reward_model": {"ground_truth": "2"}, "extra_info": extra}  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match=f"row 0: extra_info is a {type(extra).__name__}, not a mapping"):
        load_problems(path)


def _record(pid, j, **kw):
    from stare_verl.jobs.evaluation.episode import EvalRecord

    return EvalRecord(problem_id=pid, problem_index=0, sample_index=j, data_source="x", ground_truth="2",
                      **kw).model_dump()


def test_resume_skips_damaged_lines_and_refuses_a_damaged_settings_file(tmp_path):
    from stare_verl.jobs.evaluation.runner import EvalSettings, ResultsFile, ResumeMismatch

    out = tmp_path / "r.jsonl"
    fp = EvalSettings(k=2, max_tokens=8).fingerprint("m", "d")
    ResultsFile(out, fp).close()  # the settings file of the samples below
    good = [_record("p0", 0), _record("p0", 1)]
    lines = [json.dumps(good[0]), json.dumps({"problem_id": "p1", "sample_index": 0}), "[1, 2]", "not json",
             json.dumps(good[1])]  # fmt: skip
    out.write_text("\n".join(lines) + "\n")
    rf = ResultsFile(out, fp)
    try:
        assert rf.load() == good  # the incomplete record (no 'correct', ...) is evaluated again, not a KeyError
        assert rf.skipped == 3
    finally:
        rf.close()
    for meta in ("[1, 2]", "{torn"):
        (tmp_path / "r.jsonl.meta.json").write_text(meta)
        with pytest.raises(ResumeMismatch, match=r"r.jsonl.meta.json .* is not a JSON object.*--overwrite"):
            ResultsFile(out, fp)


@pytest.mark.parametrize("url, why", [("http://127.0.0.1:99999/v1", "port 99999 is not in 1..65535"),
                                      ("http://:80", "names no host")])  # fmt: skip
def test_a_bad_server_url_is_one_line(url, why, tmp_path, capsys, monkeypatch):
    from stare_verl.jobs.evaluation.client import api_base

    with pytest.raises(ValueError, match=why):
        api_base(url)
    row = {"prompt": [{"role": "user", "content": "1+1?"}], "data_source": "x", "reward_model": {"ground_truth": "2"}}
    (tmp_path / "d.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--url", url, "--data", "d.jsonl", "--model", "m", "--max-tokens", "8", "--no-progress"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and why in err[-1]  # no traceback (was an OverflowError group)


def _math_jsonl(path):
    row = {"prompt": [{"role": "user", "content": "1+1?"}], "data_source": "x", "reward_model": {"ground_truth": "2"}}
    path.write_text(json.dumps(row) + "\n")
    return path


OUTPUT_CASES = {
    # (argv, what the error says): a file the run reads or writes, or a folder it cannot make or write
    "out_is_data": (["--out", "problems.jsonl", "--overwrite"], "--out 'problems.jsonl' is the --data file"),
    "summary_is_data": (["--summary", "problems.jsonl"], "--summary 'problems.jsonl' is the --data file"),
    "summary_is_out": (["--out", "r.jsonl", "--summary", "./r.jsonl"], "--summary './r.jsonl' is the --out file"),
    "summary_is_settings": (["--out", "r.jsonl", "--summary", "r.jsonl.meta.json"], "is the results' settings file"),
    "summary_is_lock": (["--out", "r.jsonl", "--summary", "r.jsonl.lock"], "is the results' lock file"),
    "out_is_tool_config": (["--out", "tools.yaml", "--tool-config", "tools.yaml", "--overwrite"],
                           "--out 'tools.yaml' is the --tool-config file"),
    "summary_is_default_tool_config": (["--summary", "DEFAULT"], "is the default tool config"),
    "out_under_a_file": (["--out", "afile/r.jsonl"], "is a file, so the folder"),
    "out_in_proc": (["--out", "/proc/r.jsonl"], "--out '/proc/r.jsonl': the folder /proc is not writable"),
    "summary_in_proc": (["--summary", "/proc/x.json"], "--summary '/proc/x.json': the folder /proc is not writable"),
    "out_under_proc": (["--out", "/proc/nope/x.jsonl"], "--out '/proc/nope/x.jsonl': no folder can be made in /proc: it is"),
}


@pytest.mark.parametrize("case", sorted(OUTPUT_CASES))
def test_output_paths_that_would_destroy_or_cannot_be_made_are_refused_first(case, tmp_path, capsys, monkeypatch):
    from stare_verl.recipe_files import recipes_dir

    monkeypatch.chdir(tmp_path)
    data = _math_jsonl(tmp_path / "problems.jsonl")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "tools.yaml").write_text("tools:\n  - class_name: a.B\n")
    default = recipes_dir() / "tool_use" / "tool_config.yaml"
    before = {p: p.read_bytes() for p in (data, tmp_path / "tools.yaml", default)}
    argv, said = OUTPUT_CASES[case]
    argv = [str(default) if a == "DEFAULT" else a for a in argv]
    # a closed port: were the paths checked after the server, the error would be the connection's
    assert cli.main(["--url", "http://127.0.0.1:9", "--data", "problems.jsonl", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --") and said in err and "\n" not in err, err
    assert {p: p.read_bytes() for p in before} == before  # nothing written over
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "problems.jsonl", "tools.yaml"]


def test_a_refused_resume_leaves_no_lock_file(tmp_path):
    """Results without their settings file are refused; the refusal leaves no ``.lock`` behind (nor does it keep a
    stale one a killed run left: the refused run held it, and a holder removes it)."""
    from stare_verl.jobs.evaluation.runner import EvalSettings, ResultsFile, ResumeMismatch

    out = tmp_path / "r.jsonl"
    out.write_text("hello world\n")
    with pytest.raises(ResumeMismatch, match="settings file .* is missing"):
        ResultsFile(out, EvalSettings(k=2).fingerprint("m", "d"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]
    (tmp_path / "r.jsonl.lock").write_text("")
    with pytest.raises(ResumeMismatch):
        ResultsFile(out, EvalSettings(k=2).fingerprint("m", "d"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


def test_a_finished_or_failed_run_leaves_no_lock_file_and_a_second_writer_is_refused(tmp_path):
    from stare_verl.jobs.evaluation.results import ResultsBusy
    from stare_verl.jobs.evaluation.runner import EvalSettings, ResultsFile

    out = tmp_path / "r.jsonl"
    fp = EvalSettings(k=2).fingerprint("m", "d")
    first = ResultsFile(out, fp)
    assert (tmp_path / "r.jsonl.lock").exists()
    with pytest.raises(ResultsBusy, match="another evaluation is writing"):
        ResultsFile(out, fp)
    first.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl.meta.json"]
    second = ResultsFile(out, fp)  # resumes (nothing written yet) and removes its lock when closed
    second.close()
    second.close()  # twice: nothing left to release
    assert not (tmp_path / "r.jsonl.lock").exists()


def test_a_lock_file_removed_between_open_and_lock_is_not_taken(tmp_path, monkeypatch):
    """The race a removed lock file could open: B opens ``.lock``, its holder A removes it and closes, C creates a new
    one and holds it, then B locks its (removed) file. B must see that the path no longer names what it locked and
    try the path again, where C holds the lock: refused, not a second writer."""
    import fcntl
    from pathlib import Path

    from stare_verl.jobs.evaluation import results

    lock = tmp_path / "r.jsonl.lock"
    lock.write_text("")
    stale = lock.open("w")  # B's open, before A removed the file
    lock.unlink()
    holder = lock.open("w")  # C's new lock file, held
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    real_open = Path.open
    handed = []

    def open_(self, *a, **k):
        if self == lock and not handed:
            handed.append(1)
            return stale
        return real_open(self, *a, **k)

    monkeypatch.setattr(Path, "open", open_)
    with pytest.raises(results.ResultsBusy, match="another evaluation is writing"):
        results._acquire(lock, tmp_path / "r.jsonl")
    assert handed == [1] and stale.closed
    holder.close()


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda p: p.mkdir() or p, "is a folder: give the YAML file"),
        (lambda p: p, "does not exist"),
    ],
)
def test_a_tool_config_folder_or_missing_file_is_named_so(make, said, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = _math_jsonl(tmp_path / "problems.jsonl")
    tc = make(tmp_path / "tc")
    argv = ["--url", "http://127.0.0.1:9", "--data", str(data), "--tools", "on", "--tool-config", str(tc),
            "--model", "m", "--max-tokens", "8"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: tool config {tc} {said}", err


@pytest.mark.parametrize(
    "name, text, said",
    [
        ("rows.jsonl", "[1, 2]\n", "line 1 is a JSON list, not an object (one problem per line)"),
        ("rows.jsonl", '"a string"\n', "line 1 is a JSON str, not an object"),
        ("rows.txt", "not parquet", "a data file is .parquet, .jsonl or .json, and this one (.txt) is not readable"),
    ],
)
def test_data_rows_that_are_no_objects_and_unknown_file_types_are_named(name, text, said, tmp_path):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DatasetError, match=re.escape(said)):
        load_problems(path)


@pytest.mark.parametrize(
    "config, said",
    [
        ("- a\n- b\n", "is no verl tool config: expected a mapping with a non-empty `tools` list"),
        (b"\xea\x00\xff\xfe binary", "is no readable YAML"),
        ("tools: []\n", "is no verl tool config"),
        ("tools:\n  - config: {}\n", "tools[0] names no class_name"),
        ("tools:\n  - class_name: nope.Nope\n    config: {}\n", "verl cannot build its tools"),
        ("tools:\n  - class_name: nope.Nope\n    config: {type: native}\n", "verl cannot build its tools"),
    ],
)
def test_a_bad_tool_config_is_refused_before_the_server_and_writes_nothing(config, said, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = _math_jsonl(tmp_path / "problems.jsonl")
    tc = tmp_path / "tools.yaml"
    tc.write_bytes(config if isinstance(config, bytes) else config.encode())
    out = tmp_path / "out" / "r.jsonl"
    argv = ["--url", "http://127.0.0.1:9", "--data", str(data), "--tools", "on", "--tool-config", str(tc),
            "--out", str(out), "--model", "m", "--max-tokens", "8"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: tool config {tc}") and said in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()  # no results file, lock or settings file


def test_a_broken_jsonl_line_names_its_own_column(tmp_path):
    """A line cut short (the parser runs off its end) is reported at its own last column, not "column 1" of the
    next line."""
    good = json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "data_source": "x",
                       "reward_model": {"ground_truth": "2"}})  # fmt: skip
    broken = '{"prompt": [], "data_source"'
    path = tmp_path / "rows.jsonl"
    path.write_text(f"{good}\n{broken}\n{good}\n")
    with pytest.raises(DatasetError, match=rf"line 2: Expecting ':' delimiter \(column {len(broken) + 1}\)"):
        load_problems(path)
