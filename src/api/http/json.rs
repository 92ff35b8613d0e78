//! Request messages from JSON (path and query parameters merged in, parse errors naming the
//! field), replies to JSON, and a status as its HTTP code and `google.rpc.Status`-shaped body.

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use tonic::Status;
use tonic_types::StatusExt;

use crate::error::LatheError;

/// The request message's JSON object: the body (an empty body is `{}`), then each path parameter
/// and, for a route without a body, each query parameter. A parameter fills its field; the body
/// may name the same field only with the same value.
pub fn request_object(
    body: &[u8],
    parameters: &[(&'static str, String)],
    query: Option<&str>,
) -> Result<Map<String, Value>, Status> {
    let mut object = if body.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        match parse_json(body)? {
            Value::Object(object) => object,
            _ => {
                return Err(invalid(
                    "body",
                    "must be a JSON object (the request message)",
                ))
            }
        }
    };
    for (name, value) in parameters {
        merge_parameter(&mut object, name, value, "path")?;
    }
    for (name, value) in query.map(query_pairs).unwrap_or_default() {
        merge_parameter(&mut object, &name, &value, "query")?;
    }
    Ok(object)
}

/// One line (or body) of JSON, its syntax error naming the line and column.
pub fn parse_json(text: &[u8]) -> Result<Value, Status> {
    serde_json::from_slice(text).map_err(|error| invalid("body", format!("is not JSON: {error}")))
}

fn merge_parameter(
    object: &mut Map<String, Value>,
    name: &str,
    value: &str,
    place: &str,
) -> Result<(), Status> {
    match object.get(name) {
        None => {
            object.insert(name.to_string(), Value::String(value.to_string()));
            Ok(())
        }
        Some(Value::String(same)) if same == value => Ok(()),
        Some(Value::Number(same)) if same.to_string() == value => Ok(()),
        Some(other) => Err(invalid(
            name,
            format!("is `{value}` in the {place} but {other} in the body; give it once, or the same in both"),
        )),
    }
}

/// `a=1&b=x%20y` → (`a`, `1`), (`b`, `x y`); `+` is a space, as in a form.
fn query_pairs(query: &str) -> Vec<(String, String)> {
    let decode = |text: &str| {
        let text = text.replace('+', " ");
        let mut bytes = Vec::with_capacity(text.len());
        let mut rest = text.as_bytes();
        while let Some((&first, tail)) = rest.split_first() {
            let escaped = (first == b'%')
                .then(|| tail.get(..2))
                .flatten()
                .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
            match escaped {
                Some(byte) => {
                    bytes.push(byte);
                    rest = &tail[2..];
                }
                None => {
                    bytes.push(first);
                    rest = tail;
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(name), decode(value))
        })
        .collect()
}

/// The request message from its JSON, in the proto3 JSON mapping; an error names the field by
/// its path in the JSON (`chunking.maxTokens`, `documents[1].format`).
pub fn decode<Message: DeserializeOwned>(object: Map<String, Value>) -> Result<Message, Status> {
    serde_path_to_error::deserialize(Value::Object(object)).map_err(|error| {
        let path = error.path().to_string();
        let field = if path == "." {
            "body".to_string()
        } else {
            path
        };
        invalid(&field, error.into_inner())
    })
}

/// INVALID_ARGUMENT in the form of every other: "invalid `field`: reason".
fn invalid(field: &str, reason: impl std::fmt::Display) -> Status {
    LatheError::invalid(field, reason).into()
}

/// 200 with the reply's JSON.
pub fn reply<Reply: Serialize>(reply: &Reply) -> Response {
    match serde_json::to_vec(reply) {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(error) => {
            status_response(&LatheError::internal(format!("writing JSON: {error}")).into())
        }
    }
}

fn json_response(code: StatusCode, body: Vec<u8>) -> Response {
    (
        code,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// A gRPC status as HTTP: its code's HTTP status (`status::http_code`), a body
/// `{"code", "message", "details"}` as google.rpc.Status writes it in JSON (details with their
/// `@type`), and `Retry-After` (whole seconds, rounded up) when the details ask for a delay.
pub fn status_response(status: &Status) -> Response {
    let details = status.get_error_details();
    let mut rendered = Vec::new();
    if let Some(info) = details.error_info() {
        rendered.push(serde_json::json!({
            "@type": tonic_types::ErrorInfo::TYPE_URL,
            "reason": info.reason,
            "domain": info.domain,
            "metadata": info.metadata,
        }));
    }
    let retry_delay = details.retry_info().and_then(|info| info.retry_delay);
    if let Some(delay) = retry_delay {
        rendered.push(serde_json::json!({
            "@type": tonic_types::RetryInfo::TYPE_URL,
            // google.protobuf.Duration in JSON: seconds with a fraction and an `s`.
            "retryDelay": format!("{}.{:03}s", delay.as_secs(), delay.subsec_millis()),
        }));
    }
    let body = serde_json::json!({
        "code": status.code() as i32,
        "message": status.message(),
        "details": rendered,
    });
    let mut response = json_response(
        super::super::status::http_code(status.code()),
        body.to_string().into_bytes(),
    );
    if let Some(delay) = retry_delay {
        let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_fill_fields_and_a_different_body_value_is_refused() {
        let object = request_object(
            br#"{"query": "lathes", "collection": "docs"}"#,
            &[("collection", "docs".to_string())],
            None,
        )
        .unwrap();
        assert_eq!(object["collection"], "docs");
        let refused = request_object(
            br#"{"collection": "other"}"#,
            &[("collection", "docs".to_string())],
            None,
        )
        .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(
            refused.message().starts_with("invalid `collection`"),
            "{refused:?}"
        );
        let object = request_object(b"", &[], Some("limit=5&collection=a%20b+c")).unwrap();
        assert_eq!(object["limit"], "5");
        assert_eq!(object["collection"], "a b c");
        let refused = request_object(b"[1]", &[], None).unwrap_err();
        assert!(refused.message().contains("`body`"), "{refused:?}");
    }

    #[test]
    fn a_parse_error_names_the_field_by_its_json_path() {
        let object = request_object(
            br#"{"collection": "c", "query": "q", "tokenBudget": -1}"#,
            &[],
            None,
        )
        .unwrap();
        let refused = decode::<lathe_proto::RetrieveRequest>(object).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(
            refused.message().starts_with("invalid `tokenBudget`: "),
            "{refused:?}"
        );
    }

    #[test]
    fn a_status_becomes_its_http_code_a_json_body_and_retry_after() {
        let queue_full = Status::from(LatheError::QueueFull {
            scope: "collection `c`".into(),
            queued: 10,
            bytes: 5,
            limit: 12,
            field: "max_queued_bytes",
            retry_after: std::time::Duration::from_millis(1500),
        });
        let response = status_response(&queue_full);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
    }
}
