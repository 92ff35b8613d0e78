//! The one mapping from Lathe's errors to gRPC status codes.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::error::{LatheError, StorageFault};

impl From<LatheError> for Status {
    fn from(error: LatheError) -> Self {
        let message = error.to_string();
        let mut status = match error_details(&error) {
            Some(details) => Status::with_error_details(code_of(&error), message, details),
            None => Status::new(code_of(&error), message),
        };
        if let Some(pushback) = retry_pushback(&error) {
            if let Ok(value) = pushback.parse() {
                status.metadata_mut().insert(RETRY_PUSHBACK, value);
            }
        }
        status
    }
}

/// The trailer by which a server steers a client's gRPC retry policy (gRFC A6): a delay in
/// milliseconds before the next attempt, or a negative value for "do not retry".
const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// A full queue asks to be retried after its delay; a write too large for a limit asks not to be
/// retried at all (the same RESOURCE_EXHAUSTED code, but no retry can succeed).
fn retry_pushback(error: &LatheError) -> Option<String> {
    match error {
        LatheError::QueueFull { retry_after, .. } => Some(retry_after.as_millis().to_string()),
        LatheError::TooLarge { .. } => Some("-1".to_string()),
        _ => None,
    }
}

/// Machine-readable details (google.rpc.ErrorInfo, RetryInfo) of the errors a client acts on:
/// a queued write names its operation, a full queue says when to retry.
fn error_details(error: &LatheError) -> Option<ErrorDetails> {
    match error {
        LatheError::WriteQueued {
            collection,
            operation_id,
            write_id,
            ..
        } => Some(ErrorDetails::with_error_info(
            "WRITE_QUEUED",
            ERROR_DOMAIN,
            [
                ("operation_id".to_string(), operation_id.to_string()),
                ("collection".to_string(), collection.clone()),
                ("write_id".to_string(), write_id.clone()),
            ],
        )),
        LatheError::WriteStored {
            collection,
            token,
            write_id,
            ..
        } => Some(ErrorDetails::with_error_info(
            "WRITE_STORED",
            ERROR_DOMAIN,
            [
                ("consistency_token".to_string(), token.to_string()),
                ("collection".to_string(), collection.clone()),
                ("write_id".to_string(), write_id.clone()),
            ],
        )),
        LatheError::QueueFull { retry_after, .. } => {
            let mut details = ErrorDetails::with_retry_info(Some(*retry_after));
            details.set_error_info("WRITE_QUEUE_FULL", ERROR_DOMAIN, []);
            Some(details)
        }
        _ => None,
    }
}

/// The domain of Lathe's ErrorInfo details.
pub const ERROR_DOMAIN: &str = "lathe";

fn code_of(error: &LatheError) -> Code {
    match error {
        LatheError::InvalidArgument { .. } => Code::InvalidArgument,
        LatheError::CollectionNotFound { .. } | LatheError::NotFound(_) => Code::NotFound,
        LatheError::CollectionExists { .. } | LatheError::AliasExists { .. } => Code::AlreadyExists,
        LatheError::TooLarge { .. } => Code::ResourceExhausted,
        LatheError::Overloaded(_) => Code::ResourceExhausted,
        // The write is stored and will be applied; the wait for it ran out.
        LatheError::WriteQueued { .. } | LatheError::WriteStored { .. } => Code::DeadlineExceeded,
        LatheError::QueueFull { .. } => Code::ResourceExhausted,
        LatheError::Unauthenticated(_) => Code::Unauthenticated,
        LatheError::PermissionDenied(_) => Code::PermissionDenied,
        LatheError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
        LatheError::Unavailable(_) => Code::Unavailable,
        // Retrying once NATS is back succeeds: writes are idempotent.
        LatheError::LogUnavailable { .. } => Code::Unavailable,
        LatheError::Precondition(_) => Code::FailedPrecondition,
        // gRPC's code for unrecoverable data loss or corruption: retrying cannot help.
        LatheError::CollectionDamaged { .. } => Code::DataLoss,
        // Not UNAVAILABLE (which tells clients to retry the call): the collection stays
        // offline until an operator restores the file and restarts the server.
        LatheError::CollectionOffline { .. } => Code::FailedPrecondition,
        LatheError::StorageRefused { source, .. } => match source.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                Code::ResourceExhausted
            }
            // Permissions, immutable or read-only folders: the state of the data dir must
            // change before a retry can succeed.
            _ => Code::FailedPrecondition,
        },
        // Refused at start, before any call is served; mapped for completeness.
        LatheError::DataDirLocked { .. } => Code::FailedPrecondition,
        // Disk full: retrying after space is freed succeeds, as for any exhausted resource.
        LatheError::Storage {
            fault: StorageFault::Full,
            ..
        } => Code::ResourceExhausted,
        // Retrying is useless until an operator changes the mount or the folder.
        LatheError::Storage {
            fault: StorageFault::ReadOnly | StorageFault::PermissionDenied,
            ..
        } => Code::FailedPrecondition,
        LatheError::Storage {
            fault: StorageFault::Other,
            ..
        } => Code::Unavailable,
        // Logged where the damage was found (once per finding), not once per request.
        LatheError::DataLoss { .. } | LatheError::SnapshotDamaged { .. } => Code::DataLoss,
        LatheError::IncompatibleIndex { .. } => Code::FailedPrecondition,
        LatheError::Index(_) | LatheError::Io { .. } | LatheError::Internal(_) => {
            tracing::error!(%error, "internal error");
            Code::Internal
        }
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

