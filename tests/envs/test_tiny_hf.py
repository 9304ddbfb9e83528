"""The one tiny tokenizer/model builder (envs.tiny_hf): digits one per token, special/tool tokens whole, a chat
template verl can use, seeded models; every builder of the project gives the same template."""

import pytest

from envs.tiny_hf import ADDED_TOKENS, SPECIAL_TOKENS, build_tokenizer, load_tokenizer
from stare_verl.jobs.demo.sft import render_demo
from tests.support.demos import CODE_INTERPRETER_SCHEMA, build_demos, sample_problems

TOOLS = [CODE_INTERPRETER_SCHEMA]


@pytest.fixture(scope="module")
def demos():
    ds, rejected = build_demos(sample_problems(30, seed=5))
    assert len(ds) == 30 and not rejected
    return ds


@pytest.fixture(scope="module")
def tok(demos, tmp_path_factory):
    return build_tokenizer([render_demo(d) for d in demos], tmp_path_factory.mktemp("tok"), vocab_size=384)


def test_vocab_size_and_ids(tok):
    assert len(tok) == 384
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id != tok.pad_token_id


def test_digits_are_one_token_each_and_round_trip(tok):
    ids = tok.encode("9876543210", add_special_tokens=False)
    assert [tok.decode([i]) for i in ids] == list("9876543210")
    for text in ["-68244 + 1617 * 3", "\\boxed{-128}", "print(( -4 - -29 * 77 ))", "x = 10**12\nprint(x)"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        digit_tokens = [tok.decode([i]) for i in ids if any(c.isdigit() for c in tok.decode([i]))]
        assert all(len(t) == 1 for t in digit_tokens), digit_tokens


def test_special_and_tool_tokens_are_single_ids(tok):
    for t in SPECIAL_TOKENS + ADDED_TOKENS:
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1, t
        assert tok.decode(ids) == t
    text = '<|im_start|>assistant\n<tool_call>{"name": "code_interpreter"}</tool_call><|im_end|>'
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    # tool tags are not "special": skip_special_tokens keeps them (as Qwen2.5's tokenizer does)
    assert tok.decode(ids, skip_special_tokens=True) == 'assistant\n<tool_call>{"name": "code_interpreter"}</tool_call>'


def test_saved_tokenizer_loads_identically(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    text = "Calculate 12 * 34.<|im_end|>"
    assert again.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert again.chat_template == tok.chat_template


def test_chat_template_renders_tools_tool_call_and_tool_turn(tok):
    msgs = [
        {"role": "user", "content": "What is 6 * 7?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "code_interpreter",
                                                           "arguments": {"code": "print(6 * 7)"}}}]},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "\\boxed{42}"},
    ]
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    assert text == (
        "<|im_start|>system\n# Tools\n<tools>\ncode_interpreter\n</tools><|im_end|>\n"
        "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n\\boxed{42}<|im_end|>\n"
    )
    # no tools: no tool block; a system message stays; generation prompt appended
    plain = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
                                    tokenize=False, add_generation_prompt=True)
    assert plain == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"


def test_verl_continuous_token_builder_appends_tool_observation(tok):
    """verl's agent loop gets observation ids by rendering tool messages with this template."""
    from verl.utils.tokenizer.continuous_token import QwenContinuousTokenBuilder
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(tok, hf_model_type="qwen2")
    assert isinstance(builder, QwenContinuousTokenBuilder)
    prompt = [{"role": "user", "content": "What is 6 * 7?"}]
    ids = list(builder.build_initial_tokens(prompt, tools=TOOLS))
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    call = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    ids += tok.encode(call, add_special_tokens=False) + [tok.eos_token_id]
    assistant = {"role": "assistant", "content": ""}
    tool = {"role": "tool", "content": "42"}
    merged = builder.merge_context_tokens(prompt + [assistant], prompt + [assistant, tool], ids, tools=TOOLS)
    appended = merged.token_ids[len(ids):]
    assert tok.decode(appended) == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n" \
        "<|im_start|>assistant\n"
    assert merged.token_ids[: len(ids)] == ids  # the model's ids are never re-tokenised


def test_too_small_vocab_and_empty_corpus_raise():
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(["abc"], vocab_size=200)
    with pytest.raises(ValueError, match="empty"):
        build_tokenizer(["<|im_end|>"])


