"""Tool-call parsing and reward-text extraction of the stare_tool_agent loop (pure functions, no episodes)."""

import asyncio
import json

import pytest
from verl.tools.schemas import OpenAIFunctionToolSchema

from envs.simulators import build_tiny_tokenizer, tool_call_text
from envs.tool_use.agent_loop import (
    HermesThinkToolParser,
    model_response_text,
    parse_tool_calls,
    remove_tool_calls,
    strip_thinking,
)

SCHEMA = OpenAIFunctionToolSchema.model_validate(
    {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "Run Python code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "timeout": {"type": ["integer", "null"]}},
                "required": ["code"],
            },
        },
    }
)
TOOLS = {"code_interpreter": SCHEMA}


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def test_think_wrapped_call_is_ignored_exactly_one_call_print2():
    text = (
        '<think>maybe <tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1)"}}</tool_call>'
        '</think><tool_call>{"name": "code_interpreter", "arguments": {"code": "print(2)"}}</tool_call>'
    )
    content, calls = parse_tool_calls(text, TOOLS)
    assert len(calls) == 1
    assert calls[0].ok and calls[0].name == "code_interpreter"
    assert calls[0].arguments == {"code": "print(2)"}
    assert content == ""


def test_think_opened_in_prompt_and_unclosed_think():
    # Template opened <think> in the prompt: the turn starts inside the thinking.
    inner = tool_call_text("print(1)")
    content, calls = parse_tool_calls(f"plan {inner}</think>answer {tool_call_text('print(3)')}", TOOLS)
    assert [c.arguments["code"] for c in calls] == ["print(3)"]
    assert content == "answer"
    # An unclosed <think> hides everything after it.
    assert parse_tool_calls(f"x <think>hmm {inner}", TOOLS)[1] == []
    assert strip_thinking("a<think>b</think>c<think>d</think>e") == "ace"


def test_nested_think_blocks_hide_their_whole_span():
    inner = tool_call_text("print(1)")
    # the inner </think> does not end the outer block: no stray tag, no call from inside the outer block
    assert strip_thinking("a<think>x<think>y</think>z</think>b") == "ab"
    content, calls = parse_tool_calls(f"<think>p<think>q</think>{inner}</think>done {tool_call_text('print(2)')}", TOOLS)
    assert [c.arguments["code"] for c in calls] == ["print(2)"] and content == "done"
    # prompt-opened block with a nested one inside; an unclosed nested block hides the rest
    assert strip_thinking("r<think>s</think>t</think>u") == "u"
    assert strip_thinking("a<think>b<think>c</think>d") == "a"
    assert strip_thinking("a</think>b</think>c") == "c"  # every unmatched close ends prompt-opened reasoning
    assert strip_thinking("plain") == "plain" and strip_thinking("") == ""
    long = "<think>" * 20000 + "x" + "</think>" * 20000 + "end"
    assert strip_thinking(long) == "end"


@pytest.mark.parametrize(
    "text",
    ["<think>" * 100_000, "</think>" * 100_000, "<think>" * 100_000 + "x" * 1_000_000,
     "</think>" * 100_000 + "x" * 1_000_000, "<think><tool_call>" * 100_000],
)
def test_think_stripping_is_linear_on_tag_floods(text):
    import time

    t0 = time.process_time()
    stripped = strip_thinking(text)
    content, calls = parse_tool_calls(text, TOOLS)
    # a quadratic scan takes 14-72 s on these (measured); a linear one well under a second (a hang guard in
    # CPU seconds, which other jobs on the machine do not inflate)
    assert time.process_time() - t0 < 10.0
    assert calls == [] and content == stripped.strip() == ("x" * 1_000_000 if text.startswith("</") and
                                                              text.endswith("x") else "")


def test_long_cot_scorer_and_agent_loop_agree_on_think_blocks():
    from envs.reward import compute_score

    cases = {  # text -> (visible text, long-CoT score for ground truth 3)
        "<think>a</think>\\boxed{3}": ("\\boxed{3}", 1.0),
        "a</think>\\boxed{3}": ("\\boxed{3}", 1.0),  # think opened by the chat template
        "<think>a</think><think>\\boxed{3}": ("", 0.0),  # reopened and never closed: no answer
        "<think><think>x</think>\\boxed{3}": ("", 0.0),  # nested block still open
        "<think>a</think>b<think>c</think>\\boxed{3}": ("b\\boxed{3}", 1.0),
    }
    for text, (visible, score) in cases.items():
        assert strip_thinking(text) == visible, text
        assert compute_score("rg/x", text, "3", {"family": "long_cot"})["score"] == score, text


