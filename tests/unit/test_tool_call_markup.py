"""Issue 14 items 4 and 5: markup inside a call's JSON ends nothing (parser, content, reward text, think spans),
and empty arguments of a tool without required parameters are ``{}``. Pure functions: no verl, no sandbox."""

import json
import time
from types import SimpleNamespace

import pytest

from envs.markup import scan_markup
from envs.scoring.extract import think_visible_spans
from envs.tool_use.parser import parse_tool_calls, remove_tool_calls, strip_thinking
from envs.tools.schema import tool_call_text


def _schema(required, props):
    params = SimpleNamespace(required=required, properties={k: SimpleNamespace(type=t) for k, t in props.items()})
    return SimpleNamespace(function=SimpleNamespace(parameters=params))


TOOLS = {"code_interpreter": _schema(["code"], {"code": "string"}), "clock": _schema([], {"tz": "string"})}

# code that prints or handles markup: every tag the scans look for, alone and combined, inside the JSON strings
MARKUP_CODES = [
    'print("</tool_call>")',
    'print("<tool_call>")',
    'print("<think>")',
    'print("</think>")',
    's = "</tool_call>\\\\boxed{9}"\nprint(s)',
    't = "<think>" + "</think></tool_call><tool_call>"\nprint(len(t))',
    "x = '</think>'; y = '<think>'; print(x, y)  # </tool_call>",
]


@pytest.mark.parametrize("code", MARKUP_CODES)
def test_markup_inside_the_json_ends_nothing(code):
    call = tool_call_text(code)
    text = f"Let me run it. {call} I wait.\\boxed{{1}}"
    content, calls = parse_tool_calls(text, TOOLS)
    assert len(calls) == 1 and calls[0].ok, calls
    assert calls[0].arguments == {"code": code}
    assert content == "Let me run it.  I wait.\\boxed{1}"
    # the reward text never holds the call (the \boxed{9} inside the code is not an answer)
    assert remove_tool_calls(text) == "Let me run it.  I wait.\\boxed{1}"
    # the think-span scan sees no reasoning block: the whole text is visible
    assert think_visible_spans(text) == ([(0, len(text))], 0)
    assert strip_thinking(text) == text


@pytest.mark.parametrize("code", MARKUP_CODES)
def test_markup_inside_a_call_within_reasoning_and_after_it(code):
    call = tool_call_text(code)
    text = f"<think>draft {call} hmm</think>answer {call} end"
    content, calls = parse_tool_calls(text, TOOLS)
    assert [c.arguments for c in calls] == [{"code": code}]  # the one inside reasoning is never run
    assert content == "answer  end"
    assert strip_thinking(text) == f"answer {call} end"
    assert remove_tool_calls(text) == "<think>draft  hmm</think>answer  end"
    # prompt-opened reasoning (R1): the unmatched </think> after the first call ends reasoning
    text2 = f"plan {call} more</think>answer {call}"
    content, calls = parse_tool_calls(text2, TOOLS)
    assert len(calls) == 1 and calls[0].ok and content == "answer"
    assert [c.in_think for c in scan_markup(text2).calls] == [True, False]


def test_broken_json_holding_markup_ends_at_its_own_end_tag():
    # the JSON breaks after the string with the tags (missing brace): the call still ends at the real end tag
    for tag in ("</tool_call>", "<tool_call>", "<think>", "</think>"):
        code = "print('" + tag + "')\\nx='\\\\boxed{7}'"
        body = '{"name": "code_interpreter", "arguments": {"code": "' + code + '"}'
        text = f"a <tool_call>{body}</tool_call> b \\boxed{{2}}"
        content, calls = parse_tool_calls(text, TOOLS)
        assert len(calls) == 1 and calls[0].error.startswith("Error: the tool call is not valid JSON"), tag
        assert calls[0].raw == body
        assert content == "a  b \\boxed{2}" and remove_tool_calls(text) == "a  b \\boxed{2}"
        assert strip_thinking(text) == text


