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
    # a structural break with no end tag after it: the call runs to the end (its tags are not trusted)
    content, calls = parse_tool_calls("x <tool_call>{bad <think>secret</think> y", TOOLS)
    assert len(calls) == 1 and "not closed" in calls[0].error and content == "x"
    # a bare tag (no JSON after it) still ends at a think tag: reasoning that mentions it keeps its structure
    content, calls = parse_tool_calls("x <tool_call> maybe <think>secret</think> y", TOOLS)
    assert len(calls) == 1 and "not closed" in calls[0].error and content == "x  y"
    # text after a well-formed JSON object before the end tag: malformed, and its end is the end tag
    content, calls = parse_tool_calls('<tool_call>{"name": "clock"}} oops</tool_call> z', TOOLS)
    assert "not valid JSON (Extra data" in calls[0].error and content == "z"


# Broken JSON (a raw newline or tab in a string, a string never closed, Python quotes, a truncated call) that
# holds markup and a \boxed{} after the markup: nothing of the call reaches the content or the reward text.
_NAME = '{"name": "code_interpreter", "arguments": {"code": '
BROKEN_CALLS = [
    _NAME + '"x = 1\nprint(\'</tool_call>\')\nprint(\'\\\\boxed{42}\')"}}</tool_call>',
    _NAME + '"x = 1\tprint(\'</tool_call>\')\\n\\\\boxed{42}"}}</tool_call>',
    _NAME + '"print(\'</tool_call>\') \\\\boxed{42}}}</tool_call>',
    "{'name': 'code_interpreter', 'arguments': {'code': \"print('</tool_call>') \\\\boxed{42}\"}}</tool_call>",
    _NAME + '"x\nprint(\'</think> \\\\boxed{42}\')"}}</tool_call>',
    _NAME + '"x\nprint(\'<think>\')\nprint(\'</tool_call>\\\\boxed{42}\')"}}</tool_call>',
    _NAME + '"x\nprint(\'</think> \\\\boxed{42}',
]


@pytest.mark.parametrize("body", BROKEN_CALLS)
def test_a_broken_call_never_leaks_its_code_into_the_reward(body):
    from envs.tool_use import task
    from envs.tool_use.parser import turn_reward_text

    text = f"Let me compute. <tool_call>{body}"
    content, calls = parse_tool_calls(text, TOOLS)
    assert len(calls) == 1 and not calls[0].ok and content == "Let me compute."
    assert "42" not in remove_tool_calls(text) and "42" not in turn_reward_text(text)
    score = task.compute_score("x", text, "42", {"model_response_text": turn_reward_text(text)})
    assert score["acc"] is False and score["pred"] == ""
    assert "42" not in task.strip_tool_turns(text)
    # text after the call's end tag is the model's own again (not after an unterminated string: it swallows all)
    if body.endswith("</tool_call>") and not scan_markup(text).calls[0].json_error.startswith("Unterminated"):
        after = text + " so \\boxed{7}"
        assert turn_reward_text(after).endswith("so \\boxed{7}")
        assert task.compute_score("x", after, "7", {"model_response_text": turn_reward_text(after)})["acc"] is True


BOX7 = "\\boxed{7}"


