"""The API evaluation keeps a turn's reasoning in the next turn's history, as training does (issue 31.12): every
path builds the history message with ``envs.tool_use.history.assistant_message``, and the API's messages, rendered
by the chat template, are the token context the local engine (verl's Continuous Token builder, as the training
loop) gives the model. No server, no model: a scripted chat client and a scripted token policy."""

from __future__ import annotations

import asyncio
import json

import pytest

from envs.simulators import build_tiny_tokenizer, tool_call_text
from envs.tool_use.episode import ToolCallRunner
from envs.tool_use.history import assistant_message, tool_call_dicts
from envs.tool_use.parser import parse_tool_calls
from stare_verl.jobs.evaluation.client import ChatResult
from stare_verl.jobs.evaluation.engine import EngineGenerate
from stare_verl.jobs.evaluation.episode import EvalProblem, Sample, run_episode
from stare_verl.jobs.evaluation.runner import ChatGenerate, EvalSettings

CALL = tool_call_text("print(6 * 7)")


class _Tool:
    """A verl-BaseTool-shaped tool that answers "42" (no schema: no argument checks)."""

    tool_schema = None

    async def create(self, create_kwargs=None):
        return "i", None

    async def execute(self, instance_id, parameters, agent_data=None):
        return "42", None, {}

    async def release(self, instance_id):
        pass


def _problem():
    return EvalProblem(0, "toy/0", "toy", [{"role": "user", "content": "What is 6 * 7?"}], "42",
                       {"family": "tool_use"}, True)


class _Client:
    """A ChatClient stand-in: turn k answers ``results[k]``; every request's messages are recorded."""

    def __init__(self, results):
        self.results, self.requests = list(results), []

    async def chat(self, messages, **params):
        self.requests.append(json.loads(json.dumps(messages)))
        return self.results[len(self.requests) - 1]


def _api_requests(results):
    client = _Client(results)
    rec = asyncio.run(run_episode(Sample(_problem(), 0, 0), ChatGenerate(client, EvalSettings(k=1)), max_tokens=None,
                                  max_turns=4, runner=ToolCallRunner({"code_interpreter": _Tool()})))
    return client.requests, rec


@pytest.mark.parametrize("content, reasoning, expected", [
    (f"Let me compute. {CALL}", "6 * 7 is easy, but check", f"<think>6 * 7 is easy, but check</think>Let me compute. {CALL}"),
    (CALL, "multi\nline\n reasoning ", f"<think>multi\nline\n reasoning </think>{CALL}"),
    (f"<think>inline</think>{CALL}", None, f"<think>inline</think>{CALL}"),  # no reasoning parser: as written
    (CALL, "", CALL),  # nothing to keep
])  # fmt: skip
def test_reasoning_content_stays_in_the_next_turns_history(content, reasoning, expected):
    requests, rec = _api_requests([ChatResult(content=content, reasoning=reasoning or ""),
                                   ChatResult(content="\\boxed{42}")])  # fmt: skip
    assert len(requests) == 2 and requests[0] == [{"role": "user", "content": "What is 6 * 7?"}]
    assistant, tool = requests[1][1:]
    assert assistant == {"role": "assistant", "content": expected}
    assert tool["role"] == "tool" and tool["content"].strip() == "42"
    assert rec.correct and rec.tool_executed == 1
    assert rec.response.startswith(expected.removesuffix(CALL).strip())  # the scored text, as before


def test_reasoning_stays_next_to_calls_the_server_parsed():
    """A server with a reasoning parser and a tool-call parser: content, reasoning_content and tool_calls apart."""
    calls = [{"id": "call_1", "type": "function",
              "function": {"name": "code_interpreter", "arguments": json.dumps({"code": "print(6 * 7)"})}}]
    requests, rec = _api_requests([ChatResult(content="Let me compute.", reasoning="use the tool", tool_calls=calls,
                                              finish_reason="tool_calls"), ChatResult(content="\\boxed{42}")])
    assistant, tool = requests[1][1:]
    assert assistant == {"role": "assistant", "content": "<think>use the tool</think>Let me compute.",
                         "tool_calls": calls}  # fmt: skip
    assert tool["tool_call_id"] == "call_1" and rec.correct


