"""Evaluation against a real HTTP server on 127.0.0.1 playing a scripted model (tests/support/scripted_server.py).

avg@k / pass@k on a known set (expected values by hand), resume after an interruption without re-asking,
retries after injected 500s and timeouts, the tool-use loop through the API with the real sandbox, and
clear messages for bad input.
"""

import asyncio
import json
import re
import socket
from pathlib import Path

import pytest

from envs.datasets import make_row, write_parquet
from envs.tool_use.task import to_tool_use_row
from stare_verl.jobs.evaluation import cli
from stare_verl.jobs.evaluation.client import ChatClient, ClientConfig, ModelNotServed, ServerUnreachable
from stare_verl.jobs.evaluation.runner import (
    RECORD_KEYS,
    SEED_STRIDE,
    DatasetError,
    EvalSettings,
    ResultsBusy,
    ResultsFile,
    ResumeMismatch,
    load_problems,
    load_tools,
    run_api_eval,
)
from stare_verl.jobs.evaluation.summary import summarize
from tests.support.scripted_server import Reply, ScriptedServer  # noqa: E402

pytestmark = pytest.mark.integration

# problem -> (answer, correctness of samples 0..3). Sample 0 of "7" is a correct box cut by the length limit.
KNOWN = {
    "What is 2 + 3?": ("5", [1, 1, 0, 1]),
    "What is 3 + 4?": ("7", [0, 0, 0, 1]),
    "What is 4 + 6?": ("10", [0, 0, 0, 0]),
}
K = 4


def _math_parquet(tmp_path) -> Path:
    rows = [make_row(q, a, "toy", i, "test") for i, (q, (a, _)) in enumerate(KNOWN.items())]
    return write_parquet(rows, tmp_path / "toy_test.parquet")


def _question(body) -> str:
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return next(q for q in KNOWN if q in user)


def _known_reply(body, attempt) -> Reply:
    q = _question(body)
    answer, pattern = KNOWN[q]
    j = body["seed"] % SEED_STRIDE
    if q == "What is 3 + 4?" and j == 0:
        return Reply(f"\\boxed{{{answer}}}", finish_reason="length", completion_tokens=30)
    if pattern[j]:
        return Reply(f"Wait, let me check. The answer is \\boxed{{{answer}}}.", completion_tokens=10 + j)
    return Reply(f"\\boxed{{{int(answer) + 1}}}" if j % 2 else "I do not know.", completion_tokens=10 + j)


def _eval(server_url, data, out, *, settings=None, tools=None, on_record=None, **client_kw):
    settings = settings or EvalSettings(k=K, temperature=1.0, top_p=0.7, max_tokens=64, seed=0)
    problems = load_problems(data)

    async def go():
        cfg = ClientConfig(url=server_url, model="scripted", **{"max_concurrency": 4, **client_kw})
        async with ChatClient(cfg) as client:
            await client.check_model()
            results = ResultsFile(out, settings.fingerprint("scripted", str(data)))
            try:
                recs = await run_api_eval(problems, client, settings, results, tools=tools, progress=False,
                                          on_record=on_record)
            finally:
                results.close()
            return recs, client

    return asyncio.run(go())


def test_avg_and_pass_at_k_on_known_set(tmp_path):
    data = _math_parquet(tmp_path)
    with ScriptedServer(_known_reply) as srv:
        recs, client = _eval(srv.url, data, tmp_path / "out.jsonl")
        assert srv.chat_requests == len(KNOWN) * K and srv.model_requests == 1
        body = srv.bodies[0]
        assert body["model"] == "scripted" and body["temperature"] == 1.0 and body["top_p"] == 0.7
        assert body["max_tokens"] == 64 and "tools" not in body
    assert [r["correct"] for r in recs] == [bool(x) for _, p in KNOWN.values() for x in p]
    cut = next(r for r in recs if r["problem_id"] == "toy/test/1" and r["sample_index"] == 0)
    assert cut["truncated"] and not cut["correct"] and cut["extracted_answer"] == ""  # correct box, but cut
    ok = recs[0]
    assert ok["extracted_answer"] == "5" and ok["tokens"] == 10 and ok["turns"] == 1 and ok["tool_calls"] == 0
    assert ok["reflections"]["total"] >= 2  # "Wait", "check"

    s = summarize(recs)["groups"]["all"]
    # by hand: avg@4 = (3/4 + 1/4 + 0) / 3; pass@2 = (1 + (1 - C(3,2)/C(4,2)) + 0) / 3; pass@4 = 2/3
    assert s["avg@k"] == pytest.approx(1 / 3)
    assert s["pass@k"]["1"] == pytest.approx(1 / 3)
    assert s["pass@k"]["2"] == pytest.approx(0.5)
    assert s["pass@k"]["4"] == pytest.approx(2 / 3)
    assert s["truncated_rate"] == pytest.approx(1 / 12)
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(lines) == 12 and len({(json.loads(x)["problem_id"], json.loads(x)["sample_index"]) for x in lines}) == 12


