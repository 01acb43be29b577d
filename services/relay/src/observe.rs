//! What a relay process tells the outside about itself: logs, traces and the metrics recorder.
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `info`). When `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, `tracing` spans at `info` and above are also exported over
//! OTLP/gRPC (tonic) to that endpoint, under the service name `OTEL_SERVICE_NAME` or `ahp-relay-<command>`,
//! and the W3C trace-context propagator is installed so traces continue across the gateway→shard gRPC hop
//! (`relay_rpc::trace`). Without those variables nothing of OpenTelemetry is initialised. The other standard
//! `OTEL_EXPORTER_OTLP_*` variables (headers, timeout, compression) and `OTEL_TRACES_SAMPLER` apply as the
//! OpenTelemetry SDK defines them.
//!
//! The process-wide Prometheus recorder ([`relay_core::telemetry`]) is installed here too, for the sides of
//! the relay the process runs.

use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use relay_core::telemetry::{self, Side};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The variables that turn OTLP export on.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// How long exporting the last spans may delay the process's exit (an unreachable collector must not).
const SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Keeps trace export running; dropping it exports the spans still buffered.
pub struct Observability {
    traces: Option<SdkTracerProvider>,
}

/// Set up logging, trace export (if configured) and the metrics recorder of the process running `command`
/// (`serve`, `shard`, `gateway`), which records `sides`.
pub fn init(command: &str, sides: &[Side]) -> anyhow::Result<Observability> {
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")));
    let traces = if otlp_configured() {
        Some(tracer_provider(command)?)
    } else {
        None
    };
    let export = traces.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("ahp-relay"))
            .with_filter(LevelFilter::INFO)
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(export)
        .try_init()
        .context("installing the tracing subscriber")?;
    if let Some(provider) = &traces {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        opentelemetry::global::set_tracer_provider(provider.clone());
        tracing::info!(service = %service_name(command), "exporting traces over OTLP");
    }
    telemetry::install(sides).context("installing the metrics recorder")?;
    Ok(Observability { traces })
}

fn otlp_configured() -> bool {
    ENDPOINT_VARS
        .iter()
        .any(|var| std::env::var(var).is_ok_and(|value| !value.trim().is_empty()))
}

/// `OTEL_SERVICE_NAME`, or `ahp-relay-<command>`.
fn service_name(command: &str) -> String {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| format!("ahp-relay-{command}"))
}

/// A batching OTLP/gRPC span exporter. Must run inside the Tokio runtime (the exporter's channel lives there).
fn tracer_provider(command: &str) -> anyhow::Result<SdkTracerProvider> {
    // The exporter reads its endpoint (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`).
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .context("building the OTLP span exporter")?;
    Ok(SdkTracerProvider::builder()
        .with_resource(
            Resource::builder()
                .with_service_name(service_name(command))
                .build(),
        )
        .with_batch_exporter(exporter)
        .build())
}

impl Drop for Observability {
    fn drop(&mut self) {
        if let Some(provider) = self.traces.take() {
            if let Err(error) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
                tracing::warn!(%error, "exporting the last spans failed");
            }
        }
    }
}
