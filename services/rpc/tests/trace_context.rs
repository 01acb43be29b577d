//! Trace context crosses the gateway→shard gRPC hop: with OpenTelemetry installed (an in-memory exporter
//! here, OTLP in the relay), the shard's `ahp.shard.call` span for a client's request is a child of the
//! gateway's `ahp.call` span for it — same trace id, parent span id = the gateway span's id. A `Call` sent
//! without trace context starts a trace of its own, so the check cannot pass by accident.

mod common;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use relay_core::Limits;
use relay_runner::{DemoPace, DemoProvider, ProviderRegistry};
use relay_shard::ShardLink;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

const SECRET: &[u8] = b"trace-test-secret";
const PATIENCE: Duration = Duration::from_secs(20);

/// Install a global tracing subscriber exporting spans to memory, and the W3C propagator (as the relay does
/// when `OTEL_EXPORTER_OTLP_ENDPOINT` is set).
fn install_tracing() -> (InMemorySpanExporter, SdkTracerProvider) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("test"))
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
    );
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this test binary");
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    (exporter, provider)
}

/// A shard served over gRPC on loopback; returns its URL.
async fn start_shard(data: &tempfile::TempDir) -> String {
    let store = relay_store::Store::connect(&format!("sqlite://{}", data.path().join("x.sqlite").display()))
        .await
        .expect("store");
    store.migrate().await.expect("migrate");
    let providers = ProviderRegistry::new().with(Arc::new(DemoProvider::new(DemoPace {
        step: Duration::from_millis(5),
    })));
    let link = Arc::new(ShardLink::new(Limits::default(), providers, store, None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        relay_rpc::serve(listener, link, &common::credential(), std::future::pending())
            .await
            .expect("serve");
    });
    url
}

/// A gateway in this process in front of the shard; returns its address.
async fn start_gateway(shard_url: &str) -> String {
    common::start_gateway(shard_url, SECRET, 100).await
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn named<'a>(spans: &'a [SpanData], name: &str, method: &str) -> Option<&'a SpanData> {
    spans.iter().find(|s| {
        s.name == name && attribute(s, "method").map(|v| v.as_str().into_owned()).as_deref() == Some(method)
    })
}

/// Wait (bounded) until the exporter holds a span named `name` for `method`.
async fn finished_span(exporter: &InMemorySpanExporter, name: &str, method: &str) -> SpanData {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let spans = exporter.get_finished_spans().expect("spans");
        if let Some(span) = named(&spans, name, method) {
            return span.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {name} span for {method}; got {:?}",
            spans.iter().map(|s| (&s.name, &s.attributes)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shards_call_span_continues_the_gateways_trace() {
    let (exporter, _provider) = install_tracing();
    let data = tempfile::tempdir().expect("tempdir");
    let shard = start_shard(&data).await;
    let gateway = start_gateway(&shard).await;

    let client = common::connect(&gateway, SECRET, "ana", PATIENCE).await;
    client
        .initialize(
            "device-a".into(),
            vec!["1.0.0".into()],
            vec!["ahp-root://".into()],
        )
        .await
        .expect("initialize");

    let gateway_span = finished_span(&exporter, "ahp.call", "initialize").await;
    let shard_span = finished_span(&exporter, "ahp.shard.call", "initialize").await;
    assert!(gateway_span.span_context.is_valid());
    assert_eq!(
        shard_span.span_context.trace_id(),
        gateway_span.span_context.trace_id(),
        "the shard's span is in the gateway's trace"
    );
    assert_eq!(
        shard_span.parent_span_id,
        gateway_span.span_context.span_id(),
        "the shard's span is a child of the gateway's ahp.call span"
    );
    assert!(shard_span.parent_span_is_remote, "its parent came over the wire");
    assert_eq!(
        attribute(&shard_span, "host").map(|v| v.as_str().into_owned()),
        Some("dev/default".to_string())
    );

    // Control: the same call without trace context metadata starts a trace of its own on the shard.
    let channel = tonic::transport::Endpoint::from_shared(shard.clone())
        .expect("url")
        .connect()
        .await
        .expect("grpc");
    relay_rpc::pb::shard_client::ShardClient::with_interceptor(channel, common::credential())
        .call(relay_rpc::pb::CallRequest {
            host: Some(relay_rpc::pb::HostKey {
                tenant: "dev".into(),
                host: "default".into(),
            }),
            connection: 12345,
            frame: br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
        })
        .await
        .expect("call");
    let untraced = finished_span(&exporter, "ahp.shard.call", "ping").await;
    assert_eq!(
        untraced.parent_span_id,
        SpanId::INVALID,
        "no parent without traceparent"
    );
    assert_ne!(
        untraced.span_context.trace_id(),
        gateway_span.span_context.trace_id()
    );
    client.shutdown().await;
}