def test_resume_after_interruption_does_not_ask_again(tmp_path):
    data = _math_parquet(tmp_path)
    out = tmp_path / "out.jsonl"
    with ScriptedServer(_known_reply, gate_after=5) as srv:  # requests after the 5th answer hang
        written = []

        async def interrupted():
            stop = asyncio.Event()
            settings = EvalSettings(k=K, max_tokens=64, seed=0)
            cfg = ClientConfig(url=srv.url, model="scripted", max_concurrency=2)
            async with ChatClient(cfg) as client:
                await client.check_model()
                results = ResultsFile(out, settings.fingerprint("scripted", str(data)))

                def on_record(rec):
                    written.append(rec)
                    if len(written) == 5:
                        stop.set()

                task = asyncio.create_task(run_api_eval(load_problems(data), client, settings, results,
                                                        progress=False, on_record=on_record))
                await asyncio.wait_for(stop.wait(), 20)
                task.cancel()  # as Ctrl-C would
                with pytest.raises(asyncio.CancelledError):
                    await task
                results.close()

        asyncio.run(interrupted())
        first_run = srv.chat_requests
    assert len(written) == 5 and len(out.read_text().splitlines()) == 5
    with out.open("a") as f:
        f.write('{"problem_id": "toy/test/2", "sample_in')  # a line torn by the interruption

    with ScriptedServer(_known_reply) as srv:
        recs, _ = _eval(srv.url, data, out)
        assert srv.chat_requests == len(KNOWN) * K - 5  # nothing asked twice
        asked = {(_question(b), b["seed"] % SEED_STRIDE) for b in srv.bodies}
        assert len(asked) == 7
    assert first_run >= 5
    assert [r["correct"] for r in recs] == [bool(x) for _, p in KNOWN.values() for x in p]
    lines = out.read_text().splitlines()
    assert len(lines) == 12 and all(json.loads(x) for x in lines)

    # a second writer of the same file is refused while the first holds it
    settings = EvalSettings(k=K, max_tokens=64, seed=0)
    holder = ResultsFile(out, settings.fingerprint("scripted", str(data)))
    with pytest.raises(ResultsBusy, match="another evaluation is writing"):
        ResultsFile(out, settings.fingerprint("scripted", str(data)))
    holder.close()
    # other sampling settings on the same file: refused with a clear message
    with pytest.raises(ResumeMismatch, match="temperature"):
        ResultsFile(out, EvalSettings(k=K, temperature=0.6, max_tokens=64).fingerprint("scripted", str(data)))