@pytest.mark.parametrize(
    "text, gold, right",
    [
        # a broken call inside reasoning left open: its code's </think> closes nothing, so there is no answer
        ('<think><tool_call>{"a": "\n</think>' + BOX7 + '"}</tool_call>', "7", False),
        ("<think>plan <tool_call>{'a': '</think>" + BOX7 + "'}</tool_call>", "7", False),
        # ... and its code's <think> opens nothing, so the answer after the real </think> counts
        ('<think><tool_call>{"a": "\n<think>"}</tool_call></think>\\boxed{42}', "42", True),
        # a truncated call (string never closed): its own </tool_call> ends nothing
        ('<tool_call>{"a": "\n</tool_call>' + BOX7, "7", False),
        ('<tool_call>{"a": "x</tool_call>' + BOX7, "7", False),
        # a bad escape breaks inside a string: the string is skipped before looking for the end tag
        ('<tool_call>{"a": "\\q </tool_call> ' + BOX7 + '"}</tool_call>', "7", False),
        # R1 (prompt-opened reasoning): a call with a raw newline, then </think>, a good call and the answer
        ('r <tool_call>{"a": "\n"}</tool_call> r</think> ok ' + tool_call_text("print(1)") + " \\boxed{42}", "42",
         True),
    ],
)
def test_broken_calls_keep_their_extent_inside_and_outside_reasoning(text, gold, right):
    from envs.reward import compute_score
    from envs.tool_use import task
    from envs.tool_use.parser import turn_reward_text

    for family in ("short_cot", "long_cot"):
        assert compute_score("x", text, gold, family=family)["acc"] is right, family
    rt = turn_reward_text(text)
    assert task.compute_score("x", text, gold, {"model_response_text": rt})["acc"] is right
    content, calls = parse_tool_calls(text, TOOLS)
    assert "</tool_call>" not in content and "print(" not in content


_CI = '{"name": "code_interpreter", "arguments": {"code": '


@pytest.mark.parametrize(
    "text",
    [
        # a quote the code did not escape: JSON-style quote pairing after the break would put the tag outside
        "Let me compute. <tool_call>" + _CI + '"print("</tool_call>"); print("\\\\boxed{42}")"}}</tool_call>',
        "plan <tool_call>" + _CI + '"print("</think>"); print("\\\\boxed{42}")"}}</tool_call>',
        "<think>plan <tool_call>" + _CI + '"print("</think>"); print("\\\\boxed{42}")"}}</tool_call>',
        # a fence or a tool name before the object
        "<tool_call>```json\n" + _CI + '"print(\'</tool_call>\'); print(\'\\\\boxed{42}\')"}}\n```</tool_call>',
        '<tool_call>code_interpreter\n{"code": "print(\'</tool_call> \\\\boxed{42}\')"}</tool_call>',
        'reasoning <tool_call>```json\n{"code": "print(\'</think>\')\\nprint(\'\\\\boxed{42}\')"}\n```</tool_call>',
        # prose whose first letter could start a JSON literal (I for Infinity), then an apostrophe
        "<tool_call>I'll run " + _CI + '"print(\'</tool_call>\'); print(\'\\\\boxed{42}\')"}}</tool_call> done',
    ],
)
def test_no_quote_pairing_or_prefix_lets_a_calls_code_reach_the_reward(text):
    from envs.reward import compute_score
    from envs.tool_use import task
    from envs.tool_use.parser import turn_reward_text

    for family in ("short_cot", "long_cot"):
        assert compute_score("x", text, "42", family=family)["acc"] is False, family
    rt = turn_reward_text(text)
    assert "42" not in rt and task.compute_score("x", text, "42", {"model_response_text": rt})["acc"] is False
    assert "42" not in parse_tool_calls(text, TOOLS)[0]


def test_a_fenced_call_has_its_objects_extent_and_stays_malformed():
    text = "<tool_call>```json\n" + tool_call_text("print(1)")[len("<tool_call>"):-len("</tool_call>")]
    text += "\n```</tool_call> then \\boxed{7}"
    content, calls = parse_tool_calls(text, TOOLS)
    assert len(calls) == 1 and not calls[0].ok and content == "then \\boxed{7}"
    assert "does not follow the tag directly" in calls[0].error


def test_a_think_tag_printed_by_a_call_opens_nothing_for_the_answer():
    from envs.reward import compute_score

    text = tool_call_text("print('<think>')") + " so \\boxed{7}"
    assert compute_score("x", text, "7", family="short_cot")["acc"] is True


def test_huge_integers_in_calls_stay_linear(monkeypatch):
    unit = '<tool_call>{"a": ' + "1" * 4400 + "}</tool_call>"  # beyond Python's int digit limit
    small, big = (_chars_read(monkeypatch, unit * k) for k in (20, 160))
    assert big <= 8.5 * small, (small, big)  # 8x the text: 8x the work (the window grew to the text's end: 64x)
    content, calls = parse_tool_calls(unit * 3 + " ok", TOOLS)
    assert content == "ok" and len(calls) == 1 and "digit" in calls[0].error  # the last end tag closes it


