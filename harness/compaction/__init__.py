"""Context compaction: the pure, synchronous core (reference compaction §0, §2).

Built so far: the token meter and ``measure``, tool-pairing balance with its
per-session cache, head-anchored range selection, ``BasicCompactionConfig``
resolution, phase one (tool-result pruning, §4), and phase two's parts (§5): the
summarizer's input, the checkpoint frame and shrink check, target resolution and
the default summarizer (the one async function here). The transaction and the
pressure/overflow/manual entry points are not built yet (see docs/compaction.md).
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

__all__ = [
    "COMPACTION_INSTRUCTION",
    "LATEST_HEADER",
    "MARKER",
    "PREAMBLE",
    "BasicCompactionConfig",
    "CompactableRange",
    "CompactionPolicy",
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
    "estimate_tools",
    "frame_checkpoint",
    "is_compact_checkpoint_source",
    "load_basic_compaction_config",
    "load_tool_result_prune_config",
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