def test_retries_after_500s_and_timeouts(tmp_path):
    data = _math_parquet(tmp_path)

    def flaky(body, attempt):
        q, j = _question(body), body["seed"] % SEED_STRIDE
        if q == "What is 2 + 3?" and j == 1 and attempt < 2:
            return Reply(status=500)
        if q == "What is 4 + 6?" and j == 2 and attempt == 0:
            return Reply(delay_s=1.5)  # longer than the client's timeout
        if q == "What is 4 + 6?" and j == 3 and attempt == 0:
            return Reply(status=503)
        return _known_reply(body, attempt)

    with ScriptedServer(flaky) as srv:
        recs, client = _eval(srv.url, data, tmp_path / "out.jsonl", request_timeout_s=0.5, backoff_s=0.01,
                             max_retries=3)
        assert client.retries == 4 and srv.chat_requests == len(KNOWN) * K + 4
    assert [r["correct"] for r in recs] == [bool(x) for _, p in KNOWN.values() for x in p]

    # vLLM rejects prompt + max_tokens beyond its context window (verl's servers cap instead): asked again
    # for what fits
    def small_context(body, attempt):
        if body["max_tokens"] > 40:
            return Reply(status=400, error={"message": "This model's maximum context length is 50 tokens. However, "
                                            "you requested 74 tokens (10 in the messages, 64 in the completion)."})
        return _known_reply(body, attempt)

    with ScriptedServer(small_context) as srv:
        recs, _ = _eval(srv.url, data, tmp_path / "out3.jsonl", backoff_s=0.01)
        assert sorted({b["max_tokens"] for b in srv.bodies}) == [40, 64] and srv.chat_requests == 24
    assert [r["correct"] for r in recs] == [bool(x) for _, p in KNOWN.values() for x in p]

    # a server that keeps failing: a clear error after the retries, nothing recorded for that sample
    with ScriptedServer(lambda b, a: Reply(status=500)) as srv:
        with pytest.raises(Exception, match=r"failed after 2 attempt\(s\): HTTP 500"):
            _eval(srv.url, data, tmp_path / "out2.jsonl", backoff_s=0.01, max_retries=1)
    assert (tmp_path / "out2.jsonl").read_text() == "" if (tmp_path / "out2.jsonl").exists() else True


# ------------------------------------------------------------------------------------------- tool use

TOOL_Q = "What is 123 * 457?"
CALL = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(123 * 457)"}}\n</tool_call>'


def _tool_reply(body, attempt):
    j = body["seed"] % SEED_STRIDE
    msgs = body["messages"]
    tool_msgs = [m for m in msgs if m["role"] == "tool"]
    if not tool_msgs:  # first turn
        if j == 0:
            return Reply(CALL)
        if j == 1:  # the tool prints a boxed answer; the model itself never writes one
            return Reply('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": '
                         '"print(\'\\\\\\\\boxed{56211}\')"}}\n</tool_call>')
        if j == 2:  # a server with a tool-call parser returns structured calls
            return Reply(None, finish_reason="tool_calls", tool_calls=[{
                "id": "call_7", "type": "function",
                "function": {"name": "code_interpreter", "arguments": json.dumps({"code": "print(123 * 457)"})}}])
        return Reply('<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1)"}</tool_call>')
    obs = tool_msgs[-1]["content"].strip()
    if j == 0:
        return Reply(f"The result is \\boxed{{{obs}}}.")
    if j == 1:
        return Reply("Done.")
    if j == 2:
        assert tool_msgs[-1].get("tool_call_id") == "call_7" and msgs[-2].get("tool_calls")
        return Reply(f"\\boxed{{{obs}}}")
    return Reply(f"The tool said: {obs[:60]} \\boxed{{0}}")


