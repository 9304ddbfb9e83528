"""verl plugin of the environments (entry point ``stare_verl_envs`` in group ``verl.plugins``).

Loaded by ``import verl`` in every process: registers the tool-use agent loop ``stare_tool_agent``
(``envs.tool_use.agent_loop``). verl swallows plugin import errors at debug level, so a failure is also
logged here at error level; it does not block the ``stare_verl`` plugin (estimator, trainer modes).
"""

import logging

_logger = logging.getLogger("envs")

try:
    import envs.tool_use.agent_loop  # noqa: F401  (registers the agent loop "stare_tool_agent")
except Exception:  # pragma: no cover - surfaced by tests/envs/tool_use/test_agent_loop.py
    _logger.exception("envs: registering the stare_tool_agent agent loop (envs.tool_use.agent_loop) failed")
