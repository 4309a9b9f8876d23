"""Fault injection: failing file layers (more arrive with the agent loop)."""

from harness.faults._files import FailingFiles
from harness.faults._points import FaultPoints

__all__ = ["FailingFiles", "FaultPoints"]
