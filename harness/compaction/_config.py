"""Resolved ``BasicCompactionConfig`` values and scaling to a context window (§2.3).

These are plain frozen values: building one from a user's record, with every rule
and message of the reference, is :func:`harness.compaction.load_basic_compaction_config`.
"""

from __future__ import annotations

import math

import attrs

from harness.errors import TargetPressureConfigError

PREFIX = "BasicCompactionConfig: "


def js_str(value: object) -> str:
    """``String(value)`` as JavaScript renders a number (or a few other values)."""
    if value is None:
        return "undefined"
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is float:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        if value.is_integer() and abs(value) < 1e21:
            return str(int(value))  # JS prints 2.0 as "2"
        return repr(value)
    return str(value)


@attrs.frozen(slots=True)
class PressureSpec:
    """A policy scaled to one context window: compact at ``threshold_tokens`` and
    keep about ``retain_tokens`` of the newest surface."""

    threshold_tokens: int
    retain_tokens: int


@attrs.frozen(slots=True)
class CompactionPolicy:
    """The policy in force for one target (the top level, or a merged model policy).

    Exactly one retention form is set: ``retain_ratio`` (a fraction of the context
    window) or ``retain_tokens`` (absolute).
    """

    threshold_ratio: float = 0.8
    retain_ratio: float | None = 0.16
    retain_tokens: int | None = None
    summarization_provider: str = ""
    summarization_model: str = ""
    max_tokens: int = 8192
    compaction_retries: int = 1
    max_overflow_retries: int = 1

    def scale(self, context_window: object, *, provider: str, model: str) -> PressureSpec:
        """Scale to a context window ``W`` of the target ``provider/model``.

        ``threshold = floor(W * threshold_ratio)``; ``retain = retain_tokens`` or
        ``floor(W * retain_ratio)``, which must stay below the threshold. Raises
        :class:`~harness.errors.TargetPressureConfigError` (keyed ``provider/model``)
        for a ``W`` that is not a positive integer or a retention that is too large.
        """
        key = f"{provider}/{model}"
        w = context_window
        if type(w) is float and w.is_integer():
            w = int(w)  # a JS number 1000.0 is the integer 1000
        if type(w) is not int or w <= 0:
            raise TargetPressureConfigError(
                key, f"{PREFIX}contextWindow ({js_str(context_window)}) must be a positive integer"
            )
        # Float products floored exactly as Math.floor(W * ratio) does on doubles.
        threshold = math.floor(w * self.threshold_ratio)
        if self.retain_tokens is not None:
            retain = self.retain_tokens
        else:
            assert self.retain_ratio is not None
            retain = math.floor(w * self.retain_ratio)
        if retain >= threshold:
            raise TargetPressureConfigError(
                key,
                f"{PREFIX}{key} retainTokens ({retain}) must be less than threshold tokens {threshold}",
            )
        return PressureSpec(threshold, retain)


@attrs.frozen(slots=True)
class ModelPolicy:
    """A policy for one exact ``{provider, model}``, already merged over the top level."""

    provider: str
    model: str
    policy: CompactionPolicy


@attrs.frozen(slots=True)
class BasicCompactionConfig:
    """The resolved config: the top-level policy, the model policies, and ``auto``."""

    defaults: CompactionPolicy = CompactionPolicy()
    model_policies: tuple[ModelPolicy, ...] = ()
    auto: bool = True

    def policy_for(self, provider: str, model: str) -> CompactionPolicy:
        """The policy of an exact ``{provider, model}`` match, else the top level."""
        for mp in self.model_policies:
            if mp.provider == provider and mp.model == model:
                return mp.policy
        return self.defaults
