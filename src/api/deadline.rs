//! The client's `grpc-timeout`, answered with DEADLINE_EXCEEDED.
//!
//! tonic's transport server also honours `grpc-timeout` (even with no server timeout set), but
//! answers an expired call with CANCELLED "Timeout expired", which clients classify as "the caller
//! gave up", not "the deadline passed". This layer runs inside tonic's and fires first: its
//! deadline is 1 ms earlier (tokio timers have 1 ms resolution, so it can never land in a later
//! tick than tonic's), and tonic polls the inner future before its own timer, so when both are
//! due in one tick this one's answer wins.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::Status;
use tower::{Layer, Service};

use super::grpc::parse_grpc_timeout;
use crate::error::LatheError;

/// Margin by which this layer's deadline precedes tonic's.
const AHEAD_OF_TONIC: Duration = Duration::from_millis(1);

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
            let limit = client_timeout.saturating_sub(AHEAD_OF_TONIC);
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
