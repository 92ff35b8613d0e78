//! The one mapping from Lathe's errors to gRPC status codes.

use tonic::{Code, Status};

use crate::error::LatheError;

impl From<LatheError> for Status {
    fn from(error: LatheError) -> Self {
        let message = error.to_string();
        let code = match &error {
            LatheError::InvalidArgument { .. } => Code::InvalidArgument,
            LatheError::CollectionNotFound { .. } => Code::NotFound,
            LatheError::CollectionExists { .. } => Code::AlreadyExists,
            LatheError::TooLarge { .. } => Code::ResourceExhausted,
            LatheError::Overloaded(_) => Code::ResourceExhausted,
            LatheError::Unauthenticated(_) => Code::Unauthenticated,
            LatheError::PermissionDenied(_) => Code::PermissionDenied,
            LatheError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            LatheError::Unavailable(_) => Code::Unavailable,
            // Logged where the damage was found (once per finding), not once per request.
            LatheError::DataLoss { .. } => Code::DataLoss,
            LatheError::IncompatibleIndex { .. } => Code::FailedPrecondition,
            LatheError::Index(_) | LatheError::Io { .. } | LatheError::Internal(_) => {
                tracing::error!(%error, "internal error");
                Code::Internal
            }
        };
        Status::new(code, message)
    }
}

/// tonic answers a message over the size limit with OUT_OF_RANGE; gRPC's convention (and grpc-go,
/// grpc-java) is RESOURCE_EXHAUSTED, which is what clients retry-classify on.
pub fn is_oversized_message(status: &Status) -> bool {
    status.code() == Code::OutOfRange && status.message().contains("message length too large")
}

pub fn oversized_to_resource_exhausted(status: Status) -> Status {
    if is_oversized_message(&status) {
        Status::resource_exhausted(status.message().to_string())
    } else {
        status
    }
}

/// Rewrites the trailers-only answer tonic sends for an oversized request message (see
/// [`is_oversized_message`]); applied as a tower layer around every service.
pub fn rewrite_oversized_response<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers_mut();
    let oversized = headers
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() == b"11")
        && headers.get("grpc-message").is_some_and(|v| {
            String::from_utf8_lossy(v.as_bytes()).contains("message%20length%20too%20large")
                || String::from_utf8_lossy(v.as_bytes()).contains("message length too large")
        });
    if oversized {
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_argument_names_the_field_and_range() {
        let status = Status::from(LatheError::invalid(
            "top_k",
            "is 0; the allowed range is 1..=100",
        ));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "invalid `top_k`: is 0; the allowed range is 1..=100"
        );
    }

    #[test]
    fn data_loss_names_the_collection_and_the_documents() {
        let status = Status::from(LatheError::DataLoss {
            collection: "wiki".into(),
            documents: vec!["Super_Bowl_50".into()],
            detail: "its stored section fails its checksum".into(),
        });
        assert_eq!(status.code(), Code::DataLoss);
        assert_eq!(
            status.message(),
            "data loss in collection `wiki`, document `Super_Bowl_50`: its stored section fails \
             its checksum"
        );
        let whole = Status::from(LatheError::DataLoss {
            collection: "wiki".into(),
            documents: Vec::new(),
            detail: "index file `a.store` fails its checksum".into(),
        });
        assert!(whole
            .message()
            .starts_with("data loss in collection `wiki`: index file `a.store`"));
    }

    #[test]
    fn each_error_kind_has_its_code() {
        let cases = [
            (
                LatheError::CollectionNotFound { name: "x".into() },
                Code::NotFound,
            ),
            (
                LatheError::CollectionExists { name: "x".into() },
                Code::AlreadyExists,
            ),
            (
                LatheError::TooLarge {
                    what: "documents[0].text".into(),
                    size: 2,
                    limit: 1,
                },
                Code::ResourceExhausted,
            ),
            (
                LatheError::Overloaded("busy".into()),
                Code::ResourceExhausted,
            ),
            (LatheError::Unavailable("gone".into()), Code::Unavailable),
            (
                LatheError::DataLoss {
                    collection: "c".into(),
                    documents: vec!["d".into()],
                    detail: "checksum mismatch".into(),
                },
                Code::DataLoss,
            ),
            (
                LatheError::IncompatibleIndex {
                    collection: "c".into(),
                    reason: "old".into(),
                },
                Code::FailedPrecondition,
            ),
            (LatheError::internal("bug"), Code::Internal),
        ];
        for (error, code) in cases {
            assert_eq!(Status::from(error).code(), code);
        }
    }
}
