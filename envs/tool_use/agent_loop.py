"""The tool-use agent loop: verl's ``ToolAgentLoop`` made exact and strict, registered as ``stare_tool_agent``.

Select it per dataset row (``agent_name: stare_tool_agent``, as ``envs.tool_use.task`` writes) or for the
whole run (``actor_rollout_ref.rollout.agent.default_agent_loop=stare_tool_agent``), with
``multi_turn.tool_config_path`` naming the tools. The registration runs on ``import envs.tool_use.agent_loop``,
which ``stare_verl.plugin`` does in every process that imports verl.

What it changes relative to verl 0.9.1's ``ToolAgentLoop`` (whose prompt building, tool list, tool
selection and output assembly it reuses):

- Tool calls are parsed from the turn's own token ids (hermes ``<tool_call>{json}</tool_call>``) and
  calls written inside ``<think>...</think>`` are ignored (``envs.tool_use.parser.parse_tool_calls``; a call
  ends where its JSON ends, so markup inside the call's strings ends nothing). Calls are answered, counted and
  the episode ended by the runner shared with the evaluations (``envs.tool_use.episode``).
- Observations are cut to ``max_tool_response_length`` characters, marker included, errors and warnings too, and
  no text (tool output, the model's own text in the history, tool-call arguments included) can become one of
  the tokenizer's control tokens (``envs.tools.observation``, applied by that runner).
- A malformed call (bad JSON, no name, unknown tool, arguments not an object, a missing or mistyped
  required argument, an unclosed ``<tool_call>``, more calls than ``max_parallel_calls``) is answered by
  an error observation the model can read, and counted (``num_malformed_calls``), instead of being
  dropped silently. Nothing is executed for it.
- A turn cut off by the length limit is never executed: the loop asks the server for at most the
  remaining response budget (``max_tokens``) and treats a turn that filled it without a stop token (or
  any turn a server reports as ``length``/``aborted``) as cut.
- Token-in, token-out: the model's ids are appended unchanged (verl's Continuous Token merge), so the
  prompt of turn k+1 is the prompt of turn k + the ids generated in turn k + the observation's ids
  (including the newline a Qwen template puts after ``<|im_end|>``, with response_mask 0).
- Stops on a final answer (a turn without any tool call), at ``max_assistant_turns`` /
  ``max_user_turns``, or at the length limit; ``extra_fields["termination"]`` says which.
- Tool calls run with a loop-side deadline (``tool_timeout_s``) on top of the tool's own limits; at the
  end of the trajectory every tool with ``release_trajectory(request_id)`` (``code_interpreter``'s
  persistent sessions keyed by trajectory) is called, so sessions do not outlive their rollout.
- The reward gets only model-generated text: ``extra_fields["model_response_text"]`` is decoded from the
  response_mask == 1 tokens with tool-call blocks removed. verl's naive/limited/remote reward managers
  merge an agent loop's ``extra_fields`` into ``extra_info``; ``envs.tool_use.task.compute_score`` scores
  that text instead of verl's ``solution_str`` (which decodes the whole response, tool output included).

The per-episode fields it returns and its options: :class:`StareToolAgentLoop`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import (
    SPEC_DECODE_EXTRA_KEYS,
    AgentData,
    AgentState,
    ToolAgentLoop,
)
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.utils.profiler import simple_timer
from verl.utils.ray_utils import get_event_loop

from envs.contract import AGENT_NAME, MODEL_TEXT_KEY
from envs.tool_use.episode import EpisodeStats, ToolCallRunner, end_token_ids, turn_termination
from envs.tool_use.history import assistant_message, tool_call_dicts
from envs.tool_use.parser import (
    ParsedCall,
    model_response_text,
    parse_tool_calls,
    remove_tool_calls,
    strip_thinking,
)
from envs.tool_use.tool_prompt import with_tool_prompt
from envs.tools.observation import tokenizer_control_tokens

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

__all__ = [
    "AGENT_NAME",
    "MODEL_TEXT_KEY",
    "EpisodeStats",
    "HermesThinkToolParser",
    "ParsedCall",
    "StareToolAgentLoop",
    "chatml_builder",
    "model_response_text",
    "parse_tool_calls",
    "remove_tool_calls",
    "renders_chatml_newline",
    "strip_thinking",
]


@ToolParser.register("hermes_think")
class HermesThinkToolParser(ToolParser):
    """verl ``ToolParser`` (``multi_turn.format: hermes_think``) with ``parse_tool_calls``'s rules, for
    verl's own ``tool_agent`` loop: well-formed calls outside ``<think>`` only (malformed ones are dropped,
    as that loop has no way to answer them; ``stare_tool_agent`` answers them)."""

    async def extract_tool_calls(
        self, responses_ids: list[int], tools: list[OpenAIFunctionToolSchema] = None
    ) -> tuple[str, list[FunctionCall]]:
        loop = get_event_loop()
        text = await loop.run_in_executor(None, self.tokenizer.decode, responses_ids)
        schemas = {t.function.name: t for t in tools or []}
        content, calls = parse_tool_calls(text, schemas)
        return content, [c.function_call() for c in calls if c.ok]


def renders_chatml_newline(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether ``tokenizer``'s chat template ends a finished turn with ``<|im_end|>`` + newline (ChatML: Qwen's,
    SmolLM2's), which a model's own turn stops before. False when it has no ``<|im_end|>`` or cannot render."""
    if "<|im_end|>" not in (tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}):
        return False
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    try:
        text = tokenizer.apply_chat_template(msgs, tokenize=False, **(chat_template_kwargs or {}))
    except Exception:  # noqa: BLE001 - no template: not ChatML
        return False
    return isinstance(text, str) and "b<|im_end|>\n" in text


