//! Traces (README "Traces"): OpenTelemetry spans of each MCP request and of the steps a call
//! takes (queue, interpreter, install, run, checkpoint, upstream tool calls), exported over
//! OTLP/HTTP by OpenTelemetry's SDK, only when the standard variables name an endpoint
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; also
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*`).
//!
//! The spans are `tracing` spans of this crate (target [`TARGET`]), turned into OpenTelemetry
//! spans by `tracing-opentelemetry`; without an endpoint that layer is not installed and a span
//! costs what a disabled `tracing` span costs. A request's parent is the W3C trace context its
//! client sent: in `params._meta` (`traceparent`, `tracestate`, `baggage`; SEP-414, which the
//! 2026-07-28 clients follow), else in the HTTP request's headers (older clients behind an
//! instrumented HTTP stack). Names and attributes follow OpenTelemetry's semantic conventions
//! for MCP (`mcp.method.name`, `mcp.session.id`, `gen_ai.tool.name`, `jsonrpc.request.id`).

use opentelemetry::propagation::{Extractor, Injector, TextMapCompositePropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The `tracing` target of every span this module exports: the OpenTelemetry layer takes these
/// and nothing else (no span of rmcp, hyper or the engine).
pub const TARGET: &str = "mcp_run_python::trace";

/// The service name when `OTEL_SERVICE_NAME` does not give one.
const SERVICE_NAME: &str = "mcp-run-python";

/// The variables that name an OTLP endpoint for traces.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The export pipeline, when an endpoint is set: kept by `main` until the process ends, then
/// [`Exporting::shutdown`] sends what is still buffered.
pub struct Exporting {
    provider: SdkTracerProvider,
}

/// Errors of starting the export.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    /// The OTLP exporter could not be built (a malformed endpoint or header variable).
    #[error("OTLP trace exporter: {0}")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
}

/// Whether the environment asks for traces: an endpoint is set, and neither
/// `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` turns them off (the SDK
/// environment variables' specification).
pub fn wanted() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let is = |name: &str, value: &str| {
        std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value))
    };
    ENDPOINT_VARIABLES.iter().any(|v| set(v))
        && !is("OTEL_SDK_DISABLED", "true")
        && !is("OTEL_TRACES_EXPORTER", "none")
}

/// Builds the OTLP/HTTP exporter and the tracer provider (batching, in a thread of the SDK's),
/// and sets the global propagator to W3C trace context and baggage. Call before any async
/// runtime starts: the exporter's HTTP client is a blocking one.
///
/// Errors: [`TracesError::Exporter`].
pub fn start() -> Result<Exporting, TracesError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(TracesError::Exporter)?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(SERVICE_NAME);
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]));
    Ok(Exporting { provider })
}

impl Exporting {
    /// The `tracing` layer that turns this crate's spans into OpenTelemetry spans.
    pub fn layer<S>(
        &self,
    ) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer(SERVICE_NAME))
    }

    /// Ends every span still open and sends what is buffered (at most the SDK's export
    /// timeout, `OTEL_EXPORTER_OTLP_TIMEOUT`).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("traces: the last spans were not all exported: {e}");
        }
    }
}

/// Makes the W3C trace context in `carrier` (`_meta` entries, or HTTP headers: name → value)
/// the parent of `span`; a carrier without one leaves `span` a root.
pub fn set_parent(span: &tracing::Span, carrier: &dyn Extractor) {
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(carrier));
    // A span without an OpenTelemetry layer (traces off) ignores it.
    let _ = span.set_parent(parent);
}

/// The W3C trace context of `span`, as `_meta` entries to send on (an upstream request):
/// empty when traces are off or the span is not sampled.
pub fn context_of(span: &tracing::Span) -> Vec<(String, String)> {
    struct Entries(Vec<(String, String)>);
    impl Injector for Entries {
        fn set(&mut self, key: &str, value: String) {
            self.0.push((key.to_owned(), value));
        }
    }
    let mut entries = Entries(Vec::new());
    let context = span.context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&context, &mut entries));
    entries.0
}

/// A JSON object's string entries as a carrier of trace context (`params._meta`).
pub struct MetaCarrier<'a>(pub &'a serde_json::Map<String, serde_json::Value>);

impl Extractor for MetaCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(serde_json::Value::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// HTTP headers as a carrier of trace context.
pub struct HeaderCarrier<'a>(pub &'a http::HeaderMap);

impl Extractor for HeaderCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A span of one step of a call (`name`: `queue`, `interpreter`, `install`, `run`,
/// `checkpoint`, …), a child of the current span.
pub fn step(name: &'static str) -> tracing::Span {
    tracing::info_span!(
        target: TARGET,
        "step",
        otel.name = name,
        otel.status_code = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    )
}

/// Marks `span` failed (`otel.status_code` ERROR), with `error_type` (a fixed word: the call's
/// status, or an error's kind) as `error.type`.
pub fn record_error(span: &tracing::Span, error_type: &'static str) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", error_type);
}
