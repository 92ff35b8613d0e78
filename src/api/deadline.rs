//! The client's `grpc-timeout`, answered with DEADLINE_EXCEEDED.
//!
//! tonic's transport server also honours `grpc-timeout` (even with no server timeout set), but
//! answers an expired call with CANCELLED "Timeout expired", which clients classify as "the caller
//! gave up", not "the deadline passed". So does tonic's client, with a timer of its own started
//! before the request left. This layer runs inside tonic's server and fires first: its deadline
//! is a twentieth of the timeout earlier (at least 1 ms, at most 50 ms; see [`answer_within`]),
//! so its answer is written before tonic's server timer fires (tokio timers have 1 ms resolution)
//! and reaches a client on the same network before the client's own timer does. A call that would
//! have finished in that last twentieth is cut; its client would not have had time to use it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic::Status;
use tower::{Layer, Service};

use crate::error::LatheError;

/// How long this layer lets a call with the client's `timeout` run before answering
/// DEADLINE_EXCEEDED: the timeout less a twentieth of it, that margin kept in 1..=50 ms.
pub fn answer_within(timeout: Duration) -> Duration {
    let margin = (timeout / 20).clamp(Duration::from_millis(1), Duration::from_millis(50));
    timeout.saturating_sub(margin)
}

/// The deadline of a unary call: the client's grpc-timeout when shorter than the server's.
pub(super) fn deadline(metadata: &MetadataMap, server_timeout: Duration) -> Duration {
    let client = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout);
    client.map_or(server_timeout, |client| client.min(server_timeout))
}

/// `grpc-timeout` is an integer of at most 8 digits and a unit: H, M, S, m, u or n.
pub(super) fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ClientDeadlineLayer;

impl<S> Layer<S> for ClientDeadlineLayer {
    type Service = ClientDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientDeadline { inner }
    }
}

#[derive(Clone, Debug)]
pub struct ClientDeadline<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, RequestBody, ResponseBody> Service<http::Request<RequestBody>> for ClientDeadline<S>
where
    S: Service<http::Request<RequestBody>, Response = http::Response<ResponseBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResponseBody: Default + Send + 'static,
{
    type Response = http::Response<ResponseBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        let client_timeout = request
            .headers()
            .get("grpc-timeout")
            .and_then(|value| value.to_str().ok())
            .and_then(parse_grpc_timeout);
        let path = request.uri().path().to_string();
        let response = self.inner.call(request);
        let Some(client_timeout) = client_timeout else {
            return Box::pin(response);
        };
        Box::pin(async move {
            let limit = answer_within(client_timeout);
            match tokio::time::timeout(limit, response).await {
                Ok(result) => result,
                Err(_) => Ok(Status::from(LatheError::DeadlineExceeded {
                    call: path,
                    limit: client_timeout,
                    set_by_client: true,
                })
                .into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_comes_a_twentieth_early_within_one_to_fifty_ms() {
        let ms = Duration::from_millis;
        assert_eq!(answer_within(ms(200)), ms(190));
        assert_eq!(answer_within(ms(10)), ms(9), "at least 1 ms early");
        assert_eq!(answer_within(ms(30_000)), ms(29_950), "at most 50 ms early");
        assert_eq!(answer_within(Duration::ZERO), Duration::ZERO);
        assert!(answer_within(ms(1)) < ms(1));
    }

    #[test]
    fn grpc_timeouts_parse_and_the_shorter_deadline_wins() {
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("12"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        let mut metadata = MetadataMap::new();
        metadata.insert("grpc-timeout", "100m".parse().unwrap());
        assert_eq!(
            deadline(&metadata, Duration::from_secs(30)),
            Duration::from_millis(100)
        );
        assert_eq!(
            deadline(&MetadataMap::new(), Duration::from_secs(30)),
            Duration::from_secs(30)
        );
    }
}
