"""The episode driver's ``generate`` over an OpenAI-compatible chat-completions server (:class:`ChatGenerate`):
one request per turn, the episode's token budget counted as training counts it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from envs.tool_use.history import assistant_message, with_reasoning
from stare_verl.jobs.evaluation.client import ChatResult, RequestFailed
from stare_verl.jobs.evaluation.episode import CONTEXT_FULL, NO_BUDGET, TurnRequest, TurnResult
from stare_verl.jobs.evaluation.settings import EvalSettings

__all__ = ["ChatGenerate"]

_CONTEXT_ERR = re.compile(r"context length|context window|maximum context|too long|max_model_len|exceeds", re.I)
_CTX_LEN = re.compile(r"maximum context length is (\d+)", re.I)
_CTX_PROMPT = re.compile(r"(\d+) (?:tokens )?in the messages", re.I)


def _fitted_max_tokens(message: str) -> int | None:
    """From vLLM's context-length rejection ("maximum context length is C tokens ... P in the messages, ..."),
    the largest max_tokens that fits (C - P); None when the message does not say."""
    c, p = _CTX_LEN.search(message), _CTX_PROMPT.search(message)
    return int(c.group(1)) - int(p.group(1)) if c and p else None


def _turn_text(res: ChatResult) -> str:
    """The assistant turn as the model wrote it: reasoning back inside think tags, structured tool calls back
    as hermes blocks (so ``parse_tool_calls`` applies the training loop's rules to them)."""
    text = with_reasoning(res.content, res.reasoning)
    for tc in res.tool_calls:
        fn = tc.get("function") or {}
        text += "\n<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}) + "\n</tool_call>"
    return text


class ChatGenerate:
    """The episode driver's ``generate`` (``episode.GenerateFn``) over an OpenAI-compatible chat-completions
    client: one ``chat`` request per turn with the chat so far.

    The request carries ``max_tokens`` (what is left of the episode budget), ``temperature``, ``top_p``, the
    sample's ``seed`` (the same on every turn) and, for tool-use rows, ``tools`` (and ``tool_choice`` unless
    "omit"). The answer becomes the turn's text (:func:`_turn_text`) and the next turn's history message
    (``envs.tool_use.history.assistant_message``, the training loop's): a turn's ``reasoning_content`` stays in
    the history, back inside ``<think>...</think>`` in front of the content, as training keeps the turn's own
    tokens; a server that parsed the calls gets them back in its own format (assistant ``tool_calls``, each
    observation with its ``tool_call_id``).

    The episode's token budget, as training counts it (``max_tokens``: model + tool/template tokens after the
    prompt; the local engine's rule, ``engine.EngineGenerate``): the tool observations and template tokens
    appended since the last turn are only known from the server's ``usage`` of the next request (its
    ``prompt_tokens`` minus the previous request's prompt and completion tokens). When they leave no budget, the
    turn is dropped and the episode ends without it (``episode.NO_BUDGET``, as training ends it); when the turn
    is longer than what they leave, it is asked again with that ``max_tokens`` (the same seed, so a server that
    samples deterministically per seed, as vLLM does, returns the same turn cut there). Without ``usage`` the
    observations are not counted.

    Errors: a 400 whose message gives the context numbers is asked again with the ``max_tokens`` that fits; a
    400 about ``tool_choice`` is re-raised with what to do; a context-window 400 on a later turn ends the
    episode as cut (``episode.CONTEXT_FULL``); anything else is raised (``RequestFailed``, ``ServerUnreachable``).

    Args:
        client: an open ``ChatClient`` (or any object with its ``chat(messages, **params)``).
        settings: the sampling settings.
    """

    def __init__(self, client: Any, settings: EvalSettings):
        self.client = client
        self.s = settings

    async def _chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> ChatResult:
        try:
            return await self.client.chat(messages, **params)
        except RequestFailed as err:
            msg = str(err)
            if "HTTP 400" not in msg:
                raise
            if "tool" in msg.lower() and "choice" in msg.lower():
                raise RequestFailed(
                    f"{msg}\nThe server refuses tool requests with its default tool_choice: pass --tool-choice none "
                    "(tools stay in the prompt, calls are parsed here), or start vLLM with --enable-auto-tool-choice "
                    "--tool-call-parser hermes."
                ) from err
            fit = _fitted_max_tokens(msg)
            max_tokens = params.get("max_tokens")
            if fit is not None and max_tokens is not None and 0 < fit < max_tokens:
                # vLLM/SGLang reject prompt + max_tokens beyond the context window instead of capping it (as
                # verl's rollout servers do): ask again for what fits
                return await self.client.chat(messages, **{**params, "max_tokens": fit})
            raise

    @staticmethod
    def _added_tokens(req: TurnRequest, res: ChatResult) -> int:
        """Tokens of the context appended since the episode's previous turn (observations, template), from
        ``usage``: this request's prompt tokens minus the previous request's prompt + completion tokens; 0 on
        the first turn or when the server reports no usage."""
        before = req.state.get("next_context")
        if before is None or res.prompt_tokens is None:
            return 0
        return max(0, int(res.prompt_tokens) - int(before))

    async def __call__(self, req: TurnRequest) -> TurnResult:
        """One turn through the server (see the class docstring)."""
        params: dict[str, Any] = {
            "max_tokens": req.max_tokens,
            "temperature": self.s.temperature,
            "top_p": self.s.top_p,
            "seed": req.seed,
        }
        if req.tools:
            params["tools"] = req.tools
            if self.s.tool_choice != "omit":
                params["tool_choice"] = self.s.tool_choice
        try:
            res = await self._chat(req.messages, params)
            added = self._added_tokens(req, res)
            if added and req.max_tokens is not None:
                left = req.max_tokens - added
                if left <= 0:  # the observations fill the budget: training ends the episode without this turn
                    return TurnResult(generated=False, finish_reason=NO_BUDGET)
                if res.completion_tokens is not None and res.completion_tokens > left:  # cut where training cuts
                    res = await self._chat(req.messages, {**params, "max_tokens": left})
        except RequestFailed as err:
            if req.turn == 0 or "HTTP 400" not in str(err) or not _CONTEXT_ERR.search(str(err)):
                raise  # the first turn must fit: a setting (--max-tokens) or the data is wrong
            return TurnResult(generated=False, finish_reason=CONTEXT_FULL, error=str(err)[:300])
        if res.prompt_tokens is not None and res.completion_tokens is not None:
            req.state["next_context"] = res.prompt_tokens + res.completion_tokens
        # the training loop's history message: the reasoning the server split off goes back in front of the
        # content; calls the server parsed go back in its format (ids included), others stay in the text
        message = assistant_message(res.content, res.tool_calls or None, reasoning=res.reasoning)
        return TurnResult(
            text=_turn_text(res),
            finish_reason=res.finish_reason,
            prompt_tokens=res.prompt_tokens,
            completion_tokens=res.completion_tokens,
            message=message,
            tool_call_ids=[tc.get("id") for tc in res.tool_calls],
        )
