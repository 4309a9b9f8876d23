"""Context compaction: the pure, synchronous core (reference compaction §0, §2).

Built so far: the token meter and ``measure``, tool-pairing balance with its
per-session cache, head-anchored range selection, and ``BasicCompactionConfig``
resolution. The transaction, pruning, the summarizer and the pressure/overflow
policies are not built yet (see docs/compaction.md).
"""

from harness.compaction._config import (
    BasicCompactionConfig,
    CompactionPolicy,
    ModelPolicy,
    PressureSpec,
)
from harness.compaction._config_load import load_basic_compaction_config
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
from harness.compaction._select import CompactableRange, select_compactable_range

__all__ = [
    "LATEST_HEADER",
    "BasicCompactionConfig",
    "CompactableRange",
    "CompactionPolicy",
    "Measurement",
    "ModelPolicy",
    "NodeTokens",
    "PressureSpec",
    "estimate_blocks",
    "estimate_header",
    "estimate_message",
    "estimate_system",
    "estimate_tools",
    "load_basic_compaction_config",
    "measure",
    "select_compactable_range",
    "tool_pairing_balanced_after",
    "tool_pairing_balanced_before",
    "utf16_len",
]
