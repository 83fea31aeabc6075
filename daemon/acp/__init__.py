"""``goald acp``: an Agent Client Protocol agent on stdio for editors (Zed and others).

Built on the official ``agent-client-protocol`` SDK. Editor sessions map 1:1 onto goald sessions
of a daemon host embedded in the process; prompts own the interval to the next whole-agent idle
(invariant 8); ``/goal`` starts and manages goals whose rounds stream as updates.
"""

from daemon.acp.bridge import AcpBridge, goal_command, prompt_text
from daemon.acp.prompt import AdmittingTurn, PromptSlot, StopReason, stop_reason
from daemon.acp.serve import acp_settings, claim_stdio, run_acp
from daemon.acp.session import AcpSession
from daemon.acp.updates import Projector, goal_commands

__all__ = [
    "AcpBridge",
    "AcpSession",
    "AdmittingTurn",
    "Projector",
    "PromptSlot",
    "StopReason",
    "acp_settings",
    "claim_stdio",
    "goal_command",
    "goal_commands",
    "prompt_text",
    "run_acp",
    "stop_reason",
]