def test_broken_call_ends_before_a_think_tag_after_its_break():
    # a bare tag in prompt-opened reasoning is prose that the later </think> hides (as before the fix)
    good = tool_call_text("print(2)")
    text = f"I could use <tool_call> here</think>answer {good}"
    content, calls = parse_tool_calls(text, TOOLS)
    assert [c.arguments for c in calls] == [{"code": "print(2)"}] and content == "answer"
    # an unclosed call before an opened block: one "not closed" call, the block still hides its text
    content, calls = parse_tool_calls("x <tool_call>{bad <think>secret</think> y", TOOLS)
    assert len(calls) == 1 and "not closed" in calls[0].error and content == "x  y"
    # text after a well-formed JSON object before the end tag: malformed, and its end is the end tag
    content, calls = parse_tool_calls('<tool_call>{"name": "clock"}} oops</tool_call> z', TOOLS)
    assert "not valid JSON (Extra data" in calls[0].error and content == "z"


@pytest.mark.parametrize("args", ['""', '"   "', '" \\n\\t "', "null"])
def test_empty_arguments_of_an_all_optional_tool_are_an_empty_object(args):
    _, calls = parse_tool_calls(f'<tool_call>{{"name": "clock", "arguments": {args}}}</tool_call>', TOOLS)
    assert calls[0].ok and calls[0].arguments == {}
    _, calls = parse_tool_calls('<tool_call>{"name": "clock"}</tool_call>', TOOLS)
    assert calls[0].ok and calls[0].arguments == {}


@pytest.mark.parametrize("args", ['""', '"   "', "null", "{}"])
def test_empty_arguments_of_a_tool_with_required_ones_stay_a_clear_error(args):
    _, calls = parse_tool_calls(f'<tool_call>{{"name": "code_interpreter", "arguments": {args}}}</tool_call>', TOOLS)
    assert calls[0].error == "Error: tool 'code_interpreter' needs the argument(s) code; nothing was run."
    # other non-object arguments are still an error of their own
    _, calls = parse_tool_calls('<tool_call>{"name": "clock", "arguments": "x"}</tool_call>', TOOLS)
    assert calls[0].error.startswith("Error: \"arguments\" of tool 'clock' must be a JSON object")


def _best_time(fn, reps=3):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


FLOODS = {
    "bare calls": "<tool_call>",
    "calls in reasoning": "<think><tool_call>",
    "calls ended by close think": "<tool_call></think>",
    "calls ended by think blocks": "<tool_call><think></think>",
    "string holding the end tag": '<tool_call>{"a": "</tool_call>',
    "opened strings in reasoning": '<think><tool_call>{"a": "',
    "opened arrays in reasoning": '<think><tool_call>{"a": [',
    "well-formed calls in reasoning": '<think><tool_call>{"a": "\\"</tool_call>"}</tool_call>',
    "open braces": "<tool_call>{",
}


@pytest.mark.parametrize("unit", list(FLOODS.values()), ids=list(FLOODS))
def test_scans_stay_linear_on_tag_floods(unit):
    def run(n):
        text = unit * n
        return lambda: (parse_tool_calls(text, TOOLS), remove_tool_calls(text), think_visible_spans(text))

    small, big = 2_000, 16_000
    t_small, t_big = _best_time(run(small)), _best_time(run(big), reps=1)
    # linear: ratio ~8; quadratic: ~64. Loose (shared, loaded CPUs), with a floor for tiny timings.
    assert t_big < 24 * max(t_small, 0.005), (t_small, t_big)


def test_hundred_thousand_tags_take_bounded_time():
    text = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(\'</tool_call>\')"}}</tool_call>'
    t0 = time.process_time()
    content, calls = parse_tool_calls(text * 100_000 + "<tool_call>" * 100_000, TOOLS)
    # ~1 s of CPU on an idle core; the bound only catches a quadratic scan (hours)
    assert time.process_time() - t0 < 30
    assert len(calls) == 100_001 and all(c.ok for c in calls[:-1]) and content == ""
    assert json.loads(json.dumps(calls[0].arguments)) == {"code": "print('</tool_call>')"}