def test_every_builder_gives_the_one_chat_template(tok, tmp_path):
    from envs.simulators import build_tiny_model_dir, build_tiny_tokenizer
    from envs.tiny_hf import CHAT_TEMPLATE
    from tests.support.tiny import build_tiny_model

    smoke = load_tokenizer(build_tiny_model(tmp_path / "smoke"))
    sim = build_tiny_tokenizer()
    sim_dir = load_tokenizer(build_tiny_model_dir(tmp_path / "sim"))
    for t in (tok, smoke, sim, sim_dir):
        assert t.chat_template == CHAT_TEMPLATE
        assert (t.eos_token, t.pad_token, t.padding_side) == ("<|im_end|>", "<|endoftext|>", "left")
        assert [len(t.encode(x, add_special_tokens=False)) for x in SPECIAL_TOKENS + ADDED_TOKENS] == [1] * 9
    assert (len(smoke), len(sim)) == (300, 400)


def test_tiny_model_shapes_and_errors(tok):
    from envs.tiny_hf import TinyModelConfig, build_model, tiny_qwen2_config

    cfg = tiny_qwen2_config(tok)
    assert (cfg.vocab_size, cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id) == (
        384, tok.eos_token_id, tok.pad_token_id, None)
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.tie_word_embeddings) == ("qwen2", 128, 4, True)
    bare = build_model(config=TinyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1),
                       vocab_size=48, seed=3)
    assert bare.get_input_embeddings().weight.shape == (48, 16) and bare.config.eos_token_id is None
    again = build_model(config=TinyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1),
                        vocab_size=48, seed=3)
    assert all((a == b).all() for a, b in zip(bare.parameters(), again.parameters(), strict=True))
    with pytest.raises(ValueError, match="exactly one"):
        tiny_qwen2_config()
    with pytest.raises(ValueError, match="exactly one"):
        tiny_qwen2_config(tok, vocab_size=10)
    with pytest.raises(ValueError, match="must divide hidden_size"):
        tiny_qwen2_config(tok, TinyModelConfig(hidden_size=130))
    with pytest.raises(ValueError, match="must divide num_attention_heads"):
        tiny_qwen2_config(tok, TinyModelConfig(num_key_value_heads=3))


@pytest.mark.parametrize("n", [2, 3])
def test_digit_groups_cut_numbers_left_to_right_and_survive_the_qwen2_loader(demos, tmp_path, n):
    """digits_per_token 2 / 3: a number is cut left to right into groups of n digits, each one token, and a model
    folder (config.json with model_type qwen2, which AutoTokenizer loads as Qwen2Tokenizer, replacing the saved
    pre-tokenizer) tokenises every demonstration exactly as the SFT's own tokenizer did."""
    from transformers import AutoTokenizer

    from envs.tiny_hf import build_model, digit_groups, save_model

    groups = digit_groups(n)
    assert len(groups) == sum(10**k for k in range(2, n + 1)) and groups[:2] == ("00", "01")
    texts = [render_demo(d) for d in demos]
    tok = build_tokenizer(texts, tmp_path / "tok", vocab_size=384 + len(groups), digits_per_token=n)
    assert len(tok) == 384 + len(groups)
    cut = {2: ["18", "86", "04", " ", "-", "68", "19", " ", "15", "6", " ", "7"],
           3: ["188", "604", " ", "-", "681", "9", " ", "156", " ", "7"]}[n]
    ids = tok.encode("188604 -6819 156 7", add_special_tokens=False)
    assert [tok.decode([i]).strip() for i in ids if tok.decode([i]).strip()] == [c for c in cut if c.strip()]
    save_model(build_model(tok), tok, tmp_path / "model")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "model"))
    assert type(loaded).__name__ == "Qwen2Tokenizer"  # what verl, the hf rollout and vLLM load
    for text in texts + ["\\boxed{-2169}", "print(8402 - 9320 + 4111)"]:
        assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
        assert loaded.decode(loaded.encode(text, add_special_tokens=False)) == text


def test_digit_groups_need_room_in_the_vocabulary(demos):
    texts = [render_demo(d) for d in demos]
    with pytest.raises(ValueError, match="digit groups"):
        build_tokenizer(texts, vocab_size=300, digits_per_token=2)  # 265 + 100 needed
    for bad in (0, 4):
        with pytest.raises(ValueError, match="digits_per_token"):
            build_tokenizer(texts, vocab_size=2000, digits_per_token=bad)
