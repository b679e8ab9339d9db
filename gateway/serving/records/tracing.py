"""OpenTelemetry traces: one span per request to an OpenAI endpoint, one child span per engine attempt.

Off unless the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set (and
`OTEL_SDK_DISABLED` is not `true`). The SDK reads the other standard variables itself: `OTEL_SERVICE_NAME`
(default here `cascade-gateway`), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`
(e.g. `parentbased_traceidratio` and `0.1`), `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`. Spans go over OTLP/HTTP
(protobuf) through a batch processor: a receiver that is down or slow never holds a request (its queue drops
the oldest spans; failed exports are counted in `cascade_trace_export_failures_total`).

The request span (kind SERVER, `<operation> <model>`) continues the client's W3C `traceparent` when it sends a
valid one (a malformed one starts a new trace). It starts when the endpoint begins the request (`begin`) and
ends with the request's final cost record (`answered`: the ledger's tokens and cost) or its error (`refused`),
the events the access log writes its line on. Attributes follow the OpenTelemetry GenAI conventions
(`gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.response.model`,
`gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`) plus the gateway's own under `cascade.` (tenant, pool,
rule, route, cost in micro-USD, ledger status). Never prompt or answer text. The provider is the answering pool's
(`provider_of`, `policies.providers`: "vllm" for a local pool); a refused request's span has none.

Each engine attempt (`gateway.serving.sending.proxy`) is a child span (kind CLIENT, `engine <pool>`: pool, provider,
replica, status), and the engine call carries its `traceparent`; the local engines are started with vLLM's own
export to the same endpoint (`backends.engines.args.tracing_args`), so each engine's request span is a child of
the attempt that called it. Admission, routing (scoring and the route steps) and the ledger write are child spans too
(`step`: `admission`, `route`, `ledger.write`), and a stream's first token is an event (`gen_ai.first_token`).
The request span is found through a context variable the endpoint sets (`begin`), which the tasks a request
starts inherit.
"""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from backends.engines.args import otlp_traces_endpoint
from gateway.ledger.store import CostRecord
from gateway.serving.records.access_log import ANSWERED

__all__ = ["Tracing", "first_token", "step", "tracing_from_env"]

log = logging.getLogger(__name__)
_MAX_OPEN = 100_000  # request spans begun and not ended; beyond it (a leak) the oldest are ended as they are
_OPERATION = {"chat": "chat", "responses": "chat", "completions": "text_completion", "embeddings": "embeddings"}
# (tracer, request span) of the request this task serves; tasks a request starts inherit it
_REQUEST: contextvars.ContextVar[tuple[Any, Any] | None] = contextvars.ContextVar("cascade_request_span", default=None)