def test_training_and_the_api_build_the_same_history_message():
    """The training loop's message of a turn (its decoded text, parsed calls) and the API's message of the same turn
    split by a server keep the same reasoning and content; the function is the one the loop imports."""
    import envs.tool_use.agent_loop as loop

    assert loop.assistant_message is assistant_message and not hasattr(loop.StareToolAgentLoop, "_assistant_message")
    text = f"<think>R</think>Let me compute. {CALL}"
    _, calls = parse_tool_calls(text, {"code_interpreter": None})
    train = assistant_message(text, tool_call_dicts(calls))
    assert train["content"] == "<think>R</think>Let me compute." and train["tool_calls"][0]["function"] == {
        "name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}  # fmt: skip
    api = assistant_message("Let me compute.", [{"id": "c", **train["tool_calls"][0]}], reasoning="R")
    assert api["content"] == train["content"]
    # calls inside reasoning are reasoning: they stay; a malformed call is a structured error as in training
    text = '<think>maybe <tool_call>{"name": "x"}</tool_call></think>ok <tool_call>{"name": </tool_call>'
    _, calls = parse_tool_calls(text, {})
    msg = assistant_message(text, tool_call_dicts(calls))
    assert msg["content"] == '<think>maybe <tool_call>{"name": "x"}</tool_call></think>ok'
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["invalid_tool_call"]


@pytest.mark.parametrize("reasoning", ["check 6 * 7 with the tool", "a\nb"])
def test_the_api_history_renders_to_the_local_engines_token_context(reasoning):
    """The model writes ``<think>R</think>...<tool_call>...``: the local engine (training's token-in / token-out)
    feeds its own ids back; the API gets the turn split (reasoning_content) and sends messages. Rendered by the
    chat template, the API's second request is the engine's second context, reasoning included."""
    tok = build_tiny_tokenizer()
    turn = f"<think>{reasoning}</think>Let me compute. {CALL}"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    scripted = [tok.encode(turn, add_special_tokens=False) + [eos],
                tok.encode("\\boxed{42}", add_special_tokens=False) + [eos]]  # fmt: skip
    contexts = []

    async def policy(ids, temperature, max_tokens, seed):
        contexts.append(list(ids))
        return scripted[len(contexts) - 1]

    engine = EngineGenerate(tok, policy, temperature=1.0)
    runner = ToolCallRunner({"code_interpreter": _Tool()})
    local = asyncio.run(run_episode(Sample(_problem(), 0, 0), engine, max_tokens=512, max_turns=4, runner=runner,
                                    special_tokens=engine.special_tokens))
    requests, api = _api_requests([ChatResult(content=f"Let me compute. {CALL}", reasoning=reasoning),
                                   ChatResult(content="\\boxed{42}")])  # fmt: skip
    assert len(contexts) == 2 and local.correct and api.correct
    engine_context = tok.decode(contexts[1], skip_special_tokens=False)
    rendered = tok.apply_chat_template(requests[1], tokenize=False, add_generation_prompt=True)
    assert f"<think>{reasoning}</think>" in engine_context
    assert rendered == engine_context


class _UsageClient:
    """A ChatClient stand-in that reports ``usage`` like vLLM: a request's prompt tokens are the previous request's
    prompt + completion tokens + ``observation`` (the tool message and its template tokens); a turn of ``turn_len``
    tokens is cut at the request's ``max_tokens``. Every request's ``max_tokens`` is recorded."""

    def __init__(self, turns, observation, prompt=20):
        self.turns, self.observation, self.prompt = list(turns), observation, prompt
        self.asked, self._context = [], {}  # turn -> prompt + completion of its last request

    async def chat(self, messages, **params):
        n_assistant = sum(m["role"] == "assistant" for m in messages)
        prompt = self.prompt if n_assistant == 0 else self._context[n_assistant - 1] + self.observation
        text, turn_len = self.turns[n_assistant]
        self.asked.append(params["max_tokens"])
        cut = params["max_tokens"] < turn_len
        completion = min(turn_len, params["max_tokens"])
        self._context[n_assistant] = prompt + completion
        return ChatResult(content=text if not cut else "cut", finish_reason="length" if cut else "stop",
                          prompt_tokens=prompt, completion_tokens=completion)


def _budget_episode(turns, observation, max_tokens):
    client = _UsageClient(turns, observation)
    rec = asyncio.run(run_episode(Sample(_problem(), 0, 0), ChatGenerate(client, EvalSettings(k=1)),
                                  max_tokens=max_tokens, max_turns=4,
                                  runner=ToolCallRunner({"code_interpreter": _Tool()})))  # fmt: skip
    return client.asked, rec


def test_api_budget_counts_the_observation_as_training_does():
    """The observation's tokens come out of the episode budget (the local engine's rule): 10 model tokens + 30
    observation tokens leave 60 of 100 for the second turn, whose 70 tokens are asked again cut at 60."""
    asked, rec = _budget_episode([(CALL, 10), ("\\boxed{42}", 70)], observation=30, max_tokens=100)
    assert asked == [100, 90, 60]  # the second request learns the observation's size; the third is cut there
    assert rec.turns == 2 and rec.termination == "length" and rec.finish_reason == "length"
    assert rec.response_tokens == 100 and rec.tokens == 70 and not rec.correct
    asked, rec = _budget_episode([(CALL, 10), ("\\boxed{42}", 5)], observation=30, max_tokens=100)
    assert asked == [100, 90] and rec.correct and rec.response_tokens == 45  # it fits: asked once


def test_api_turn_after_an_observation_that_fills_the_budget_is_dropped():
    """10 model tokens + 95 observation tokens exceed a budget of 100: training ends the episode without a
    second turn, so the turn the server made is dropped (not counted, not scored)."""
    asked, rec = _budget_episode([(CALL, 10), ("\\boxed{42}", 5)], observation=95, max_tokens=100)
    assert asked == [100, 90]
    assert rec.turns == 1 and rec.termination == "length" and rec.tool_executed == 1
    assert not rec.correct and rec.response == "" and rec.tokens == 10 and rec.response_tokens == 10
