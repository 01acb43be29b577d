//! OpenTelemetry across processes: a shard and a gateway started with `OTEL_EXPORTER_OTLP_ENDPOINT` export
//! their spans over OTLP/gRPC (to a collector stub in this test), each under its own service name, and the
//! shard's `ahp.shard.call` span for a client's request is a child of the gateway's `ahp.call` span for it:
//! the trace context crossed the gRPC hop as `traceparent` metadata.

mod support;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use support::*;

/// A span as the collector received it, with the service that sent it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    method: Option<String>,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
}

/// An OTLP trace collector that keeps what it is sent.
#[derive(Default, Clone)]
struct Collector {
    spans: Arc<parking_lot::Mutex<Vec<Received>>>,
}

fn string_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Value::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| string_attribute(&r.attributes, "service.name"))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push(Received {
                        service: service.clone(),
                        method: string_attribute(&span.attributes, "method"),
                        name: span.name,
                        trace_id: span.trace_id,
                        span_id: span.span_id,
                        parent_span_id: span.parent_span_id,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// Serve on a free loopback port; returns its endpoint URL.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .expect("collector");
        });
        url
    }

    /// Wait (bounded) for a span named `name` for `method` from `service`.
    async fn span(&self, service: &str, name: &str, method: &str) -> Received {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let found = self
                .spans
                .lock()
                .iter()
                .find(|s| s.service == service && s.name == name && s.method.as_deref() == Some(method))
                .cloned();
            if let Some(span) = found {
                return span;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {name} span for {method} from {service}; received {:?}",
                self.spans.lock()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_one_trace_across_gateway_and_shard() {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    // Export batches every 50 ms instead of every 5 s.
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let shard = Shard::start_env(&[], &env).await;
    let gateway = Relay::gateway_env(&shard.url, &[], &env).await;
    let (client, _) = gateway.client("device-a").await;

    let on_gateway = collector
        .span("ahp-relay-gateway", "ahp.call", "initialize")
        .await;
    let on_shard = collector
        .span("ahp-relay-shard", "ahp.shard.call", "initialize")
        .await;
    assert_eq!(on_gateway.trace_id.len(), 16);
    assert_eq!(
        on_shard.trace_id, on_gateway.trace_id,
        "one trace across both processes"
    );
    assert_eq!(
        on_shard.parent_span_id, on_gateway.span_id,
        "the shard's span is a child of the gateway's"
    );
    // The shard's commits are traced too.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    create_session_and_chat(&client, "traced").await;
    while !collector
        .spans
        .lock()
        .iter()
        .any(|s| s.service == "ahp-relay-shard" && s.name == "ahp.commit")
    {
        assert!(tokio::time::Instant::now() < deadline, "no ahp.commit span");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.shutdown().await;
}