class Tracing:
    """The gateway's tracer (None inside: tracing is off and every method returns at once). Owns its provider
    (`shutdown` flushes what is queued)."""

    def __init__(self, provider: Any = None, on_export_failure: Callable[[], None] | None = None) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("cascade-gateway") if provider is not None else None
        self._open: dict[str, Any] = {}
        self.on_export_failure = on_export_failure
        self.provider_of: Callable[[str], str | None] = lambda pool: None  # pool -> gen_ai.provider.name

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def begin(self, request_id: str, headers: Mapping[str, str], endpoint: str) -> None:
        """A request arrived at `endpoint` ("chat", "responses", "completions") with these HTTP headers."""
        if self._tracer is None:
            return
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract(headers)  # a malformed traceparent: a new trace
        operation = _OPERATION.get(endpoint, endpoint)
        span = self._tracer.start_span(operation, context=parent, kind=SpanKind.SERVER, attributes={
            "gen_ai.operation.name": operation, "cascade.request_id": request_id, "cascade.endpoint": endpoint})
        if len(self._open) >= _MAX_OPEN:
            self._open.pop(next(iter(self._open))).end()
        self._open[request_id] = span
        _REQUEST.set((self._tracer, span))

    def requested_model(self, request_id: str, model: str) -> None:
        """The model the client asked for (`auto` or a pool name); names the span `<operation> <model>`."""
        if (span := self._open.get(request_id)) is not None:
            span.set_attribute("gen_ai.request.model", model)
            span.update_name(f"{span.attributes.get('gen_ai.operation.name', 'chat')} {model}")

    def answered(self, rec: CostRecord) -> None:
        """A cost record of a begun request: its final one (`access_log.ANSWERED`) ends the span."""
        if rec.status not in ANSWERED or (span := self._open.pop(rec.request_id, None)) is None:
            return
        span.set_attributes({
            "gen_ai.response.model": rec.model, "gen_ai.usage.input_tokens": rec.prompt_tokens,
            "gen_ai.usage.output_tokens": rec.completion_tokens, "cascade.tenant": rec.tenant,
            "cascade.pool": rec.pool, "cascade.rule": rec.rule, "cascade.route": rec.route,
            "cascade.cost_micro_usd": rec.cost_micro_usd, "cascade.status": rec.status,
            "http.response.status_code": 200, **({"cascade.tiers": rec.tiers} if rec.tiers else {})})
        if (provider := self.provider_of(rec.pool)) is not None:
            span.set_attribute("gen_ai.provider.name", provider)
        span.end()

    def refused(self, request_id: str, tenant: str, status: int, outcome: str) -> None:
        """A begun request answered with an error (`outcome`: its code) or dropped."""
        if (span := self._open.pop(request_id, None)) is None:
            return
        from opentelemetry.trace import Status, StatusCode

        span.set_attributes({"cascade.tenant": tenant, "http.response.status_code": status, "error.type": outcome})
        span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()

    def attempt(self, pool: str, replica: str, headers: Mapping[str, str] | None
                ) -> tuple[Any, Mapping[str, str] | None]:
        """A child span of the current request for one engine call, and the call's headers with its
        `traceparent` (the headers unchanged and no span when tracing is off or outside a request)."""
        current = _REQUEST.get() if self._tracer is not None else None
        if self._tracer is None or current is None:
            return None, headers
        parent = current[1]
        from opentelemetry.propagate import inject
        from opentelemetry.trace import SpanKind, set_span_in_context

        attributes = {"cascade.pool": pool, "server.address": replica}
        if (provider := self.provider_of(pool)) is not None:
            attributes["gen_ai.provider.name"] = provider
        span = self._tracer.start_span(f"engine {pool}", context=set_span_in_context(parent), kind=SpanKind.CLIENT,
                                       attributes=attributes)
        carrier = dict(headers or {})
        inject(carrier, context=set_span_in_context(span))
        return span, carrier

    @staticmethod
    def attempt_ended(span: Any, status: int | None, error: str | None = None) -> None:
        """End an `attempt` span: the engine's HTTP status, or the error that ended it (no status)."""
        if span is None:
            return
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def shutdown(self) -> None:
        for span in self._open.values():
            span.end()
        self._open.clear()
        if self._provider is not None:
            self._provider.shutdown()


_UNTRACED = nullcontext()  # reusable: what `step` gives a request nobody traces, without building a generator


def step(name: str) -> AbstractContextManager[None]:
    """A child span `name` of the current request's span around the block (nothing when tracing is off or the
    task serves no traced request); an exception marks it failed and goes on."""
    current = _REQUEST.get()
    return _UNTRACED if current is None else _child_span(current, name)


@contextmanager
def _child_span(current: tuple[Any, Any], name: str) -> Iterator[None]:
    from opentelemetry.trace import Status, StatusCode, set_span_in_context

    span = current[0].start_span(name, context=set_span_in_context(current[1]))
    try:
        yield
    except BaseException as exc:
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        span.end()


def first_token() -> None:
    """The current request's first token arrived: an event on its span."""
    if (current := _REQUEST.get()) is not None:
        current[1].add_event("gen_ai.first_token")


def tracing_from_env(env: Mapping[str, str] | None = None,
                     on_export_failure: Callable[[], None] | None = None) -> Tracing:
    """Tracing as the standard OTEL_* variables say (off without an OTLP endpoint)."""
    env = os.environ if env is None else env
    endpoint = otlp_traces_endpoint(env)  # the local engines export to it too (`backends.engines.args`)
    if endpoint is None:
        return Tracing()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class _Counted(SpanExporter):  # counts failed exports (a receiver down): nothing else changes
        def __init__(self, inner: SpanExporter) -> None:
            self._inner = inner

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            result = self._inner.export(spans)
            if result is not SpanExportResult.SUCCESS and tracing.on_export_failure is not None:
                tracing.on_export_failure()
            return result

        def shutdown(self) -> None:
            self._inner.shutdown()

    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "cascade-gateway"})
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER(_ARG)
    provider.add_span_processor(BatchSpanProcessor(_Counted(OTLPSpanExporter())))
    tracing = Tracing(provider, on_export_failure)
    log.info("tracing on: OTLP/HTTP to %s", endpoint)
    return tracing