def test_missing_brace_is_an_error_observation():
    text = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1)"}</tool_call>'
    _, calls = parse_tool_calls(text, TOOLS)
    assert len(calls) == 1 and not calls[0].ok
    assert calls[0].error.startswith("Error: the tool call is not valid JSON")
    assert "nothing was run" in calls[0].error
    with pytest.raises(ValueError):
        calls[0].function_call()


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            '{"name": "python", "arguments": {"code": "1"}}',
            "Error: unknown tool 'python'. Available tools: code_interpreter.",
        ),
        (
            '{"name": "code_interpreter", "arguments": {}}',
            "Error: tool 'code_interpreter' needs the argument(s) code",
        ),
        (
            '{"name": "code_interpreter", "arguments": {"code": 5}}',
            "Error: argument 'code' of tool 'code_interpreter' must be a JSON string",
        ),
        (
            '{"name": "code_interpreter", "arguments": [1]}',
            "Error: \"arguments\" of tool 'code_interpreter' must be a JSON object",
        ),
        ('{"arguments": {"code": "1"}}', 'Error: a tool call must be a JSON object with a "name"'),
        ('["code_interpreter"]', 'Error: a tool call must be a JSON object with a "name"'),
    ],
)
def test_malformed_calls_get_readable_errors(body, expected):
    _, calls = parse_tool_calls(f"<tool_call>{body}</tool_call>", TOOLS)
    assert len(calls) == 1 and not calls[0].ok
    assert calls[0].error.startswith(expected)


def test_unclosed_call_is_one_malformed_call_and_valid_union_types():
    _, calls = parse_tool_calls(
        'ok <tool_call>{"name": "code_interpreter", "arguments": {"code": "pri', TOOLS
    )
    assert len(calls) == 1 and calls[0].error.startswith("Error: the tool call was not closed")
    # a stringified arguments object and an optional union-typed argument are accepted
    body = json.dumps(
        {"name": "code_interpreter", "arguments": json.dumps({"code": "print(7)", "timeout": None})}
    )
    _, calls = parse_tool_calls(f"<tool_call>{body}</tool_call>", TOOLS)
    assert calls[0].ok and calls[0].arguments == {"code": "print(7)", "timeout": None}
    assert json.loads(calls[0].function_call().arguments) == {"code": "print(7)", "timeout": None}


def test_two_calls_in_order_and_content():
    text = f"First {tool_call_text('print(1)')} then {tool_call_text('print(2)')} done"
    content, calls = parse_tool_calls(text, TOOLS)
    assert [c.arguments["code"] for c in calls] == ["print(1)", "print(2)"]
    assert content == "First  then  done"
    assert remove_tool_calls("a<tool_call>x</tool_call>b<tool_call>unclosed") == "ab"


def test_model_response_text_uses_only_mask1_tokens_and_drops_calls(tok):
    model1 = tok.encode("Let me check. " + tool_call_text("print(r'\\boxed{42}')"), add_special_tokens=False)
    model1.append(tok.eos_token_id)
    tool = tok.encode("\n<|im_start|>user\n<tool_response>\n\\boxed{42}\n</tool_response><|im_end|>\n")
    model2 = tok.encode("I am not sure.", add_special_tokens=False) + [tok.eos_token_id]
    ids = model1 + tool + model2
    mask = [1] * len(model1) + [0] * len(tool) + [1] * len(model2)
    assert model_response_text(ids, mask, tok) == "Let me check.\nI am not sure."
    # with the mask ignored the tool's \boxed{42} would be in the text
    assert "\\boxed{42}" in tok.decode(ids, skip_special_tokens=True)


def test_verl_parser_registration_hermes_think(tok):
    parser = HermesThinkToolParser(tok)
    ids = tok.encode(
        f"<think>{tool_call_text('print(1)')}</think>{tool_call_text('print(2)')}<tool_call>{{bad</tool_call>",
        add_special_tokens=False,
    )
    content, calls = asyncio.run(parser.extract_tool_calls(ids, [SCHEMA]))
    assert [json.loads(c.arguments)["code"] for c in calls] == ["print(2)"]
    from verl.experimental.agent_loop.tool_parser import ToolParser

    assert isinstance(ToolParser.get_tool_parser("hermes_think", tok), HermesThinkToolParser)


def test_deeply_nested_json_is_a_malformed_call_not_a_crash():
    from envs.tool_use.agent_loop import parse_tool_calls

    _, calls = parse_tool_calls(
        "<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>", {"code_interpreter": None}
    )
    assert len(calls) == 1 and calls[0].arguments is None and "too deeply" in calls[0].error


def test_many_unclosed_tool_call_tags_parse_in_linear_time():
    import time

    from envs.tool_use.agent_loop import parse_tool_calls, remove_tool_calls

    assert remove_tool_calls("a<tool_call>x</tool_call>b<tool_call>y</tool_call>c<tool_call>z") == "abc"
    assert remove_tool_calls("no calls") == "no calls"
    t0 = time.process_time()
    content, calls = parse_tool_calls("<tool_call>" * 50_000, {"code_interpreter": None})
    assert time.process_time() - t0 < 10.0  # CPU seconds; the lazy regex took ~44 s at 20,000 tags
    assert content == "" and len(calls) == 1 and "not closed" in calls[0].error
