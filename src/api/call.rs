//! One admitted call ([`Call`], made by `GrpcAdapter::admit`): it holds its place under the
//! concurrency limit and records its outcome in the request metrics when it ends, however it ends.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::OwnedSemaphorePermit;
use tonic::Status;

use crate::telemetry::Metrics;

/// One admitted call: holds its concurrency permit and records its outcome when it ends.
pub(super) struct Call {
    rpc: &'static str,
    started: Instant,
    metrics: Arc<Metrics>,
    _permit: OwnedSemaphorePermit,
    finished: bool,
}

impl Call {
    /// A call admitted now, under `permit`; counted in flight until it is dropped.
    pub(super) fn new(
        rpc: &'static str,
        metrics: Arc<Metrics>,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        metrics.in_flight.inc();
        Self {
            rpc,
            started: Instant::now(),
            metrics,
            _permit: permit,
            finished: false,
        }
    }

    pub(super) fn finish<T>(mut self, result: Result<T, Status>) -> Result<T, Status> {
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        self.record(code);
        self.finished = true;
        result
    }

    fn record(&self, code: tonic::Code) {
        self.metrics
            .requests
            .with_label_values(&[self.rpc, code_label(code)])
            .inc();
        self.metrics
            .request_seconds
            .with_label_values(&[self.rpc])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
        if !self.finished {
            // The client went away (or its deadline passed) while the call was being served.
            self.record(tonic::Code::Cancelled);
        }
    }
}

pub(super) fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