def chatml_builder(builder: Any, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> Any:
    """verl's Continuous Token builder for ``tokenizer``: ``builder`` itself, except that verl's generic builder
    (chosen for a ``model_type`` verl does not know, e.g. SmolLM2's ``llama``) is replaced by verl's ChatML one
    (``QwenContinuousTokenBuilder``: the newline the template puts after a turn's ``<|im_end|>`` is inserted,
    mask 0, before the observation) when the template is ChatML (:func:`renders_chatml_newline`). Without it the
    context would read ``<|im_end|><|im_start|>tool``, which the template never renders, while the held-out
    evaluation and the SFT (made with the ChatML builder) put the newline there."""
    from verl.utils.tokenizer.continuous_token import ContinuousTokenBuilder, QwenContinuousTokenBuilder

    if type(builder) is not ContinuousTokenBuilder or not renders_chatml_newline(tokenizer, chat_template_kwargs):
        return builder
    return QwenContinuousTokenBuilder(tokenizer, chat_template_kwargs=chat_template_kwargs)


# ---------------------------------------------------------------------------------------------- loop

@register(AGENT_NAME)
class StareToolAgentLoop(ToolAgentLoop):
    """Multi-turn hermes tool use with exact tokens, answered malformed calls and reward text from model
    tokens only (module docstring). One instance runs one trajectory (verl instantiates it per sample).

    Per-episode fields in ``AgentLoopOutput.extra_fields`` (also seen by the reward as ``extra_info``):
    ``model_response_text`` (str), ``response_length`` (int, model tokens), ``hit_eos`` (bool, the last turn
    was not cut), ``termination`` ("answer" | "length" | "max_assistant_turns" | "max_user_turns" |
    "aborted"), ``num_assistant_turns``, ``num_tool_calls`` (call attempts, malformed included),
    ``num_tool_executed``, ``num_malformed_calls``, ``num_tool_exceptions``, ``num_tool_timeouts``,
    ``num_tool_errors`` (malformed + exceptions + timeouts), ``tool_time_s`` (float, seconds spent in tool
    calls), ``tool_call_log`` (list of {"name", "code"/"arguments", "error", "seconds"}).

    Loop options are hydra kwargs; give them through verl's ``rollout.agent.agent_loop_config_path`` YAML, e.g.
    ``- {name: stare_tool_agent, _target_: envs.tool_use.agent_loop.StareToolAgentLoop, tool_timeout_s: 30}``.

    Args:
        tool_timeout_s: loop-side deadline of one tool call (create + execute + release), seconds; a call
            past it is cancelled and answered "timed out". The tool's own limits apply first.
        *args, **kwargs: verl's ``ToolAgentLoop`` arguments.

    Raises:
        ValueError: ``tool_timeout_s`` not positive.
    """

    def __init__(self, *args, tool_timeout_s: float = 60.0, **kwargs):
        super().__init__(*args, **kwargs)
        if not tool_timeout_s or float(tool_timeout_s) <= 0:
            raise ValueError(f"tool_timeout_s must be > 0, got {tool_timeout_s!r}")
        self.tool_timeout_s = float(tool_timeout_s)
        self._stop_ids = end_token_ids(self.tokenizer) | set(self.tool_parser.stop_token_ids)
        self._control_tokens = tokenizer_control_tokens(self.tokenizer)
        self._agent_data: AgentData | None = None
        self.continuous_token_builder = chatml_builder(self.continuous_token_builder, self.tokenizer,
                                                       self.apply_chat_template_kwargs)

    # -- trajectory ---------------------------------------------------------------------------------

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """Run one trajectory (verl's ``AgentLoopBase.run`` contract) and add the fields listed in the
        class docstring to ``extra_fields``."""
        try:
            output = await super().run(sampling_params, **kwargs)
        finally:
            await self._release_trajectory()
        st: EpisodeStats = self._agent_data.stare_stats
        st.num_assistant_turns = int(self._agent_data.assistant_turns)
        mask = list(output.response_mask)
        output.extra_fields.update(
            {
                MODEL_TEXT_KEY: model_response_text(output.response_ids, mask, self.tokenizer),
                "response_length": int(sum(mask)),
                **st.counters(),
            }
        )
        return output

    def _runner(self, agent_data: AgentData | None = None) -> ToolCallRunner:
        """The shared tool-call runner (``envs.tool_use.episode``) over this sample's active tools."""
        tools = getattr(agent_data, "_active_tools", self.tools) if agent_data is not None else self.tools
        return ToolCallRunner(
            tools,
            max_parallel_calls=self.max_parallel_calls,
            tool_timeout_s=self.tool_timeout_s,
            max_tool_response_chars=self.max_tool_response_length,
            truncate_side=self.tool_response_truncate_side,
            control_tokens=self._control_tokens,
        )

    async def _release_trajectory(self) -> None:
        """Close per-trajectory tool state (tools with ``release_trajectory(request_id)``, e.g. a persistent
        ``code_interpreter`` session keyed by trajectory); errors are logged, never raised."""
        if self._agent_data is None:
            return
        await self._runner().release_trajectory(self._agent_data.request_id)

    async def _handle_pending_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any]
    ) -> AgentState:
        agent_data.stare_stats = EpisodeStats()
        self._agent_data = agent_data
        # a template that ignores tools= (plain ChatML) gets the tool list in its system message
        schemas = getattr(agent_data, "_active_tool_schemas", self.tool_schemas)
        agent_data.messages = with_tool_prompt(agent_data.messages, schemas, self.tokenizer)
        return await super()._handle_pending_state(agent_data, sampling_params)

    @staticmethod
    def _turn_cut(turn_ids: list[int], max_tokens: int, stop_reason: str | None, stop_ids: set[int]) -> bool:
        """Whether a turn was cut by the length limit (or aborted) rather than ended by the model: the
        server says so, or the turn filled its ``max_tokens`` without ending on a stop token."""
        if stop_reason in ("length", "max_tokens", "aborted", "abort"):
            return True
        return len(turn_ids) >= max_tokens and (not turn_ids or int(turn_ids[-1]) not in stop_ids)

    def _terminate(self, agent_data: AgentData, reason: str) -> AgentState:
        agent_data.stare_stats.termination = reason
        return AgentState.TERMINATED

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        """Generate one assistant turn within the remaining response budget and decide what comes next."""
        st: EpisodeStats = agent_data.stare_stats
        budget = self.response_length - len(agent_data.response_mask)
        if budget <= 0:
            return self._terminate(agent_data, "length")
        params = {k: v for k, v in sampling_params.items() if k not in ("max_tokens", "max_new_tokens")}
        params["max_tokens"] = min(budget, int(sampling_params.get("max_tokens") or budget))
        if self.tool_parser.stop_token_ids:
            extra = set(self.tool_parser.stop_token_ids)
            params["stop_token_ids"] = sorted(set(params.get("stop_token_ids") or []) | extra)
        stop_ids = self._stop_ids | set(params.get("stop_token_ids") or [])

        n_prompt = len(agent_data.prompt_ids)
        with simple_timer("generate_sequences", agent_data.metrics):
            output = await self.server_manager.generate(
                request_id=agent_data.request_id,
                prompt_ids=agent_data.prompt_ids,
                sampling_params=params,
                image_data=agent_data.image_data,
                video_data=agent_data.video_data,
                mm_processor_output=agent_data.mm_processor_output,
                audio_data=agent_data.audio_data,
                mm_processor_kwargs=agent_data.mm_processor_kwargs,
            )
        preempted = output.num_preempted if output.num_preempted is not None else -1
        if agent_data.metrics.get("num_preempted") is None:
            agent_data.metrics["num_preempted"] = preempted
        elif preempted > 0:
            agent_data.metrics["num_preempted"] += preempted
        if not agent_data.extra_fields:
            agent_data.extra_fields.update(output.extra_fields)
        else:  # later turns: newest weights version, summed speculative-decoding counters (as verl does)
            if output.extra_fields.get("max_global_steps") is not None:
                agent_data.extra_fields["max_global_steps"] = output.extra_fields["max_global_steps"]
            for key in SPEC_DECODE_EXTRA_KEYS:
                if key in output.extra_fields and key in agent_data.extra_fields:
                    agent_data.extra_fields[key] = int(agent_data.extra_fields[key]) + int(
                        output.extra_fields[key]
                    )

        turn_ids = [int(t) for t in output.token_ids]
        agent_data.assistant_turns += 1
        agent_data.response_ids = turn_ids
        merge, mask, logprobs = await self.ct_merge_assistant_token(
            agent_data.prompt_ids,
            turn_ids,
            agent_data.response_mask,
            agent_data.response_logprobs if (agent_data.response_logprobs or output.log_probs) else None,
            assistant_logprobs=output.log_probs if output.log_probs else None,
        )
        agent_data.prompt_ids = merge.token_ids
        agent_data.response_mask = mask
        if logprobs is not None:
            agent_data.response_logprobs = logprobs
        if output.routed_experts is not None:
            agent_data.routed_experts = output.routed_experts

        # the server may also stop at its context window (vLLM: max_model_len - prompt; SGLang: one less)
        limit = params["max_tokens"]
        max_model_len = self.rollout_config.get("max_model_len")
        if max_model_len:
            limit = min(limit, max(1, int(max_model_len) - n_prompt - 1))
        if self._turn_cut(turn_ids, limit, output.stop_reason, stop_ids):
            st.hit_eos = False
            return self._terminate(
                agent_data, "aborted" if output.stop_reason in ("aborted", "abort") else "length"
            )

        active = getattr(agent_data, "_active_tools", self.tools)
        text = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(turn_ids, skip_special_tokens=False)
        )
        _, calls = parse_tool_calls(text, {name: tool.tool_schema for name, tool in active.items()})
        # the history message of every path (reasoning kept, as the ids above keep it; the context keeps the
        # model's own ids), its control-token strings broken (the runner's rule)
        agent_data.messages.append(self._runner(agent_data).history_message(assistant_message(text, tool_call_dicts(calls))))
        reason = turn_termination(
            st,
            calls=calls,
            assistant_turns=agent_data.assistant_turns,
            user_turns=agent_data.user_turns,
            max_assistant_turns=self.max_assistant_turns,
            max_user_turns=self.max_user_turns,
            budget_spent=len(agent_data.response_mask) >= self.response_length,
        )
        if reason is not None:
            return self._terminate(agent_data, reason)
        st.pending = calls
        return AgentState.PROCESSING_TOOLS

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        """Answer every call of the turn (run the well-formed ones, explain the malformed ones), append the
        observations with response_mask 0, and go back to generating (or stop at the length limit)."""
        st: EpisodeStats = agent_data.stare_stats
        calls, st.pending = st.pending, []
        previous_messages = list(agent_data.messages)
        with simple_timer("tool_calls", agent_data.metrics):
            texts = await self._runner(agent_data).answer_turn(calls, st, agent_data)
        agent_data.messages.extend({"role": "tool", "content": t} for t in texts)

        schemas = getattr(agent_data, "_active_tool_schemas", self.tool_schemas)
        merge, mask, logprobs = await self.ct_merge_context_msg(
            previous_messages,
            agent_data.messages,
            agent_data.prompt_ids,
            agent_data.response_mask,
            agent_data.response_logprobs if agent_data.response_logprobs else None,
            tools=schemas,
        )
        if len(mask) >= self.response_length:
            return self._terminate(agent_data, "length")
        agent_data.prompt_ids = merge.token_ids
        agent_data.response_mask = mask
        if agent_data.response_logprobs:
            agent_data.response_logprobs = logprobs or []
        agent_data.user_turns += 1
        return AgentState.GENERATING
