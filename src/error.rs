//! The one error type of Lathe's service layer. Every variant maps to exactly one gRPC status in
//! `api::status`; messages are written for the caller and name the field and the allowed range.

use std::fmt;
use std::path::PathBuf;

pub type Result<T, E = LatheError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum LatheError {
    /// A request field is outside what Lathe accepts.
    #[error("invalid `{field}`: {reason}")]
    InvalidArgument { field: String, reason: String },
    #[error("collection `{name}` not found")]
    CollectionNotFound { name: String },
    /// Something other than a collection that the call named does not exist (an operation).
    #[error("{0}")]
    NotFound(String),
    #[error("collection `{name}` already exists")]
    CollectionExists { name: String },
    /// A name an alias holds (collections and aliases share one namespace).
    #[error("`{alias}` is already an alias (of collection `{collection}`); collections and aliases share one namespace")]
    AliasExists { alias: String, collection: String },
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
    /// A call's deadline passed before its work finished: the server's request timeout, or the
    /// shorter one the client set in `grpc-timeout`.
    #[error("{call} did not finish within {} of {} ms{}", deadline_owner(*.set_by_client), .limit.as_millis(), write_cut_short(.call))]
    DeadlineExceeded {
        /// The RPC (or its request path).
        call: String,
        limit: std::time::Duration,
        set_by_client: bool,
    },
    /// A write waited for (`wait`) was not visible within the call's deadline. It is in the
    /// write queue and will be applied: follow its operation, or send it again with the same
    /// write id (which queues nothing twice).
    #[error("the write is queued as operation {operation_id} of collection `{collection}` and will be applied, but was not visible within the call's deadline ({} ms); follow it with GetOperation or WaitOperation{}", .waited.as_millis(), retry_hint(.write_id))]
    WriteQueued {
        collection: String,
        operation_id: u64,
        write_id: String,
        waited: std::time::Duration,
    },
    /// On a replica, a write with `wait` the log stored but this replica did not apply within the
    /// call's deadline: it will be applied, on every replica.
    #[error("the write to collection `{collection}` is stored in the write log (consistency token {token}) and will be applied on every replica, but was not visible on this one within the call's deadline ({} ms); read it with that consistency_token{}", .waited.as_millis(), retry_hint(.write_id))]
    WriteStored {
        collection: String,
        token: u64,
        write_id: String,
        waited: std::time::Duration,
    },
    /// The write queue is at its bound: the write was not stored; retry after `retry_after`.
    #[error("{scope} holds {queued} bytes of writes waiting to be applied, and this write's {bytes} bytes would pass its limit of {limit} (ingest.{field}); nothing was stored: retry in {} s", .retry_after.as_secs())]
    QueueFull {
        scope: String,
        queued: u64,
        bytes: u64,
        limit: u64,
        field: &'static str,
        retry_after: std::time::Duration,
    },
    /// The server is shutting down or a background task is gone.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The replicated write log (NATS JetStream) cannot be reached or did not acknowledge in
    /// time: a write is not stored (or, for a batch, `stored` says what was). Reads go on.
    #[error("the write log at {url} is unavailable: {cause}{}; reads are served from this replica meanwhile", stored_part(.stored))]
    LogUnavailable {
        url: String,
        cause: String,
        /// What of the write the log stored before it failed, for a batch stored in part.
        stored: Option<String>,
    },
    /// A call needs a mode or state this server is not in (a consistency token on a single
    /// node, a write to a collection the log does not hold).
    #[error("{0}")]
    Precondition(String),
    /// A collection's own files are missing, truncated or garbled (found at open or later). Its
    /// folder is kept as it was found.
    #[error("collection `{name}` is damaged{}: {path}: {cause}; its files are kept as found: restore them from a backup and restart, or delete the collection", unserved(.documents))]
    CollectionDamaged {
        name: String,
        /// The documents the call asked for, which cannot be served (none when it named none).
        documents: Vec<String>,
        path: PathBuf,
        cause: String,
    },
    /// A collection cannot be opened for a cause outside its own folder (its tokenizer file is
    /// missing or unreadable); its data is intact.
    #[error("collection `{name}` is offline: {path}: {cause}; its data is intact: restore the file and restart the server")]
    CollectionOffline {
        name: String,
        path: PathBuf,
        cause: String,
    },
    /// The filesystem refused a change to a collection (create, delete); nothing was changed.
    #[error("collection `{name}`: {action} failed: {path}: {source}; nothing was changed")]
    StorageRefused {
        name: String,
        /// What was being done, e.g. "renaming the folder to .deleting-docs".
        action: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the data dir: one server per data dir.
    #[error("data dir {data_dir} is in use by another lathe process ({holder}): it holds the lock on {lock_file}; stop that process or choose another storage.data_dir")]
    DataDirLocked {
        data_dir: PathBuf,
        lock_file: PathBuf,
        /// "pid 1234, started …", as the holder wrote it into the lock file.
        holder: String,
    },
    /// Writing a collection's files failed for a reason outside Lathe: a full disk, a read-only
    /// filesystem, a folder Lathe may not write, or another I/O error. Reads go on meanwhile.
    #[error(
        "collection `{collection}`: cannot write {}: {} ({cause}){}",
        .path.display(),
        .fault.what(),
        .fault.advice()
    )]
    Storage {
        collection: String,
        /// The file or folder that could not be written.
        path: PathBuf,
        fault: StorageFault,
        /// The operating system's words, e.g. "No space left on device (os error 28)".
        cause: String,
    },
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
    /// A snapshot offered for a restore failed its checks: the file of the snapshot at fault and
    /// why. Nothing was created.
    #[error("snapshot `{snapshot}` cannot be restored: `{file}`: {cause}; nothing was created")]
    SnapshotDamaged {
        snapshot: String,
        file: String,
        cause: String,
    },
    /// The collection's index was written in a format this build does not read.
    #[error("collection `{collection}` cannot be opened: {reason}")]
    IncompatibleIndex { collection: String, reason: String },
    /// A bug or an unexpected state: never the caller's fault.
    #[error("internal error: {0}")]
    Internal(String),
}

