"""Compaction for agents: the pressure and overflow policies as agent hooks, and
manual compaction (compaction reference §6, §7.1).

The transaction itself belongs to the session actor (``SessionHandle.compact_region``);
this module decides *when* it runs, on which span, with which summarizer.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, cast

import trio

from harness.agent._agent import Agent
from harness.agent._hooks import AgentView, RequestErrorContext, Retry, Status, StepContext
from harness.agent._types import AgentBusyError, AgentCancelledError, AgentDisposedError
from harness.compaction import (
    BasicCompactionConfig,
    SummarizationInput,
    SummaryOutput,
    SummaryTarget,
    ToolResultPruneConfig,
    resolve_summary_target,
    summarize,
)
from harness.compaction._transaction import CompactionResult
from harness.errors import (
    CompactionBusyError,
    CompactionError,
    ManualCompactionError,
    TargetPressureConfigError,
)
from harness.providers import ModelCatalog, ModelProvider
from harness.runtime import SessionHandle

log = logging.getLogger("harness.compaction")


def _warn(agent: Agent, message: str, exc: BaseException) -> None:
    """A compaction failure the turn goes on without: logged on ``harness.compaction``
    and reported to the store's warnings channel (``listener-failed``,
    ``agent/compaction``)."""
    agent.session.store.warnings.report(
        log, "listener-failed", "agent/compaction", message, session_id=agent.session.id, error=exc
    )

Reason = Literal["pressure", "context-overflow"]

#: The default phase-one config (frozen, shared).
DEFAULT_PRUNE: Final = ToolResultPruneConfig()

_LOCK_BUSY = "automatic pressure compaction: compaction already in progress; the session compaction lock is already active"


def routed_target(header: object) -> tuple[str, str] | None:
    """The provider/model pair the latest ``request/header`` routed to, when both are
    non-empty strings (the policies never fall back to the agent's own pair)."""
    config = header.get("config") if isinstance(header, Mapping) else None
    if not isinstance(config, Mapping):
        return None
    provider, model = config.get("provider"), config.get("model")
    if type(provider) is str and provider and type(model) is str and model:
        return provider, model
    return None


def describe(result: CompactionResult) -> str:
    lo, hi = result.shadowed_seqs[0], result.shadowed_seqs[-1]
    return f"shadowed {len(result.shadowed_seqs)} surface nodes (seqs {lo}-{hi}, ~{result.shadowed_token_count} tokens)"


class AgentCompaction:
    """The compaction policies of ``compaction-basic`` for agents.

    ``config`` is a loaded :class:`BasicCompactionConfig` (``load_basic_compaction_config``);
    ``prune`` the phase-one config (``None``: no pruner); ``models`` resolves context
    windows (default: each installed agent's provider answers for its own name);
    ``summary_provider`` streams summaries (default: the agent's provider).

    :meth:`install` attaches the ``agent/pre-step`` (pressure) and
    ``agent/request-error`` (context-overflow recovery) listeners when
    ``config.auto``; :meth:`compact_now` is manual compaction; :meth:`summarize` is the
    one hook a subclass overrides to summarize differently.
    """

    def __init__(
        self,
        config: BasicCompactionConfig | None = None,
        *,
        prune: ToolResultPruneConfig | None = DEFAULT_PRUNE,
        models: ModelCatalog | None = None,
        summary_provider: ModelProvider | None = None,
    ) -> None:
        self.config = config if config is not None else BasicCompactionConfig()
        self.prune = prune
        self.models = models if models is not None else ModelCatalog()
        self._own_catalog = models is None
        self.summary_provider = summary_provider
        self._warned: set[str] = set()
        # Per-agent overflow retries, and the newest assistant/message seq when counted
        # (a newer one resets the count: the model answered since).
        self._overflow: weakref.WeakKeyDictionary[Agent, tuple[int, int]] = weakref.WeakKeyDictionary()

    # -- installation ------------------------------------------------------------------

    def install(self, agent: Agent) -> Callable[[], None]:
        """Attach the pressure and overflow listeners to ``agent`` (nothing when
        ``config.auto`` is false); return the function that detaches them."""
        if self._own_catalog:
            self.models.add_provider(agent.provider)
        if not self.config.auto:
            return lambda: None
        removers = [
            agent.hooks.on_pre_step(self._on_pre_step),
            agent.hooks.on_request_error(self._on_request_error),
            agent.hooks.on_status(self._on_status),
        ]

        def uninstall() -> None:
            for remove in removers:
                remove()
            self._overflow.pop(agent, None)

        return uninstall

    # -- the summarizer ------------------------------------------------------------------

    async def summarize(self, agent: Agent, input: SummarizationInput, target: SummaryTarget) -> SummaryOutput:
        """Summarize ``input`` for ``target`` (the subclass hook). The default streams
        one request to ``summary_provider`` (or the agent's provider) through
        :func:`harness.compaction.summarize`.

        Cancellation: as :func:`harness.compaction.summarize`; the bracket around it is
        closed by the session actor whatever happens here.
        """
        provider = self.summary_provider or agent.provider
        return await summarize(
            provider,
            input,
            session_id=agent.id,
            max_tokens=target.max_tokens,
            provider_name=target.provider,
            model=target.model,
        )

    def summarizer(self, agent: Agent) -> Callable[[SummarizationInput], Any]:
        """The ``summarizer`` argument of ``compact_region`` for ``agent``: resolves the
        target (§5.2) inside the bracket, then calls :meth:`summarize`."""

        async def run(input: SummarizationInput) -> SummaryOutput:
            target = resolve_summary_target(
                self.config,
                agent.session.request_header(),
                agent_provider=agent.provider.name,
                agent_model=agent.provider.model,
            )
            return await self.summarize(agent, input, target)

        return run

    # -- the policies (§6) ---------------------------------------------------------------

    async def compact_if_needed(self, agent: Agent, reason: Reason) -> CompactionResult | None:
        """Run the ``pressure`` or ``context-overflow`` policy once (§6.1, §6.2);
        return the last committed result, or ``None`` when nothing was summarized.

        ``pressure``: with a routed target, resolve the model's context window, check
        the lock (``CompactionBusyError`` even below threshold), and when the total
        reaches ``floor(window * thresholdRatio)``: prune, then select with the
        policy's ``retainTokens`` and compact, up to ``1 + compactionRetries`` times,
        until below threshold (else :class:`CompactionError`; checkpoints that landed
        stay). No window: :class:`TargetPressureConfigError`.
        ``context-overflow``: prune (no lock check), then one compaction with
        retain 0. Both need an open turn (they own their brackets) and raise raw errors.

        Cancellation: between steps nothing is half-done; a compaction cancelled while
        it runs closes its bracket (``compact_region``'s contract).
        """
        s = agent.session
        target = routed_target(s.request_header())
        if target is None:
            return None
        if reason == "context-overflow":
            if self.prune is not None:
                await s.prune(self.prune)
            selected = (await s.measure(0)).selection
            if selected is None:
                return None
            return await s.compact_region(selected.start, selected.end, summarizer=self.summarizer(agent))
        if reason != "pressure":
            raise ValueError(f'compaction reason must be "pressure" or "context-overflow", got {reason!r}')
        provider, model = target
        policy = self.config.policy_for(provider, model)
        info = await self.models.resolve_model_info(provider, model)
        state = await s.measure()
        if state.lock.locked:
            raise CompactionBusyError(_LOCK_BUSY, session_id=s.id)
        key = f"{provider}/{model}"
        if info.context_window is None:
            raise TargetPressureConfigError(
                key,
                f"compaction-basic: no context capacity for {key}; configure contextWindow on that adapter model",
                session_id=s.id,
            )
        spec = policy.scale(info.context_window, provider=provider, model=model)
        if state.measurement.total_tokens < spec.threshold_tokens:
            return None
        if self.prune is not None:
            await s.prune(self.prune)
            if (await s.measure()).measurement.total_tokens < spec.threshold_tokens:
                return None
        attempts = 1 + policy.compaction_retries
        result: CompactionResult | None = None
        total = 0
        for _ in range(attempts):
            selected = (await s.measure(spec.retain_tokens)).selection
            if selected is None:
                if result is None:
                    return None
                break
            result = await s.compact_region(selected.start, selected.end, summarizer=self.summarizer(agent))
            total = (await s.measure()).measurement.total_tokens
            if total < spec.threshold_tokens:
                return result
        raise CompactionError(
            f"compaction still above threshold after {attempts} compaction attempts "
            f"({total} estimated tokens >= threshold {spec.threshold_tokens})",
            session_id=s.id,
        )

    async def compact_region(self, agent: Agent, start: int, end: int) -> CompactionResult:
        """Explicit-region compaction with this policy's summarizer: the session's
        open turn owns the bracket (``SessionHandle.compact_region``, automatic; raw
        errors).

        Cancellation: ``SessionHandle.compact_region``'s contract — the summarizer is
        cancelled, the bracket closed with an error end, then ``Cancelled`` propagates."""
        return await agent.session.compact_region(start, end, summarizer=self.summarizer(agent))

    # -- manual compaction (§7.1) ----------------------------------------------------------

    async def compact_now(self, agent: Agent, *, source_command_id: str | None = None) -> CompactionResult | None:
        """Compact everything but the newest unit now, in the agent's maintenance
        phase; ``None`` when nothing is compactable (nothing written).

        Raises :class:`ManualCompactionError`: ``busy`` at once when the agent is not
        idle (a turn, maintenance, or a driver already started by a waking send) or
        the lock is live; ``cancelled`` when :meth:`Agent.cancel` cancelled it (the
        bracket was closed and flushed first; the cause is the agent's
        :class:`AgentCancelledError`); ``changed``, ``summary``, ``commit``,
        ``persistence`` as ``compact_region(manual=True)``. Selection errors stay raw.

        Cancellation: an already-cancelled caller gets ``Cancelled`` before anything
        is reserved. Later, the bracket is closed and flushed, then ``Cancelled``
        propagates (the caller's own cancellation is never wrapped). Sends that
        arrived meanwhile run after it, on the compacted surface.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        s: SessionHandle = agent.session

        async def task() -> CompactionResult | None:
            selected = (await s.measure(0)).selection
            if selected is None:
                return None
            return await s.compact_region(
                selected.start,
                selected.end,
                summarizer=self.summarizer(agent),
                manual=True,
                source_command_id=source_command_id,
                flush=True,
                abort_check=agent.cancel_requested,
            )

        try:
            return await agent.run_maintenance(task)
        except (AgentBusyError, AgentDisposedError) as exc:
            raise ManualCompactionError.of(
                "busy", "manual compaction requires an idle agent with no waking queued work", cause=exc, session_id=s.id
            ) from exc
        except AgentCancelledError as exc:
            raise ManualCompactionError.of(
                "cancelled", "manual compaction was cancelled", cause=exc, session_id=s.id
            ) from exc

    # -- the listeners (§6.3) --------------------------------------------------------------

    async def _on_pre_step(self, context: StepContext) -> None:
        """Pressure before every step; never fails the step (errors are warnings)."""
        agent = _installed(context.agent)
        if _cancelled(agent):
            return  # §6.3: an aborted step goes straight on, without a model-info lookup
        try:
            result = await self.compact_if_needed(agent, "pressure")
        except TargetPressureConfigError as exc:
            if exc.target_key not in self._warned:
                self._warned.add(exc.target_key)
                _warn(agent, str(exc), exc)
        except Exception as exc:
            _warn(agent, f"step compaction failed: {exc}; continuing the turn", exc)
        else:
            if result is not None:
                log.info("compaction (step pressure): %s", describe(result))

    async def _on_request_error(self, context: RequestErrorContext) -> Retry | None:
        """Context-overflow recovery: compact, and retry the request in the same step
        only when the surface provably changed (the replace generation advanced)."""
        agent = _installed(context.agent)
        if context.error.code != "CONTEXT_WINDOW_EXCEEDED" or _cancelled(agent):
            return None
        s = agent.session
        target = routed_target(s.request_header())
        if target is None:
            return None
        policy = self.config.policy_for(*target)
        if self.overflow_retries(agent) >= policy.max_overflow_retries:
            return None
        generation = s.generation
        try:
            result = await self.compact_if_needed(agent, "context-overflow")
        except Exception as exc:
            if s.generation != generation:
                _warn(
                    agent,
                    f"context-overflow compaction failed after durable surface progress: {exc}; "
                    "retrying from the replacement surface",
                    exc,
                )
                self._count_overflow(agent)
                return Retry()
            _warn(agent, f"context-overflow compaction failed: {exc}; preserving the original request error", exc)
            return None
        if s.generation == generation:
            return None  # nothing replaced: a retry would fail the same way
        if result is not None:
            log.info("compaction (context overflow recovery): %s", describe(result))
        self._count_overflow(agent)
        return Retry()

    def _on_status(self, view: AgentView, status: Status) -> None:
        if status == "idle":
            self._overflow.pop(_installed(view), None)

    def overflow_retries(self, agent: Agent) -> int:
        """The overflow retries counted for ``agent`` since it was last idle or the
        model last answered in its session."""
        entry = self._overflow.get(agent)
        if entry is None:
            return 0
        count, mark = entry
        if _latest_assistant(agent.session) != mark:
            self._overflow.pop(agent, None)
            return 0
        return count

    def _count_overflow(self, agent: Agent) -> None:
        self._overflow[agent] = (self.overflow_retries(agent) + 1, _latest_assistant(agent.session))


def _installed(view: AgentView) -> Agent:
    # The hooks name the agent by its protocol (they sit below it); the agent these
    # listeners were installed on (install) is an Agent, the protocol's one implementation.
    return cast(Agent, view)


def _cancelled(agent: Agent) -> bool:
    """Whether the step is already cancelled: by :meth:`Agent.cancel`, or by a Trio
    scope around it whose cancellation has not reached a checkpoint yet."""
    return agent.cancel_requested() or trio.current_effective_deadline() == float("-inf")


def _latest_assistant(s: SessionHandle) -> int:
    events = s.events
    for i in range(len(events) - 1, -1, -1):
        if events[i].type == "assistant/message":
            return events[i].seq
    return -1
