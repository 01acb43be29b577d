//! Trace context over the internal gRPC: the gateway's current span travels to the shard as W3C
//! `traceparent` / `tracestate` request metadata, so the shard's span for a call is a child of the gateway's
//! `ahp.call` span in one distributed trace (design §7). Never as fields of the proto messages.
//!
//! Both sides go through the process's global text-map propagator: the relay installs the W3C one only when
//! OpenTelemetry export is configured; otherwise it is a no-op and nothing is injected or extracted.

use opentelemetry::propagation::{Extractor, Injector};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// `message` as a request carrying the current span's trace context in its metadata.
pub fn traced<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut MetadataInjector(request.metadata_mut()));
    });
    request
}

/// The shard's `ahp.shard.call` span for a `Call` request (fields `method` and `host`, recorded once the frame
/// is read), continuing the caller's trace.
pub fn call_span<T>(request: &tonic::Request<T>) -> tracing::Span {
    let span = tracing::info_span!(
        "ahp.shard.call",
        method = tracing::field::Empty,
        host = tracing::field::Empty
    );
    continue_trace(&span, request.metadata());
    span
}

/// Make `span` a child of the trace context the caller sent in `metadata` (if any).
pub fn continue_trace(span: &tracing::Span, metadata: &MetadataMap) {
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&MetadataExtractor(metadata))
    });
    // Fails only when no OpenTelemetry layer is installed: then there is no trace to continue.
    let _ = span.set_parent(parent);
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let key = MetadataKey::from_bytes(key.to_ascii_lowercase().as_bytes());
        let value = MetadataValue::try_from(value.as_str());
        if let (Ok(key), Ok(value)) = (key, value) {
            self.0.insert(key, value);
        }
    }
}

struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}
