"""Fault injection: failing file layers (more arrive with the agent loop)."""

from harness.faults._files import FailingFiles

__all__ = ["FailingFiles"]
