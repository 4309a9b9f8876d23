"""Context compaction: the pure, synchronous core (reference compaction §0-§5).

The token meter and ``measure``, tool-pairing balance with its per-session cache,
head-anchored range selection, ``BasicCompactionConfig`` resolution and pressure specs,
phase one (tool-result pruning, §4), phase two's parts (§5: the summarizer's input, the
checkpoint frame and shrink check, target resolution and the default summarizer, the
one async function here) and the transaction's synchronous steps. The session actor
runs the transaction (``SessionHandle.compact_region``); the policies that decide when
it runs live in ``harness.agent`` (``AgentCompaction``). See docs/compaction.md.
"""

from harness.compaction._config import (
    BasicCompactionConfig,
    CompactionPolicy,
    ModelPolicy,
    PressureSpec,
)
from harness.compaction._config_load import load_basic_compaction_config
from harness.compaction._framing import (
    COMPACTION_INSTRUCTION,
    PREAMBLE,
    SummarizationInput,
    check_shrink,
    frame_checkpoint,
    is_compact_checkpoint_source,
    summarization_input,
)
from harness.compaction._measure import LATEST_HEADER, Measurement, NodeTokens, measure
from harness.compaction._meter import (
    estimate_blocks,
    estimate_header,
    estimate_message,
    estimate_system,
    estimate_tools,
    utf16_len,
)
from harness.compaction._pairing import tool_pairing_balanced_after, tool_pairing_balanced_before
from harness.compaction._prune import (
    MARKER,
    PrunedResult,
    PruneResult,
    ToolResultPruneConfig,
    load_tool_result_prune_config,
    prune_content,
    prune_session,
)
from harness.compaction._select import CompactableRange, select_compactable_range
from harness.compaction._summarize import (
    SummaryOutput,
    SummaryTarget,
    resolve_summary_target,
    summarize,
)
from harness.compaction._transaction import CompactionResult, LockState, error_chain, lock_state

__all__ = [
    "COMPACTION_INSTRUCTION",
    "LATEST_HEADER",
    "MARKER",
    "PREAMBLE",
    "BasicCompactionConfig",
    "CompactableRange",
    "CompactionPolicy",
    "CompactionResult",
    "LockState",
    "Measurement",
    "ModelPolicy",
    "NodeTokens",
    "PressureSpec",
    "PruneResult",
    "PrunedResult",
    "SummarizationInput",
    "SummaryOutput",
    "SummaryTarget",
    "ToolResultPruneConfig",
    "check_shrink",
    "estimate_blocks",
    "estimate_header",
    "estimate_message",
    "estimate_system",
    "error_chain",
    "estimate_tools",
    "frame_checkpoint",
    "is_compact_checkpoint_source",
    "load_basic_compaction_config",
    "load_tool_result_prune_config",
    "lock_state",
    "measure",
    "prune_content",
    "prune_session",
    "resolve_summary_target",
    "select_compactable_range",
    "summarization_input",
    "summarize",
    "tool_pairing_balanced_after",
    "tool_pairing_balanced_before",
    "utf16_len",
]