def test_a_broken_call_with_a_raw_newline_keeps_the_good_call_after_it():
    good = tool_call_text("print(2)")
    text = f'<tool_call>{{"name": "code_interpreter", "arguments": {{"code": "x\ny"}}}}</tool_call> {good} done'
    content, calls = parse_tool_calls(text, TOOLS)
    assert [c.ok for c in calls] == [False, True] and calls[1].arguments == {"code": "print(2)"}
    assert calls[0].error.startswith("Error: the tool call is not valid JSON (Invalid control character at char")
    assert content == "done"


def test_a_tag_printed_by_a_call_does_not_split_reasoning_or_wipe_the_fallback_text():
    from envs.reward import compute_score
    from envs.scoring.extract import split_think
    from envs.tool_use import task

    call = tool_call_text("print('</think> \\boxed{42}')")
    text = f"<think>r</think> \\boxed{{7}} {call}"
    assert split_think(text).reasoning == "r"
    for family in ("long_cot", "short_cot"):  # a call's \boxed{} is never the answer, whatever the family
        r = compute_score("x", text, "7", family=family)
        assert r["acc"] is True and r["pred"] == "7", family
    # the fallback strip (no loop text): a call that prints <tool_response> wipes nothing after it
    call2 = tool_call_text("print('<tool_response>')")
    text2 = f"{call2}<|im_end|>\n<tool_response>\n<tool_response>\n</tool_response> \\boxed{{7}}"
    assert task.strip_tool_turns(text2).strip().endswith("\\boxed{7}")


@pytest.mark.parametrize("args", ['""', '"   "', '" \\n\\t "', "null"])
def test_empty_arguments_of_an_all_optional_tool_are_an_empty_object(args):
    _, calls = parse_tool_calls(f'<tool_call>{{"name": "clock", "arguments": {args}}}</tool_call>', TOOLS)
    assert calls[0].ok and calls[0].arguments == {}
    _, calls = parse_tool_calls('<tool_call>{"name": "clock"}</tool_call>', TOOLS)
    assert calls[0].ok and calls[0].arguments == {}


def test_no_tools_at_all_makes_every_call_an_unknown_tool():
    for tools in (None, {}):
        content, calls = parse_tool_calls('hi <tool_call>{"name": "clock"}</tool_call>', tools)
        assert content == "hi" and calls[0].error == "Error: unknown tool 'clock'. Available tools: none."


def test_parameters_is_the_arguments_object_when_arguments_is_absent():
    _, calls = parse_tool_calls('<tool_call>{"name": "clock", "parameters": {"tz": "UTC"}}</tool_call>', TOOLS)
    assert calls[0].ok and calls[0].arguments == {"tz": "UTC"}  # was run with {} (the object silently dropped)
    _, calls = parse_tool_calls('<tool_call>{"name": "code_interpreter", "parameters": {"code": "1"}}</tool_call>',
                                TOOLS)
    assert calls[0].ok and calls[0].arguments == {"code": "1"}
    _, calls = parse_tool_calls('<tool_call>{"name": "clock", "parameters": 3}</tool_call>', TOOLS)
    assert calls[0].error.startswith("Error: \"parameters\" of tool 'clock' must be a JSON object")
    both = '<tool_call>{"name": "clock", "arguments": {"tz": "A"}, "parameters": {"tz": "B"}}</tool_call>'
    assert parse_tool_calls(both, TOOLS)[1][0].arguments == {"tz": "A"}  # "arguments" wins
    for empty in ("null", '""', "{}"):  # ... unless it is empty
        text = f'<tool_call>{{"name": "code_interpreter", "arguments": {empty}, "parameters": {{"code": "1"}}}}</tool_call>'
        assert parse_tool_calls(text, TOOLS)[1][0].arguments == {"code": "1"}, empty
    _, calls = parse_tool_calls('<tool_call>{"name": "clock", "parameters": [1]}</tool_call>', TOOLS)
    assert calls[0].error.startswith("Error: \"parameters\" of tool 'clock' must be a JSON object")


