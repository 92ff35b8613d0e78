//! API keys: `authorization: Bearer <key>`, each key scoped read-only or read-write. Keys are
//! held only as hashes and never logged.

use std::collections::HashMap;
use std::path::Path;

use tonic::metadata::MetadataMap;

use crate::error::{LatheError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    ReadOnly,
    ReadWrite,
}

pub struct ApiKeys {
    /// blake3 of each key → its scope.
    keys: HashMap<[u8; 32], Scope>,
}

impl ApiKeys {
    /// Reads `<scope> <key>` lines; `#` starts a comment line.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            LatheError::io(format!("reading auth.api_keys_file {}", path.display()), e)
        })?;
        Self::parse(&text).map_err(|reason| {
            LatheError::invalid(
                "auth.api_keys_file",
                format!("{}: {reason}", path.display()),
            )
        })
    }

    fn parse(text: &str) -> std::result::Result<Self, String> {
        let mut keys = HashMap::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (scope, key) = line
                .split_once(char::is_whitespace)
                .ok_or_else(|| format!("line {}: expected `<scope> <key>`", number + 1))?;
            let scope = match scope {
                "read-only" => Scope::ReadOnly,
                "read-write" => Scope::ReadWrite,
                other => {
                    return Err(format!(
                        "line {}: unknown scope `{other}`: expected read-only or read-write",
                        number + 1
                    ))
                }
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(format!("line {}: empty key", number + 1));
            }
            keys.insert(*blake3::hash(key.as_bytes()).as_bytes(), scope);
        }
        if keys.is_empty() {
            return Err("no keys: remove the setting to run without authentication".into());
        }
        Ok(Self { keys })
    }

    pub fn check(&self, metadata: &MetadataMap, access: Access, rpc: &str) -> Result<()> {
        let header = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                LatheError::Unauthenticated("missing `authorization: Bearer <key>` metadata".into())
            })?;
        let key = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or_else(|| {
                LatheError::Unauthenticated(
                    "the authorization metadata must be `Bearer <key>`".into(),
                )
            })?;
        match self
            .keys
            .get(blake3::hash(key.trim().as_bytes()).as_bytes())
        {
            None => Err(LatheError::Unauthenticated("invalid API key".into())),
            Some(Scope::ReadOnly) if access == Access::Write => Err(LatheError::PermissionDenied(
                format!("{rpc} writes: this API key is read-only"),
            )),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(value: &str) -> MetadataMap {
        let mut map = MetadataMap::new();
        map.insert("authorization", value.parse().unwrap());
        map
    }

    #[test]
    fn keys_are_scoped() {
        let keys = ApiKeys::parse("# comment\nread-write rw\nread-only ro\n").unwrap();
        assert!(keys
            .check(&metadata("Bearer rw"), Access::Write, "UpsertDocuments")
            .is_ok());
        assert!(keys
            .check(&metadata("Bearer ro"), Access::Read, "Retrieve")
            .is_ok());
        assert!(matches!(
            keys.check(&metadata("Bearer ro"), Access::Write, "UpsertDocuments"),
            Err(LatheError::PermissionDenied(_))
        ));
        assert!(matches!(
            keys.check(&metadata("Bearer nope"), Access::Read, "Retrieve"),
            Err(LatheError::Unauthenticated(_))
        ));
        assert!(matches!(
            keys.check(&MetadataMap::new(), Access::Read, "Retrieve"),
            Err(LatheError::Unauthenticated(_))
        ));
    }

    #[test]
    fn bad_files_are_rejected_with_the_line() {
        assert!(ApiKeys::parse("admin k")
            .err()
            .is_some_and(|e| e.contains("line 1")));
        assert!(ApiKeys::parse("# only comments\n").is_err());
    }

    #[test]
    fn error_messages_never_contain_the_key() {
        let keys = ApiKeys::parse("read-only secret-value\n").unwrap();
        let error = keys
            .check(
                &metadata("Bearer secret-value"),
                Access::Write,
                "DeleteDocuments",
            )
            .unwrap_err();
        assert!(!error.to_string().contains("secret-value"));
        let error = keys
            .check(&metadata("Bearer other-secret"), Access::Read, "Retrieve")
            .unwrap_err();
        assert!(!error.to_string().contains("other-secret"));
    }
}