def test_tool_use_loop_through_the_api(tmp_path):
    row = to_tool_use_row(make_row(TOOL_Q, "56211", "rg/products", 0, "test", family="tool_use"))
    data = write_parquet([row], tmp_path / "tool_test.parquet")
    tools = load_tools()
    try:
        with ScriptedServer(_tool_reply) as srv:
            settings = EvalSettings(k=4, max_tokens=512, seed=0, max_turns=4)
            recs, _ = _eval(srv.url, data, tmp_path / "out.jsonl", settings=settings, tools=tools)
            first = srv.bodies[0]
            assert first["tools"][0]["function"]["name"] == "code_interpreter"
            assert first["messages"][0]["role"] == "system"
            seconds = [b for b in srv.bodies if any(m["role"] == "tool" for m in b["messages"])]
            sandbox_out = {b["seed"] % SEED_STRIDE: b["messages"][-1]["content"] for b in seconds}
            budgets = {j: [b["max_tokens"] for b in srv.bodies if b["seed"] % SEED_STRIDE == j] for j in range(4)}
    finally:
        asyncio.run(tools["code_interpreter"].aclose())
    assert sandbox_out[0].strip() == "56211"  # real sandbox output went back as a tool message
    assert sandbox_out[1].strip() == "\\boxed{56211}"
    assert "not valid JSON" in sandbox_out[3]  # malformed call answered by the training loop's message
    r0, r1, r2, r3 = recs
    assert r0["correct"] and r0["response"] == "The result is \\boxed{56211}."  # tool call removed from the text
    assert (r0["turns"], r0["tool_calls"], r0["tool_executed"], r0["tool_errors"]) == (2, 1, 1, 0)
    # usage: 10 completion tokens a turn; the prompt grows by 10 (assistant + tool message, 5 each here)
    assert r0["tokens"] == 20 and r0["response_tokens"] == (20 - 10) + 10
    assert budgets[0] == [512, 512 - 10]  # each turn asks for what is left of the episode budget
    assert not r1["correct"] and r1["response"] == "Done." and "56211" not in r1["response"]  # no credit
    assert r2["correct"] and r2["tool_executed"] == 1
    assert not r3["correct"] and r3["malformed_calls"] == 1 and r3["tool_executed"] == 0
    tools_summary = summarize(recs)["groups"]["all"]["tools"]
    assert tools_summary["mean_calls"] == 1.0 and tools_summary["malformed_rate"] == pytest.approx(0.25)


# ------------------------------------------------------------------------------------------ bad input