@pytest.mark.parametrize("args", ['""', '"   "', "null", "{}"])
def test_empty_arguments_of_a_tool_with_required_ones_stay_a_clear_error(args):
    _, calls = parse_tool_calls(f'<tool_call>{{"name": "code_interpreter", "arguments": {args}}}</tool_call>', TOOLS)
    assert calls[0].error == "Error: tool 'code_interpreter' needs the argument(s) code; nothing was run."
    # other non-object arguments are still an error of their own
    _, calls = parse_tool_calls('<tool_call>{"name": "clock", "arguments": "x"}</tool_call>', TOOLS)
    assert calls[0].error.startswith("Error: \"arguments\" of tool 'clock' must be a JSON object")


class _Counting:
    """Wraps a compiled regex or the JSON decoder of ``envs.markup`` and adds up the characters each call can read:
    a forward search from ``pos`` reads up to its match's end (or the text's end), a decode reads its window."""

    def __init__(self, inner, tally):
        self.inner, self.tally = inner, tally

    def search(self, text, pos=0):
        m = self.inner.search(text, pos)
        self.tally[0] += (m.end() if m else len(text)) - pos
        return m

    def match(self, text, pos=0):
        m = self.inner.match(text, pos)
        self.tally[0] += (m.end() if m else pos) - pos + 1
        return m

    def raw_decode(self, window):
        self.tally[0] += len(window)
        return self.inner.raw_decode(window)


def _chars_read(monkeypatch, text):
    """Characters the scan behind the parser, the call removal and the think spans reads for ``text`` (all three
    run on :func:`envs.markup.scan_markup`)."""
    import envs.markup as markup

    tally = [0]
    for name in ("_TAG_RE", "_BROKEN_END_RE", "_WS_RE", "_DECODER", "_LENIENT", "_CTRL_RE", "_LOOSE_START_RE",
                 "_LOOSE_END_RE"):
        monkeypatch.setattr(markup, name, _Counting(getattr(markup, name), tally))
    parse_tool_calls(text, TOOLS), remove_tool_calls(text), think_visible_spans(text)
    return tally[0]


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
    "raw newlines in strings": '<tool_call>{"a": "\n</tool_call>',
    "raw newlines in reasoning": '<think><tool_call>{"a": "\n"}</tool_call>',
    "single-quoted": "<tool_call>{'a': '</tool_call>",
    "bad escapes": '<tool_call>{"a": "\\q</tool_call>',
    "trailing commas": '<tool_call>{"a": 1,}',
}


@pytest.mark.parametrize("unit", list(FLOODS.values()), ids=list(FLOODS))
def test_scans_stay_linear_on_tag_floods(unit, monkeypatch):
    # work counted in characters read, not seconds: a quadratic scan (a search or decode restarting from a call's
    # start, or a decoder reading to the text's end per call) reads ~n^2/2 characters and fails both bounds
    from envs.markup import _FIRST_WINDOW

    small, big = 2_000, 16_000
    read_small, read_big = (_chars_read(monkeypatch, unit * k) for k in (small, big))
    # each search reads forward a few times over the text; each call's first decode reads at most a few windows
    text = unit * big
    assert read_big <= 8 * len(text) + 4 * _FIRST_WINDOW * text.count("<tool_call>"), (read_big, len(text))
    assert read_big <= 8.5 * read_small, (read_small, read_big)  # 8x the text: 8x the work (quadratic: 64x)


def test_hundred_thousand_tags_take_bounded_time():
    text = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(\'</tool_call>\')"}}</tool_call>'
    t0 = time.process_time()
    content, calls = parse_tool_calls(text * 100_000 + "<tool_call>" * 100_000, TOOLS)
    # ~1 s of CPU on an idle core; the bound only catches a quadratic scan (hours)
    assert time.process_time() - t0 < 30
    assert len(calls) == 100_001 and all(c.ok for c in calls[:-1]) and content == ""
    assert json.loads(json.dumps(calls[0].arguments)) == {"code": "print('</tool_call>')"}
