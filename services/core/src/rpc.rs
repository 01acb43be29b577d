//! JSON-RPC 2.0 framing: reading the envelope of an inbound frame and writing outbound frames.
//!
//! The gateway only ever looks at the envelope (`id`, `method`, `params.channel`); the params stay raw JSON
//! until the shard parses them into `ahp-types` command types. Outbound frames are serialized once, to
//! [`Bytes`], and those same bytes go to every connection that receives them.

use ahp_types::errors::{ahp_error_codes, json_rpc_error_codes};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

/// A JSON-RPC error object, as sent on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("JSON-RPC error {code}: {message}")]
pub struct RpcError {
    pub code: i32,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
    pub fn parse(message: impl Into<String>) -> Self {
        Self::new(json_rpc_error_codes::PARSE_ERROR, message)
    }
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(json_rpc_error_codes::INVALID_REQUEST, message)
    }
    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            json_rpc_error_codes::METHOD_NOT_FOUND,
            format!("method not found: {method}"),
        )
    }
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(json_rpc_error_codes::INVALID_PARAMS, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(json_rpc_error_codes::INTERNAL_ERROR, message)
    }
    pub fn session_not_found(uri: &str) -> Self {
        Self::new(
            ahp_error_codes::SESSION_NOT_FOUND,
            format!("session not found: {uri}"),
        )
    }
    pub fn not_found(uri: &str) -> Self {
        Self::new(ahp_error_codes::NOT_FOUND, format!("not found: {uri}"))
    }
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ahp_error_codes::PERMISSION_DENIED, message)
    }
}

/// The envelope of one inbound request or notification.
#[derive(Debug)]
pub struct InboundMessage {
    /// `Some` for a request, `None` for a notification.
    pub id: Option<u64>,
    pub method: String,
    pub params: Option<Box<RawValue>>,
}

impl InboundMessage {
    /// `params.channel`, if the params are an object carrying a string `channel`.
    pub fn channel(&self) -> Option<String> {
        #[derive(Deserialize)]
        struct ChannelOnly {
            channel: Option<String>,
        }
        let params = self.params.as_ref()?;
        serde_json::from_str::<ChannelOnly>(params.get())
            .ok()
            .and_then(|c| c.channel)
    }

    /// Deserialize the params into a command's params type, or an `InvalidParams` error naming what is wrong.
    pub fn parse_params<T: serde::de::DeserializeOwned>(&self) -> Result<T, RpcError> {
        let raw = self.params.as_ref().map(|p| p.get()).unwrap_or("null");
        serde_json::from_str(raw)
            .map_err(|e| RpcError::invalid_params(format!("invalid params for {}: {e}", self.method)))
    }
}

/// Why an inbound frame could not be read as a JSON-RPC message. Each maps to an error response with the
/// request id when one could be read, `null` otherwise.
#[derive(Debug)]
pub struct FrameRejection {
    pub id: Option<u64>,
    pub error: RpcError,
}

/// The nesting depth of a JSON text (arrays and objects), counted without parsing it, so that hostile
/// nesting is refused before any recursive parser sees it.
pub fn json_depth(text: &[u8]) -> usize {
    let mut depth = 0usize;
    let mut max = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Read the envelope of one inbound frame.
pub fn read_frame(text: &[u8], max_depth: usize) -> Result<InboundMessage, FrameRejection> {
    #[derive(Deserialize)]
    struct Envelope {
        jsonrpc: Option<Value>,
        #[serde(default, deserialize_with = "present")]
        id: Option<Value>,
        method: Option<Value>,
        params: Option<Box<RawValue>>,
    }
    fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
        Value::deserialize(d).map(Some)
    }
    let reject = |id, error| FrameRejection { id, error };

    if json_depth(text) > max_depth {
        return Err(reject(
            None,
            RpcError::invalid_request(format!("JSON nested deeper than {max_depth} levels")),
        ));
    }
    let value: Box<RawValue> = serde_json::from_slice(text)
        .map_err(|e| reject(None, RpcError::parse(format!("parse error: {e}"))))?;
    let envelope: Envelope = match serde_json::from_str(value.get()) {
        Ok(e) => e,
        Err(_) => {
            return Err(reject(
                None,
                RpcError::invalid_request("a JSON-RPC message must be a JSON object"),
            ))
        }
    };
    let id = match envelope.id {
        None => None,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(id) => Some(id),
            None => {
                return Err(reject(
                    None,
                    RpcError::invalid_request("id must be a non-negative integer"),
                ))
            }
        },
        Some(_) => {
            return Err(reject(
                None,
                RpcError::invalid_request("id must be a non-negative integer"),
            ))
        }
    };
    if envelope.jsonrpc != Some(Value::String("2.0".into())) {
        return Err(reject(id, RpcError::invalid_request("jsonrpc must be \"2.0\"")));
    }
    let method = match envelope.method {
        Some(Value::String(m)) => m,
        Some(_) => return Err(reject(id, RpcError::invalid_request("method must be a string"))),
        None => {
            return Err(reject(
                id,
                RpcError::invalid_request("not a request or notification: no method"),
            ))
        }
    };
    Ok(InboundMessage {
        id,
        method,
        params: envelope.params,
    })
}

