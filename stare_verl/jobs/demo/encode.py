"""One demonstration as the model sees it: chat-template text (the tiny tokenizer's corpus) and verl's agent-loop
token layout with its loss mask (the SFT's input and the held-out entropy probe's episodes)."""

from __future__ import annotations

from stare_verl.jobs.families.tooluse import Demo

__all__ = ["encode_demo", "render_demo"]


def render_demo(demo: Demo) -> str:
    """The whole demonstration (a tool-use ``Demo`` or a ``CotDemo``) as chat-template text (the tokenizer's
    training corpus)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from envs.tiny_hf import CHAT_TEMPLATE

    rendered = render_jinja_template([demo.messages()], tools=demo.tools, chat_template=CHAT_TEMPLATE)
    return rendered[0][0] if isinstance(rendered, tuple) else rendered[0]


def encode_demo(demo: Demo, tokenizer, builder=None) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one demonstration, built the way verl's agent loop builds an episode.

    Args:
        demo: the demonstration (a tool-use ``Demo`` or a ``CotDemo``).
        tokenizer: the run's tokenizer.
        builder: a verl Continuous Token builder for it (made with ``hf_model_type="qwen2"`` if None).
    Returns:
        ``(input_ids, loss_mask)``, equal lengths; ``loss_mask[i]`` is 1 exactly for tokens the model
        generates (the assistant turns, each with its ``<|im_end|>``: two for tool use, one for CoT), 0 for
        prompt, tool and template tokens.
    """
    if builder is None:
        from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

        builder = create_continuous_token_builder(tokenizer, hf_model_type="qwen2")
    eos = int(tokenizer.eos_token_id)
    tools = demo.tools
    if tools is None:  # single turn (verl's single_turn_agent): prompt, then the answer and <|im_end|>
        ids = list(builder.build_initial_tokens(demo.prompt(), tools=None))
        turn = tokenizer.encode(demo.assistant_texts()[0], add_special_tokens=False) + [eos]
        return ids + turn, [0] * len(ids) + [1] * len(turn)
    from envs.tool_use.tool_prompt import with_tool_prompt

    msgs = demo.messages()
    # a template that ignores tools= gets the tool list in its system message, as the agent loop gives it
    prompt, call_msg, tool_msg = with_tool_prompt(msgs[:1], tools, tokenizer), msgs[1], msgs[2]
    ids = list(builder.build_initial_tokens(prompt, tools=tools))
    mask = [0] * len(ids)
    call_text, answer_text = demo.assistant_texts()
    turn = tokenizer.encode(call_text, add_special_tokens=False) + [eos]
    ids += turn
    mask += [1] * len(turn)
    merged = builder.merge_context_tokens(prompt + [call_msg], prompt + [call_msg, tool_msg], ids, tools=tools)
    mask += [0] * (len(merged.token_ids) - len(ids))
    ids = list(merged.token_ids)
    turn = tokenizer.encode(answer_text, add_special_tokens=False) + [eos]
    ids += turn
    mask += [1] * len(turn)
    return ids, mask