fn retry_hint(write_id: &str) -> String {
    match write_id {
        "" => String::new(),
        id => format!(" (a retry with write_id `{id}` queues nothing twice)"),
    }
}

/// What a write cut short by its deadline may have done, and how to retry it safely.
fn write_cut_short(call: &str) -> &'static str {
    let write = ["UpsertDocuments", "UploadDocuments", "DeleteDocuments"]
        .iter()
        .any(|rpc| call.ends_with(rpc));
    if write {
        "; the write may still be applied: send it again with the same write_id, which applies it once"
    } else {
        ""
    }
}

fn stored_part(stored: &Option<String>) -> String {
    match stored {
        Some(stored) => format!(" ({stored})"),
        None => String::new(),
    }
}

/// Why a collection's files could not be written (see [`LatheError::Storage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageFault {
    /// ENOSPC or EDQUOT: no space (or quota) left.
    Full,
    /// EROFS: the filesystem is mounted read-only.
    ReadOnly,
    /// EACCES or EPERM: the folder's mode, owner or attributes (`chattr +i`) forbid writing.
    PermissionDenied,
    /// Any other I/O error (EIO, ...).
    Other,
}

impl StorageFault {
    pub fn of(error: &std::io::Error) -> Self {
        use std::io::ErrorKind;
        match error.kind() {
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded => Self::Full,
            ErrorKind::ReadOnlyFilesystem => Self::ReadOnly,
            ErrorKind::PermissionDenied => Self::PermissionDenied,
            _ => Self::Other,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Self::Full => "the disk is full",
            Self::ReadOnly => "the filesystem is read-only",
            Self::PermissionDenied => "permission denied",
            Self::Other => "I/O error",
        }
    }

    fn advice(self) -> &'static str {
        match self {
            Self::Full => "; writes resume by themselves once space is freed",
            Self::ReadOnly => "; writes resume once it is mounted read-write",
            Self::PermissionDenied => {
                "; writes resume once Lathe's user may write the folder (check its owner, mode \
                 and attributes such as chattr +i)"
            }
            Self::Other => "",
        }
    }
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

/// " (document `a` cannot be served)" for the documents a call to a damaged collection named.
fn deadline_owner(set_by_client: bool) -> &'static str {
    if set_by_client {
        "the client's deadline (grpc-timeout)"
    } else {
        "its deadline"
    }
}

fn unserved(documents: &[String]) -> String {
    match documents {
        [] => String::new(),
        [document] => format!(" (document `{document}` cannot be served)"),
        documents => format!(" (documents `{}` cannot be served)", documents.join("`, `")),
    }
}

impl From<lathe_text::error::TextError> for LatheError {
    /// A tokenizer that cannot be named or loaded, field and reason as the text crate gave them.
    fn from(error: lathe_text::error::TextError) -> Self {
        match error {
            lathe_text::error::TextError::InvalidArgument { field, reason } => {
                Self::InvalidArgument { field, reason }
            }
            lathe_text::error::TextError::Internal(message) => Self::Internal(message),
        }
    }
}

impl LatheError {
    /// Names `documents` (those a call asked for) in an error saying the collection's data is
    /// damaged; any other error is returned as it is.
    pub fn naming_documents(self, documents: &[String]) -> Self {
        match self {
            Self::CollectionDamaged {
                name,
                path,
                cause,
                documents: named,
            } if named.is_empty() => Self::CollectionDamaged {
                name,
                documents: documents.to_vec(),
                path,
                cause,
            },
            Self::DataLoss {
                collection,
                documents: named,
                detail,
            } if named.is_empty() => Self::DataLoss {
                collection,
                documents: documents.to_vec(),
                detail,
            },
            other => other,
        }
    }

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

    /// A copy for each of several callers waiting on one failed operation. Storage errors keep
    /// their kind; the others (which hold non-cloneable sources) become UNAVAILABLE with the same
    /// message.
    pub fn for_another_caller(&self) -> Self {
        match self {
            Self::Storage {
                collection,
                path,
                fault,
                cause,
            } => Self::Storage {
                collection: collection.clone(),
                path: path.clone(),
                fault: *fault,
                cause: cause.clone(),
            },
            other => Self::Unavailable(other.to_string()),
        }
    }
}
