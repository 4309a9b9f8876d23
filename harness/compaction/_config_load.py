"""Structuring a plain ``BasicCompactionConfig`` record into resolved values (§2.3).

Hand-written rather than cattrs: every rule has an exact reference message, and the
checks depend on each other (a policy is validated against the merged top level).
Messages begin ``BasicCompactionConfig: ``. A problem inside ``modelPolicies[i]``
carries the same text as at the top level, after ``modelPolicies[i]: `` (the
reference lists only the top-level wording; the qualifier says which policy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from harness.compaction._config import (
    PREFIX,
    BasicCompactionConfig,
    CompactionPolicy,
    ModelPolicy,
    js_str,
)
from harness.errors import CompactionConfigError

_POLICY_FIELDS: Final = (
    "thresholdRatio",
    "retainRatio",
    "retainTokens",
    "summarizationProvider",
    "summarizationModel",
    "maxTokens",
    "compactionRetries",
    "maxOverflowRetries",
)
_TOP_KEYS: Final = frozenset((*_POLICY_FIELDS, "modelPolicies", "auto"))
_POLICY_KEYS: Final = frozenset(("provider", "model", *_POLICY_FIELDS))
_SAFE_INT_MAX: Final = 2**53 - 1


def _fail(where: str, text: str) -> CompactionConfigError:
    return CompactionConfigError(f"{PREFIX}{where}{text}")


def _ratio(where: str, key: str, value: object) -> float:
    if (type(value) is int or type(value) is float) and math.isfinite(value) and 0 < value <= 1:
        return float(value)
    raise _fail(where, f"{key} must be a number in (0, 1]")


def _integer(where: str, key: str, value: object, *, minimum: int) -> int:
    # JS integers are doubles: 3.0 is the integer 3. bool is not a number in JSON.
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and minimum <= value <= _SAFE_INT_MAX:
        return value
    kind = "a positive integer" if minimum > 0 else "a non-negative integer"
    raise _fail(where, f"{key} must be {kind}")


def _string(where: str, key: str, value: object) -> str:
    if type(value) is not str:
        raise _fail(where, f"{key} must be a string")
    return value


def _check_keys(where: str, record: Mapping[Any, object], allowed: frozenset[str]) -> None:
    for key in record:
        if key not in allowed:
            raise _fail(where, f'unknown key "{key}"')


def _merge(where: str, record: Mapping[Any, object], parent: CompactionPolicy) -> CompactionPolicy:
    """``parent`` with the policy fields ``record`` sets, validated and merged."""
    threshold = parent.threshold_ratio
    if "thresholdRatio" in record:
        threshold = _ratio(where, "thresholdRatio", record["thresholdRatio"])
    has_ratio, has_tokens = "retainRatio" in record, "retainTokens" in record
    ratio = _ratio(where, "retainRatio", record["retainRatio"]) if has_ratio else None
    tokens = (
        _integer(where, "retainTokens", record["retainTokens"], minimum=0) if has_tokens else None
    )
    if has_ratio and has_tokens:
        raise _fail(where, "retainRatio and retainTokens are mutually exclusive")
    if not has_ratio and not has_tokens:
        # No retention field: inherit the parent's retention form, whichever it is.
        ratio, tokens = parent.retain_ratio, parent.retain_tokens
    if ratio is not None and ratio >= threshold:
        raise _fail(
            where,
            f"retainRatio ({js_str(ratio)}) must be less than the resolved thresholdRatio ({js_str(threshold)})",
        )
    provider = parent.summarization_provider
    if "summarizationProvider" in record:
        provider = _string(where, "summarizationProvider", record["summarizationProvider"])
    model = parent.summarization_model
    if "summarizationModel" in record:
        model = _string(where, "summarizationModel", record["summarizationModel"])
    if bool(provider) != bool(model):
        raise _fail(
            where,
            "summarizationProvider and summarizationModel must be set together as an empty or non-empty pair",
        )

    def integer(key: str, inherited: int, minimum: int) -> int:
        return _integer(where, key, record[key], minimum=minimum) if key in record else inherited

    return CompactionPolicy(
        threshold_ratio=threshold,
        retain_ratio=ratio,
        retain_tokens=tokens,
        summarization_provider=provider,
        summarization_model=model,
        max_tokens=integer("maxTokens", parent.max_tokens, 1),
        compaction_retries=integer("compactionRetries", parent.compaction_retries, 0),
        max_overflow_retries=integer("maxOverflowRetries", parent.max_overflow_retries, 0),
    )


def _model_policy(i: int, record: object, defaults: CompactionPolicy) -> ModelPolicy:
    where = f"modelPolicies[{i}]: "
    if not isinstance(record, Mapping):
        raise _fail("", f"modelPolicies[{i}] must be an object")
    _check_keys(where, record, _POLICY_KEYS)
    names = []
    for key in ("provider", "model"):
        value = record.get(key)
        if type(value) is not str or not value:
            raise _fail(where, f"{key} must be a non-empty string")
        names.append(value)
    return ModelPolicy(names[0], names[1], _merge(where, record, defaults))


def load_basic_compaction_config(record: object = None) -> BasicCompactionConfig:
    """Validate a plain record (e.g. decoded JSON) and resolve it; ``None`` is ``{}``.

    Raises :class:`~harness.errors.CompactionConfigError` with the reference's
    message for the first rule broken: unknown keys first, then the fields in the
    reference's table order, then each model policy, then ``auto``.
    """
    if record is None:
        record = {}
    if not isinstance(record, Mapping):
        raise _fail("", "config must be an object")
    _check_keys("", record, _TOP_KEYS)
    defaults = _merge("", record, CompactionPolicy())
    raw_policies = record.get("modelPolicies", [])
    if type(raw_policies) is not list and type(raw_policies) is not tuple:
        raise _fail("", "modelPolicies must be an array")
    policies: list[ModelPolicy] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(raw_policies):
        mp = _model_policy(i, raw, defaults)
        if (mp.provider, mp.model) in seen:
            raise _fail("", f"duplicate model policy for {mp.provider}/{mp.model}")
        seen.add((mp.provider, mp.model))
        policies.append(mp)
    auto = record.get("auto", True)
    if type(auto) is not bool:
        raise _fail("", "auto must be a boolean")
    return BasicCompactionConfig(defaults, tuple(policies), auto)
