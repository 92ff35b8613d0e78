//! What the catalog keeps of a collection besides its index: the rule its name follows and the
//! settings persisted in its `collection.json` (written and read by `folders`).

use serde::{Deserialize, Serialize};

/// 1 to 64 characters of `[A-Za-z0-9_-]`: safe as a folder name, never hidden, never a path.
pub fn is_valid_collection_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Per-collection settings as persisted in `collection.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSettings {
    pub budget_tokenizer: String,
    pub section_tokens: u32,
    pub default_strategy: Option<String>,
    pub default_max_tokens: Option<u32>,
    pub default_overlap_tokens: Option<u32>,
    /// With replication: the log position of the entry that created the collection (its
    /// incarnation: entries at or below it belong to an earlier collection of the name). Absent
    /// for a collection created on a single node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_created: Option<u64>,
}