/// Whether a frame is a response (it has `result` or `error` and no `method`): clients answer server requests
/// this way. The relay sends no server requests, so responses are dropped without an answer.
pub fn is_response(text: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        method: Option<serde::de::IgnoredAny>,
        result: Option<serde::de::IgnoredAny>,
        error: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Probe>(text)
        .map(|p| p.method.is_none() && (p.result.is_some() || p.error.is_some()))
        .unwrap_or(false)
}

/// Whether a response frame is an error (it has `error`, and no `result`).
pub fn is_error(frame: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        result: Option<serde::de::IgnoredAny>,
        error: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Probe>(frame)
        .map(|p| p.error.is_some() && p.result.is_none())
        .unwrap_or(false)
}

/// `{"jsonrpc":"2.0","id":…,"result":…}`.
pub fn result_frame<T: Serialize + ?Sized>(id: u64, result: &T) -> Result<Bytes, serde_json::Error> {
    #[derive(Serialize)]
    struct Out<'a, T: ?Sized> {
        jsonrpc: &'static str,
        id: u64,
        result: &'a T,
    }
    serde_json::to_vec(&Out {
        jsonrpc: "2.0",
        id,
        result,
    })
    .map(Bytes::from)
}

/// `{"jsonrpc":"2.0","id":…|null,"error":{…}}`.
pub fn error_frame(id: Option<u64>, error: &RpcError) -> Bytes {
    #[derive(Serialize)]
    struct Out<'a> {
        jsonrpc: &'static str,
        id: Option<u64>,
        error: &'a RpcError,
    }
    // Serializing plain strings, integers and a `Value` cannot fail.
    serde_json::to_vec(&Out {
        jsonrpc: "2.0",
        id,
        error,
    })
    .map(Bytes::from)
    .unwrap_or_else(|_| {
        Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"internal error"}}"#,
        )
    })
}

/// `{"jsonrpc":"2.0","method":…,"params":…}`.
pub fn notification_frame<T: Serialize + ?Sized>(
    method: &str,
    params: &T,
) -> Result<Bytes, serde_json::Error> {
    #[derive(Serialize)]
    struct Out<'a, T: ?Sized> {
        jsonrpc: &'static str,
        method: &'a str,
        params: &'a T,
    }
    serde_json::to_vec(&Out {
        jsonrpc: "2.0",
        method,
        params,
    })
    .map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_ignores_brackets_inside_strings() {
        assert_eq!(json_depth(br#"{"a":"[[[[{{{{"}"#), 1);
        assert_eq!(json_depth(br#"[[["\"]]]]"]]]"#), 3);
        assert_eq!(json_depth(b"1"), 0);
    }

    #[test]
    fn reads_request_envelope_and_channel() {
        let m = read_frame(
            br#"{"jsonrpc":"2.0","id":7,"method":"subscribe","params":{"channel":"ahp-chat:/x","view":{}}}"#,
            64,
        )
        .expect("valid");
        assert_eq!(m.id, Some(7));
        assert_eq!(m.method, "subscribe");
        assert_eq!(m.channel().as_deref(), Some("ahp-chat:/x"));
    }

    #[test]
    fn rejects_malformed_frames_with_the_right_codes() {
        let cases: &[(&[u8], i32, Option<u64>)] = &[
            (b"{not json", -32700, None),
            (b"[1,2]", -32600, None),
            (br#"{"jsonrpc":"2.0","id":"x","method":"ping"}"#, -32600, None),
            (br#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#, -32600, Some(3)),
            (br#"{"jsonrpc":"2.0","id":4,"method":5}"#, -32600, Some(4)),
            (br#"{"jsonrpc":"2.0","id":5}"#, -32600, Some(5)),
        ];
        for (text, code, id) in cases {
            let r = read_frame(text, 64).expect_err("must be rejected");
            assert_eq!(r.error.code, *code, "{}", String::from_utf8_lossy(text));
            assert_eq!(r.id, *id);
        }
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(
            read_frame(deep.as_bytes(), 64).expect_err("deep").error.code,
            -32600
        );
    }

    #[test]
    fn frames_round_trip_as_json_rpc() {
        let f = result_frame(3, &serde_json::json!({"a":1})).expect("serializes");
        let v: Value = serde_json::from_slice(&f).expect("json");
        assert_eq!(v["id"], 3);
        assert_eq!(v["result"]["a"], 1);
        let e = error_frame(None, &RpcError::method_not_found("nope"));
        let v: Value = serde_json::from_slice(&e).expect("json");
        assert!(v["id"].is_null());
        assert_eq!(v["error"]["code"], -32601);
    }
}