/// The HTTP status of a gRPC code on the HTTP/JSON port: the mapping of `google.rpc.Code`'s
/// documentation (and grpc-gateway's), CANCELLED as nginx's 499 "client closed request".
pub fn http_code(code: Code) -> http::StatusCode {
    use http::StatusCode as Http;
    match code {
        Code::Ok => Http::OK,
        Code::Cancelled => Http::from_u16(499).unwrap_or(Http::BAD_REQUEST),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => Http::BAD_REQUEST,
        Code::DeadlineExceeded => Http::GATEWAY_TIMEOUT,
        Code::NotFound => Http::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => Http::CONFLICT,
        Code::PermissionDenied => Http::FORBIDDEN,
        Code::Unauthenticated => Http::UNAUTHORIZED,
        Code::ResourceExhausted => Http::TOO_MANY_REQUESTS,
        Code::Unimplemented => Http::NOT_IMPLEMENTED,
        Code::Unavailable => Http::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => Http::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_become_their_documented_http_codes() {
        let http = |code| http_code(code).as_u16();
        assert_eq!(http(Code::InvalidArgument), 400);
        assert_eq!(http(Code::FailedPrecondition), 400);
        assert_eq!(http(Code::Unauthenticated), 401);
        assert_eq!(http(Code::PermissionDenied), 403);
        assert_eq!(http(Code::NotFound), 404);
        assert_eq!(http(Code::AlreadyExists), 409);
        assert_eq!(http(Code::ResourceExhausted), 429);
        assert_eq!(http(Code::Cancelled), 499);
        assert_eq!(http(Code::DataLoss), 500);
        assert_eq!(http(Code::Unimplemented), 501);
        assert_eq!(http(Code::Unavailable), 503);
        assert_eq!(http(Code::DeadlineExceeded), 504);
    }

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
    fn a_deadline_names_the_call_whose_deadline_and_its_length() {
        let server = Status::from(LatheError::DeadlineExceeded {
            call: "Retrieve".into(),
            limit: std::time::Duration::from_millis(250),
            set_by_client: false,
        });
        assert_eq!(server.code(), Code::DeadlineExceeded);
        assert_eq!(
            server.message(),
            "Retrieve did not finish within its deadline of 250 ms"
        );
        let client = Status::from(LatheError::DeadlineExceeded {
            call: "/lathe.v1.Lathe/Retrieve".into(),
            limit: std::time::Duration::from_millis(50),
            set_by_client: true,
        });
        assert_eq!(client.code(), Code::DeadlineExceeded);
        assert_eq!(
            client.message(),
            "/lathe.v1.Lathe/Retrieve did not finish within the client's deadline (grpc-timeout) of 50 ms"
        );
        // A write cut short says it may still be applied, and how to retry it safely.
        let write = Status::from(LatheError::DeadlineExceeded {
            call: "/lathe.v1.Lathe/UpsertDocuments".into(),
            limit: std::time::Duration::from_millis(50),
            set_by_client: true,
        });
        assert!(
            write.message().contains("may still be applied")
                && write.message().contains("same write_id"),
            "{}",
            write.message()
        );
    }

    fn storage(fault: StorageFault) -> LatheError {
        LatheError::Storage {
            collection: "docs".into(),
            path: "/data/collections/docs/index".into(),
            fault,
            cause: "No space left on device (os error 28)".into(),
        }
    }

    #[test]
    fn a_storage_error_names_the_collection_the_path_and_the_cause() {
        let status = Status::from(storage(StorageFault::Full));
        assert_eq!(
            status.message(),
            "collection `docs`: cannot write /data/collections/docs/index: the disk is full \
             (No space left on device (os error 28)); writes resume by themselves once space is freed"
        );
    }

    #[test]
    fn a_damaged_collection_is_named_with_its_file_and_cause() {
        let status = Status::from(LatheError::CollectionDamaged {
            name: "docs".into(),
            documents: Vec::new(),
            path: "/d/collections/docs/index/meta.json".into(),
            cause: "empty file".into(),
        });
        assert_eq!(status.code(), Code::DataLoss);
        assert!(
            status.message().starts_with(
                "collection `docs` is damaged: /d/collections/docs/index/meta.json: empty file;"
            ),
            "{}",
            status.message()
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
                LatheError::CollectionDamaged {
                    name: "x".into(),
                    documents: vec!["d".into()],
                    path: "/d/collections/x/collection.json".into(),
                    cause: "missing".into(),
                },
                Code::DataLoss,
            ),
            (
                LatheError::CollectionOffline {
                    name: "x".into(),
                    path: "/t/tokenizer.json".into(),
                    cause: "missing".into(),
                },
                Code::FailedPrecondition,
            ),
            (
                LatheError::StorageRefused {
                    name: "x".into(),
                    action: "renaming the folder".into(),
                    path: "/d/collections/x".into(),
                    source: std::io::Error::from_raw_os_error(1),
                },
                Code::FailedPrecondition,
            ),
            (
                LatheError::StorageRefused {
                    name: "x".into(),
                    action: "creating the folder".into(),
                    path: "/d/collections/.creating-x".into(),
                    source: std::io::Error::from_raw_os_error(28),
                },
                Code::ResourceExhausted,
            ),
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
            (storage(StorageFault::Full), Code::ResourceExhausted),
            (storage(StorageFault::ReadOnly), Code::FailedPrecondition),
            (
                storage(StorageFault::PermissionDenied),
                Code::FailedPrecondition,
            ),
            (storage(StorageFault::Other), Code::Unavailable),
        ];
        for (error, code) in cases {
            assert_eq!(Status::from(error).code(), code);
        }
    }
}