def test_clear_errors_for_bad_input(tmp_path, capsys):
    data = _math_parquet(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed

    async def check(url, model):
        async with ChatClient(ClientConfig(url=url, model=model, max_retries=1, backoff_s=0.01)) as c:
            return await c.check_model()

    with pytest.raises(ServerUnreachable, match=f"cannot reach the server at http://127.0.0.1:{port}/v1") as err:
        asyncio.run(check(f"http://127.0.0.1:{port}", "m"))
    assert "2 attempt(s))" in str(err.value)  # max_retries=1 allows 2: nothing was cut, nothing said about it

    async def probe_default_retries():  # default max_retries=5: a refused first contact is tried twice only
        cfg = ClientConfig(url=f"http://127.0.0.1:{port}", model="m", backoff_s=0.01)
        async with ChatClient(cfg) as c:
            cut = r"2 attempt\(s\), a first contact refused or unanswered is tried twice only\)"
            with pytest.raises(ServerUnreachable, match=cut):
                await c.check_model()
            return c.requests

    assert asyncio.run(probe_default_retries()) == 2
    with ScriptedServer(_known_reply, models=("scripted", "other")) as srv:
        with pytest.raises(ModelNotServed, match=r"does not serve model 'qwen'.*\['scripted', 'other'\]"):
            asyncio.run(check(srv.url, "qwen"))
        with pytest.raises(ModelNotServed, match="choose one with --model"):
            asyncio.run(check(srv.url + "/v1/", None))
        assert srv.chat_requests == 0

    with pytest.raises(DatasetError, match="does not exist"):
        load_problems(tmp_path / "nope.parquet")
    bad = write_parquet([{"question": "1+1?", "answer": "2"}], tmp_path / "bad.parquet")
    with pytest.raises(DatasetError, match=r"missing column\(s\) \['prompt', 'data_source', 'reward_model'\]"):
        load_problems(bad)
    (tmp_path / "bad.jsonl").write_text(json.dumps(
        {"prompt": "just text", "data_source": "x", "reward_model": {"ground_truth": "2"}}) + "\n")
    with pytest.raises(DatasetError, match="row 0: prompt is not a list"):
        load_problems(tmp_path / "bad.jsonl")

    # the CLI turns them into one line: status 1 for a server that cannot be reached (it ran), 2 for a refused input
    assert cli.main(["--url", f"http://127.0.0.1:{port}", "--model", "m", "--data", str(data), "--retries", "0"]) == 1
    assert "cannot reach the server" in capsys.readouterr().err
    assert cli.main(["--url", f"http://127.0.0.1:{port}", "--data", str(tmp_path / "nope.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["--runs-dir", str(tmp_path / "runs"), "--no-progress"]) == 2
    assert re.search(r"no checkpoint found under .*runs.*make train-tooluse", capsys.readouterr().err)


def test_a_server_that_accepts_but_never_answers_is_reported_in_seconds():
    """The first contact waits probe_timeout_s, not the 600 s request timeout, and is tried twice, not 6 times."""
    import time

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel accepts connections into the backlog; nothing ever reads or answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"

        async def probe():
            cfg = ClientConfig(url=url, model="m", probe_timeout_s=0.5, backoff_s=0.01)  # request_timeout_s 600
            async with ChatClient(cfg) as c:
                with pytest.raises(ServerUnreachable) as err:
                    await c.check_model()
                return c.requests, str(err.value)

        t0 = time.monotonic()
        requests, message = asyncio.run(probe())
        took = time.monotonic() - t0
    assert requests == 2 and took < 60, (requests, took)  # 6 x 600 s before
    assert "no answer in 0.5 s on first contact (probe_timeout_s)" in message
    assert "2 attempt(s), a first contact refused or unanswered is tried twice only" in message


def test_an_html_error_page_is_one_line():
    import httpx

    from stare_verl.jobs.evaluation.client import _error_text

    page = "<html>\n<head><title>404 Not Found</title></head>\n<body>\n" + "<p>x</p>\n" * 200 + "</body></html>"
    text = _error_text(httpx.Response(404, text=page))
    assert "\n" not in text and text.startswith("<html> <head><title>404 Not Found</title></head> <body>")
    assert len(text) == 304 and text.endswith(" ...")  # 300 characters and the mark that it was cut
    assert _error_text(httpx.Response(400, json={"error": {"message": "bad\n  request"}})) == "bad request"


def test_cli_end_to_end_table_summary_and_resume(tmp_path, capsys):
    data = _math_parquet(tmp_path)
    out = tmp_path / "res.jsonl"
    args = ["--url", srv_url := "", "--data", str(data), "--k", "4", "--max-tokens", "64", "--out", str(out),
            "--no-progress", "--pass-k", "1", "2", "4"]
    with ScriptedServer(_known_reply) as srv:
        args[1] = srv_url = srv.url
        assert cli.main(args) == 0
        assert srv.chat_requests == 12
        assert cli.main(args) == 0  # all answered: nothing asked again
        assert srv.chat_requests == 12
    printed = capsys.readouterr().out
    assert "avg@k" in printed and "pass@4" in printed and "66.7" in printed
    summary = json.loads((tmp_path / "res.summary.json").read_text())
    assert summary["settings"]["model"] == "scripted" and srv_url in summary["settings"]["url"]
    assert summary["groups"]["toy"]["pass@k"]["2"] == pytest.approx(0.5)


def test_cli_resume_refuses_stale_samples_and_starts_afresh(tmp_path, capsys, caplog):
    """Issue 31.11 through the command line: data edited in place, a deleted settings file with another model
    and temperature, and a corrupt record."""
    data = _math_parquet(tmp_path)
    out = tmp_path / "res.jsonl"
    with ScriptedServer(_known_reply, models=("scripted", "other")) as srv:
        base = ["--url", srv.url, "--data", str(data), "--k", "4", "--max-tokens", "64", "--out", str(out),
                "--no-progress"]  # fmt: skip
        assert cli.main([*base, "--model", "scripted"]) == 0 and srv.chat_requests == 12
        capsys.readouterr()
        # the ground truth of "2 + 3" changes in place: the old records were scored against "5"
        rows = [make_row(q, "6" if a == "5" else a, "toy", i, "test") for i, (q, (a, _)) in enumerate(KNOWN.items())]
        write_parquet(rows, data)
        assert cli.main([*base, "--model", "scripted"]) == 2
        err = capsys.readouterr().err
        assert "data_sha256 differ" in err and "content changed" in err and "--overwrite" in err
        assert srv.chat_requests == 12  # nothing asked, nothing reused
        assert cli.main([*base, "--model", "scripted", "--overwrite"]) == 0 and srv.chat_requests == 24
        summary = json.loads((tmp_path / "res.summary.json").read_text())
        assert summary["groups"]["toy"]["avg@k"] == pytest.approx((0 + 1 / 4 + 0) / 3)  # "5" is now wrong
        capsys.readouterr()
        # the settings file deleted: another model and temperature must not reuse the old samples
        (tmp_path / "res.jsonl.meta.json").unlink()
        assert cli.main([*base, "--model", "other", "--temperature", "0.5"]) == 2
        err = capsys.readouterr().err
        assert "settings file" in err and "is missing" in err and "--overwrite" in err
        assert srv.chat_requests == 24
        # a corrupt record (JSON-valid, bad field) is skipped and its sample asked again, not a crash
        assert cli.main([*base, "--model", "other", "--temperature", "0.5", "--overwrite"]) == 0
        assert srv.chat_requests == 36
        lines = out.read_text().splitlines()
        lines[0] = json.dumps({**json.loads(lines[0]), "sample_index": "abc"})
        lines[1] = json.dumps({**json.loads(lines[1]), "problem_id": [1]})
        out.write_text("\n".join(lines) + "\n")
        capsys.readouterr()
        assert cli.main([*base, "--model", "other", "--temperature", "0.5"]) == 0
        assert srv.chat_requests == 38  # the two damaged samples only
        assert any("skipped 2 line(s) that are no valid record (line 1: sample_index" in m for m in caplog.messages)
    summary = json.loads((tmp_path / "res.summary.json").read_text())
    assert summary["groups"]["all"]["samples"] == 12 and summary["settings"]["model"] == "other"


# -------------------------------------------------------------------------------------- local checkpoint


def test_local_checkpoint_mode_finds_latest_run_and_resumes(tmp_path, capsys, monkeypatch):
    import envs.reward
    from stare_verl.jobs.evaluation.local import find_latest_checkpoint
    from tests.support.tiny import build_tiny_model

    run = tmp_path / "runs" / "tooluse-cpu"
    old = run / "checkpoints" / "global_step_1" / "actor" / "huggingface"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")  # an older step without weights: not the latest, never looked at
    ck = Path(build_tiny_model(run / "checkpoints" / "global_step_2" / "actor" / "huggingface"))
    rows = [to_tool_use_row(make_row(q, a, "rg/chain_sum", i, "test", family="tool_use"))
            for i, (q, (a, _)) in enumerate(list(KNOWN.items())[:2])]
    write_parquet(rows, run / "data" / "val.parquet")
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")  # as verl records its last save
    assert find_latest_checkpoint(tmp_path / "runs") == ck

    real, scored = envs.reward.compute_score, []
    monkeypatch.setattr(envs.reward, "compute_score", lambda *a, **kw: scored.append(a[1]) or real(*a, **kw))
    args = ["--runs-dir", str(tmp_path / "runs"), "--k", "2", "--max-tokens", "24", "--no-progress"]
    assert cli.main(args) == 0
    out = run / "eval" / "local" / "val_k2_t1_p0.7.jsonl"
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(scored) == sorted(r["response"] for r in recs)  # each sample scored once, its record's text
    assert all(list(r) == list(RECORD_KEYS) for r in recs)  # the one record schema, in its order
    assert sorted((r["problem_index"], r["sample_index"]) for r in recs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in recs:  # a random model: budget respected, nothing correct, no tool output in the text
        assert 1 <= r["tokens"] <= 24 and r["response_tokens"] <= 24 and r["turns"] >= 1
        assert r["correct"] is False and r["finish_reason"] in ("stop", "length")
    summary = json.loads((run / "eval" / "local" / "val_k2_t1_p0.7.summary.json").read_text())
    assert summary["groups"]["all"]["avg@k"] == 0.0 and summary["groups"]["all"]["samples"] == 4
    assert summary["groups"]["all"]["mean_tokens"] == pytest.approx(sum(r["tokens"] for r in recs) / 4)
    before = out.read_text()
    assert cli.main(args) == 0 and out.read_text() == before  # resumed: nothing generated again
    assert len(scored) == 4


def test_tool_loop_context_overflow_and_tool_choice_refusal(tmp_path):
    row = to_tool_use_row(make_row(TOOL_Q, "56211", "rg/products", 0, "test", family="tool_use"))
    data = write_parquet([row], tmp_path / "tool_test.parquet")
    tools = load_tools()
    settings = EvalSettings(k=1, max_tokens=512, seed=0)

    def overflow(body, attempt):  # the second turn no longer fits the server's window (no numbers given)
        if any(m["role"] == "tool" for m in body["messages"]):
            return Reply(status=400, error={"message": "Input is too long for this model's context length."})
        return Reply("I will compute it. " + CALL)

    def refuses_tools(body, attempt):  # vLLM started without --enable-auto-tool-choice
        return Reply(status=400, error={"message": '"auto" tool choice requires --enable-auto-tool-choice and '
                                                   "--tool-call-parser to be set"})

    try:
        with ScriptedServer(overflow) as srv:
            (rec,), _ = _eval(srv.url, data, tmp_path / "a.jsonl", settings=settings, tools=tools)
        assert rec["truncated"] and rec["termination"] == "length" and rec["finish_reason"] == "context_length"
        assert rec["turns"] == 1 and rec["tool_executed"] == 1 and not rec["correct"]
        assert rec["response"] == "I will compute it." and "too long" in rec["error"]
        with ScriptedServer(refuses_tools) as srv:
            with pytest.raises(Exception, match="--tool-choice none"):
                _eval(srv.url, data, tmp_path / "b.jsonl", settings=settings, tools=tools)
            assert srv.chat_requests == 1  # a 4xx is not retried
    finally:
        asyncio.run(tools["code_interpreter"].aclose())


def test_sft_checkpoint_gets_its_heldout_set(tmp_path):
    from stare_verl.jobs.evaluation.local import heldout_data_for_sft
    from tests.support.demos import heldout_problems

    ck = tmp_path / "sft-x"
    ck.mkdir()
    assert heldout_data_for_sft(ck, tmp_path / "d") is None  # not an SFT checkpoint
    (ck / "sft_config.json").write_text(json.dumps({"config": {"data_seed": 3, "n_heldout": 4}}))
    probs = load_problems(heldout_data_for_sft(ck, tmp_path / "d"))
    expected = heldout_problems(4, 3)
    assert [p.ground_truth for p in probs] == [e.answer for e in expected]
    assert all(p.tool_use and p.prompt == [{"role": "user", "content": e.question}]
               for p, e in zip(probs, expected, strict=True))


def test_run_data_is_taken_from_the_checkpoints_run_folder_only(tmp_path):
    from stare_verl.jobs.evaluation.local import LocalCheckpointError, find_run_data

    # an unrelated sibling run's val.parquet and a data folder above the run must never be picked
    (tmp_path / "other" / "data").mkdir(parents=True)
    (tmp_path / "other" / "data" / "val.parquet").write_bytes(b"x")
    (tmp_path / "val.parquet").write_bytes(b"x")
    ck = tmp_path / "run" / "checkpoints" / "global_step_3" / "actor" / "huggingface"
    ck.mkdir(parents=True)
    with pytest.raises(LocalCheckpointError, match="give --data"):
        find_run_data(ck)
    (tmp_path / "run" / "data").mkdir()
    (tmp_path / "run" / "data" / "val.parquet").write_bytes(b"x")
    assert find_run_data(ck) == (tmp_path / "run" / "data" / "val.parquet").resolve()
    # a model folder outside any run: no guessing
    lone = tmp_path / "models" / "m"
    lone.mkdir(parents=True)
    with pytest.raises(LocalCheckpointError):
        find_run_data(lone)


@pytest.mark.parametrize("family", ["shortcot", "longcot"])
def test_cot_sft_checkpoint_is_evaluated_as_its_family(tmp_path, capsys, family):
    from stare_verl.jobs.evaluation.local import demo_family, heldout_data_for_sft
    from stare_verl.jobs.families import job_family
    from tests.support.demos import heldout_problems
    from tests.support.tiny import build_tiny_model

    ck = Path(build_tiny_model(tmp_path / "sft-cot"))
    (ck / "sft_config.json").write_text(json.dumps({"config": {"data_seed": 2, "n_heldout": 3, "family": family}}))
    data = heldout_data_for_sft(ck, tmp_path / "d")
    probs = load_problems(data)
    expected = heldout_problems(3, 2, family=family)
    assert [p.ground_truth for p in probs] == [e.answer for e in expected]
    assert all(not p.tool_use and p.extra_info["family"] == job_family(family).name for p in probs)
    assert {demo_family(p) for p in probs} == {family}
    args = ["--checkpoint", str(ck), "--data", str(data), "--k", "2", "--max-tokens", "16", "--no-progress",
            "--out", str(tmp_path / "out")]
    assert cli.main(args) == 0
    recs = [json.loads(x) for x in (tmp_path / "out").read_text().splitlines()]
    assert len(recs) == 6
    for r in recs:  # one turn, no tool: a random model answers nothing correctly within the budget
        assert r["turns"] == 1 and r["tokens"] <= 16 and r["correct"] is False


@pytest.mark.parametrize("damage", ["truncated", "garbage_header", "missing_shard"])
def test_a_local_checkpoint_whose_weights_do_not_load_is_one_error_not_a_traceback(tmp_path, damage):
    """The evaluation CLI loaded such a folder with transformers and ended in its SafetensorError traceback; the
    weights check of the training job (stare_verl.models.registry.weights_problem) now runs first."""
    import json

    from stare_verl.jobs.evaluation.local import LocalCheckpointError, run_local_eval
    from tests.support.model_folder import write_model_folder

    ck = write_model_folder(tmp_path / "ck")
    f = ck / "model.safetensors"
    data = f.read_bytes()
    if damage == "truncated":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "garbage_header":
        f.write_bytes(b"GARBAGEGARBAGE" + data[14:])
    else:
        f.rename(ck / "model-00001-of-00002.safetensors")
        (ck / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(LocalCheckpointError) as err:
        run_local_eval(ck, [], EvalSettings(), None)  # refused before the results file is touched
    assert str(err.value).startswith(f"{ck}: ") and "\n" not in str(err.value)
    assert "safetensors" in str(err.value)


def test_model_without_url_is_the_model_evaluated_here(tmp_path, capsys):
    """--model was read only with --url: without it the newest checkpoint under runs/ was evaluated instead of the
    model the user named. Now it names the folder (or prepared registered model) evaluated on this CPU."""
    from tests.support.tiny import build_tiny_model

    model = Path(build_tiny_model(tmp_path / "my-model"))
    rows = [to_tool_use_row(make_row(q, a, "rg/chain_sum", i, "test", family="tool_use"))
            for i, (q, (a, _)) in enumerate(list(KNOWN.items())[:2])]  # fmt: skip
    data = write_parquet(rows, tmp_path / "val.parquet")
    runs = tmp_path / "runs"
    args = ["--model", str(model), "--data", str(data), "--runs-dir", str(runs), "--k", "1", "--max-tokens", "8",
            "--no-progress"]  # fmt: skip
    assert cli.main(args) == 0
    assert f"evaluating local checkpoint {model}" in capsys.readouterr().err
    recs = [json.loads(x) for x in (runs / "eval" / "my-model" / "val_k1_t1_p0.7.jsonl").read_text().splitlines()]
    assert sorted(r["problem_index"] for r in recs) == [0, 1] and all(1 <= r["tokens"] <= 8 for r in recs)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--model", "MODEL", "--checkpoint", "CK"], "both name the model to evaluate on this CPU"),
        (["--model", "tiny"], "the from-scratch model the jobs train"),
        (["--model", "no-such-model"], "neither a registered model"),
        (["--model", "EMPTY"], "the folder has no config.json"),
    ],
)  # fmt: skip
def test_model_without_url_that_cannot_be_evaluated_is_one_error(tmp_path, capsys, extra, said):
    from tests.support.model_folder import write_model_folder

    folder = write_model_folder(tmp_path / "m")
    (tmp_path / "empty").mkdir()
    names = {"MODEL": str(folder), "CK": str(folder), "EMPTY": str(tmp_path / "empty")}
    args = [names.get(x, x) for x in extra] + ["--runs-dir", str(tmp_path / "runs"), "--no-progress"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
