"""The grill's agent suite: multi-step tasks in a throwaway workspace through native OpenAI tool calling."""

from swaplab.grill.agent.run import (
    AgentSelfCheck,
    replay_reference,
    run_agent,
    selfcheck_agent,
)
from swaplab.grill.agent.tasks import AgentTask, agent_tasks
from swaplab.grill.agent.tools import ToolCall

__all__ = ["AgentSelfCheck", "AgentTask", "ToolCall", "agent_tasks", "replay_reference", "run_agent", "selfcheck_agent"]
