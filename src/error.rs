//! The one error type of Lathe's service layer. Every variant maps to exactly one gRPC status in
//! `api::status`; messages are written for the caller and name the field and the allowed range.

use std::fmt;

pub type Result<T, E = LatheError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum LatheError {
    /// A request field is outside what Lathe accepts.
    #[error("invalid `{field}`: {reason}")]
    InvalidArgument { field: String, reason: String },
    #[error("collection `{name}` not found")]
    CollectionNotFound { name: String },
    #[error("collection `{name}` already exists")]
    CollectionExists { name: String },
    /// A request larger than a configured limit (message, document or batch size).
    #[error("{what} is too large: {size} exceeds the limit of {limit}")]
    TooLarge { what: String, size: u64, limit: u64 },
    /// The server is at its concurrency limit and sheds the request instead of queueing it.
    #[error("server overloaded: {0}")]
    Overloaded(String),
    /// No valid credentials were presented.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The credentials do not allow this call.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The caller's deadline passed before the work finished.
    #[error("deadline exceeded during {stage}")]
    DeadlineExceeded { stage: &'static str },
    /// The server is shutting down or a background task is gone.
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("index error: {0}")]
    Index(#[from] tantivy::TantivyError),
    #[error("storage error: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Stored data failed verification (a file's checksum, a section's checksum, or a stored
    /// section that does not decode): the data cannot be returned as it was written. `documents`
    /// names the documents concerned when they are known (empty when the whole collection is).
    #[error("{}", data_loss_message(collection, documents, detail))]
    DataLoss {
        collection: String,
        documents: Vec<String>,
        detail: String,
    },
    /// The collection's index was written in a format this build does not read.
    #[error("collection `{collection}` cannot be opened: {reason}")]
    IncompatibleIndex { collection: String, reason: String },
    /// A bug or an unexpected state: never the caller's fault.
    #[error("internal error: {0}")]
    Internal(String),
}

fn data_loss_message(collection: &str, documents: &[String], detail: &str) -> String {
    let what = match documents {
        [] => format!("collection `{collection}`"),
        [document] => format!("collection `{collection}`, document `{document}`"),
        documents => format!(
            "collection `{collection}`, documents `{}`",
            documents.join("`, `")
        ),
    };
    format!("data loss in {what}: {detail}")
}

impl LatheError {
    pub fn invalid(field: impl Into<String>, reason: impl fmt::Display) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.to_string(),
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    pub fn internal(message: impl fmt::Display) -> Self {
        Self::Internal(message.to_string())
    }
}
