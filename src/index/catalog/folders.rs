//! The collections folder of a data dir, as the catalog lays it out (see the module doc of
//! `index`): the names of what is in it, how each entry found at open is sorted, the leftovers
//! of a crash removed, and the settings file written and read.

use std::path::Path;

use super::fault::Fault;
use super::settings::{is_valid_collection_name, StoredSettings};
use crate::error::{LatheError, Result};

pub(super) const COLLECTIONS_DIR: &str = "collections";
pub(super) const SETTINGS_FILE: &str = "collection.json";
pub(super) const INDEX_DIR: &str = "index";
pub(super) const CREATING_PREFIX: &str = ".creating-";
pub(super) const DELETING_PREFIX: &str = ".deleting-";

/// What `open` finds in the collections folder.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found {
    Collection(String),
    /// A staging folder of this catalog left behind by a crash: an unfinished create (never
    /// acknowledged) or an unfinished delete (already renamed away, so already gone).
    Leftover,
    /// Not made by the catalog: kept as it is.
    Unknown(&'static str),
}

/// Sorts one entry of the collections folder (see [`Found`]).
pub(super) fn classify(item: &std::fs::DirEntry) -> Found {
    let file_name = item.file_name();
    let Some(name) = file_name.to_str() else {
        return Found::Unknown("the name is not UTF-8");
    };
    let path = item.path();
    // A collection folder may be a symlink to another disk; staging folders never are.
    let real_folder = item.file_type().is_ok_and(|t| t.is_dir());
    if is_valid_collection_name(name) {
        return if path.is_dir() {
            Found::Collection(name.to_string())
        } else {
            Found::Unknown("a file where a collection folder would be")
        };
    }
    if let Some(of) = name.strip_prefix(DELETING_PREFIX) {
        if is_valid_collection_name(of) && real_folder {
            return Found::Leftover;
        }
    }
    if let Some(of) = name.strip_prefix(CREATING_PREFIX) {
        if is_valid_collection_name(of) && real_folder {
            return if holds_only_what_create_writes(&path) {
                Found::Leftover
            } else {
                Found::Unknown("a staging folder holding files a create never writes")
            };
        }
    }
    Found::Unknown("neither a collection name nor a staging folder of this server")
}

/// The collections in the collections folder `root`, by name; the leftovers of a crash are
/// removed on the way, and whatever else is there is logged and left as it is.
pub(super) fn collection_names(root: &Path) -> Result<Vec<String>> {
    let listing = std::fs::read_dir(root)
        .map_err(|e| LatheError::io(format!("listing {}", root.display()), e))?;
    let mut names = Vec::new();
    for item in listing {
        let item = item.map_err(|e| LatheError::io(format!("listing {}", root.display()), e))?;
        let path = item.path();
        match classify(&item) {
            Found::Collection(name) => names.push(name),
            Found::Leftover => remove_leftover(&path),
            Found::Unknown(why) => {
                tracing::warn!(path = %path.display(), why, "not a collection; left as it is")
            }
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// A create writes `collection.json` and `index/` into its staging folder, nothing else.
pub(super) fn holds_only_what_create_writes(staging: &Path) -> bool {
    let Ok(listing) = std::fs::read_dir(staging) else {
        return false;
    };
    listing.into_iter().all(|item| {
        item.is_ok_and(|item| {
            let name = item.file_name();
            name == SETTINGS_FILE || name == INDEX_DIR
        })
    })
}

/// Removes a staging folder left by a crash; a failure is logged and the folder kept.
pub(super) fn remove_leftover(path: &Path) {
    match std::fs::remove_dir_all(path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "removed the leftover of an unfinished create or delete")
        }
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "removing the leftover of an unfinished create or delete failed; it is kept")
        }
    }
}

/// The settings in `folder/collection.json`, or the fault that names it.
pub(super) fn read_settings(folder: &Path) -> Result<StoredSettings, Fault> {
    let path = folder.join(SETTINGS_FILE);
    let bytes = std::fs::read(&path).map_err(|error| Fault::unreadable(&path, &error))?;
    serde_json::from_slice(&bytes)
        .map_err(|error| Fault::damaged(&path, format!("not valid settings: {error}")))
}

/// Writes `folder/collection.json` and syncs it.
pub(super) fn write_settings(folder: &Path, settings: &StoredSettings) -> std::io::Result<()> {
    use std::io::Write;
    let path = folder.join(SETTINGS_FILE);
    let json = serde_json::to_vec_pretty(settings)?;
    let mut file = std::fs::File::create(&path)?;
    file.write_all(&json)?;
    file.sync_all()
}

/// Syncs a folder, so that a rename or a new file in it is durable.
pub(super) fn sync_dir(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| LatheError::io(format!("syncing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::super::fault::FaultKind;
    use super::*;

    fn entry_named(folder: &Path, name: &str) -> std::fs::DirEntry {
        std::fs::read_dir(folder)
            .unwrap()
            .map(Result::unwrap)
            .find(|entry| entry.file_name() == name)
            .unwrap()
    }

    #[test]
    fn each_entry_of_the_collections_folder_is_sorted_by_what_made_it() {
        let root = tempfile::tempdir().unwrap();
        let folder = |name: &str, files: &[&str]| {
            std::fs::create_dir_all(root.path().join(name)).unwrap();
            for file in files {
                std::fs::write(root.path().join(name).join(file), b"").unwrap();
            }
        };
        folder("docs", &[]);
        folder(".creating-new", &[SETTINGS_FILE]);
        folder(".creating-mine", &[SETTINGS_FILE, "notes.txt"]);
        folder(".deleting-old", &["notes.txt"]);
        folder("backup.old", &[]);
        std::fs::write(root.path().join("readme"), b"").unwrap();
        let found = |name: &str| classify(&entry_named(root.path(), name));
        assert_eq!(found("docs"), Found::Collection("docs".to_string()));
        assert_eq!(found(".creating-new"), Found::Leftover);
        // A delete renamed the whole collection away: whatever it holds is the deleted one's.
        assert_eq!(found(".deleting-old"), Found::Leftover);
        assert!(matches!(found(".creating-mine"), Found::Unknown(_)));
        assert!(matches!(found("backup.old"), Found::Unknown(_)));
        assert!(matches!(found("readme"), Found::Unknown(_)));
    }

    #[test]
    fn settings_read_back_as_written_and_a_garbled_file_is_a_fault_naming_it() {
        let folder = tempfile::tempdir().unwrap();
        let settings = StoredSettings {
            budget_tokenizer: "cl100k_base".into(),
            section_tokens: 512,
            default_strategy: Some("sentence".into()),
            default_max_tokens: Some(256),
            default_overlap_tokens: None,
            log_created: None,
        };
        write_settings(folder.path(), &settings).unwrap();
        assert_eq!(read_settings(folder.path()), Ok(settings));
        std::fs::write(folder.path().join(SETTINGS_FILE), b"{\"budget_tokenizer\":").unwrap();
        let fault = read_settings(folder.path()).unwrap_err();
        assert_eq!(fault.kind, FaultKind::Damaged);
        assert_eq!(fault.path, folder.path().join(SETTINGS_FILE));
        assert!(
            fault.cause.starts_with("not valid settings"),
            "{}",
            fault.cause
        );
    }
}
