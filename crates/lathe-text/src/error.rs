//! The text crate's one error: a tokenizer that cannot be named or loaded. The server turns it
//! into its own `LatheError` (the field and the reason are kept as they are).

pub type Result<T, E = TextError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A setting names a tokenizer that does not exist or cannot be read.
    #[error("invalid `{field}`: {reason}")]
    InvalidArgument { field: String, reason: String },
    /// A tokenizer library call failed in a way no input explains.
    #[error("internal error: {0}")]
    Internal(String),
}

impl TextError {
    pub fn invalid(field: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.to_string(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal(message.into())
    }
}
