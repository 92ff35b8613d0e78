//! The aliases of a data dir: a second name for a collection, kept in `data_dir/aliases.json`.
//!
//! [`AliasMap`] holds them in memory behind one lock, so that a switch is one step: a reader
//! resolves a name once and sees the old collection or the new one, never neither. Every change
//! writes the whole file first (to `aliases.json.tmp`, synced, renamed over `aliases.json`, the
//! folder synced) and only then changes the map: the rename is the moment a change happens, so a
//! crash leaves the old aliases or the new ones, and a change is answered only once it is durable.
//! The catalog serialises changes (with collection creates and deletes) and checks them against
//! its collections; this file checks the rest: the name rule, one namespace, an alias never naming
//! an alias.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use serde::{Deserialize, Serialize};

use super::folders::sync_dir;
use super::settings::is_valid_collection_name;
use crate::error::{LatheError, Result};

pub(super) const ALIASES_FILE: &str = "aliases.json";
const ALIASES_TEMP_FILE: &str = "aliases.json.tmp";
const FORMAT_VERSION: u32 = 1;

/// What `aliases.json` holds.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct AliasesFile {
    version: u32,
    /// Alias → the collection it names.
    aliases: BTreeMap<String, String>,
}

/// Whether a change makes a new alias or switches an existing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AliasChange {
    Create,
    Switch,
}

/// The aliases, in memory and in `aliases.json`.
pub(super) struct AliasMap {
    data_dir: PathBuf,
    map: RwLock<BTreeMap<String, String>>,
}

impl AliasMap {
    /// Reads `data_dir/aliases.json` (none: no aliases) and removes what a crash left of a write.
    /// A file that cannot be read or names what no alias may name stops the start: serving
    /// without the aliases would answer NOT_FOUND for every name they hold.
    pub(super) fn open(data_dir: &Path) -> Result<Self> {
        let _ = std::fs::remove_file(data_dir.join(ALIASES_TEMP_FILE));
        let path = data_dir.join(ALIASES_FILE);
        let map = match std::fs::read(&path) {
            Ok(bytes) => parse(&bytes).map_err(|why| {
                LatheError::Precondition(format!(
                    "{}: {why}; restore it from a backup, or remove it to start without aliases",
                    path.display()
                ))
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(error) => return Err(LatheError::io(format!("reading {}", path.display()), error)),
        };
        Ok(Self {
            data_dir: data_dir.to_path_buf(),
            map: RwLock::new(map),
        })
    }

    /// The collection `alias` names, when it is an alias.
    pub(super) fn target(&self, alias: &str) -> Option<String> {
        self.read().get(alias).cloned()
    }

    /// Every alias and the collection it names, by alias.
    pub(super) fn all(&self) -> BTreeMap<String, String> {
        self.read().clone()
    }

    /// The aliases naming `collection`, by name.
    pub(super) fn naming(&self, collection: &str) -> Vec<String> {
        self.read()
            .iter()
            .filter(|(_, target)| *target == collection)
            .map(|(alias, _)| alias.clone())
            .collect()
    }

    /// Points `alias` at `collection` (see [`AliasChange`]), `is_collection` telling which names
    /// are collections. The caller serialises changes.
    pub(super) fn set(
        &self,
        alias: &str,
        collection: &str,
        change: AliasChange,
        is_collection: impl Fn(&str) -> bool,
    ) -> Result<()> {
        debug_assert!(is_valid_collection_name(alias));
        if is_collection(alias) {
            return Err(LatheError::CollectionExists {
                name: alias.to_string(),
            });
        }
        if let Some(of) = self.target(collection) {
            return Err(LatheError::invalid(
                "collection",
                format!("`{collection}` is an alias (of collection `{of}`); an alias names a collection, never another alias"),
            ));
        }
        if !is_collection(collection) {
            return Err(LatheError::CollectionNotFound {
                name: collection.to_string(),
            });
        }
        match (self.target(alias), change) {
            (Some(existing), AliasChange::Create) => Err(LatheError::AliasExists {
                alias: alias.to_string(),
                collection: existing,
            }),
            (None, AliasChange::Switch) => Err(alias_not_found(alias)),
            _ => self.replace(alias, Some(collection)),
        }
    }

    /// Removes `alias`; returns the collection it named. The caller serialises changes.
    pub(super) fn remove(&self, alias: &str) -> Result<String> {
        let collection = self.target(alias).ok_or_else(|| alias_not_found(alias))?;
        self.replace(alias, None)?;
        Ok(collection)
    }

    /// Sets (or, with `None`, removes) `alias` as the log says, without the checks of [`set`]:
    /// another replica made them when it accepted the change. The caller serialises changes.
    ///
    /// [`set`]: AliasMap::set
    pub(super) fn apply(&self, alias: &str, collection: Option<&str>) -> Result<()> {
        if self.target(alias).as_deref() == collection {
            return Ok(());
        }
        self.replace(alias, collection)
    }

    /// Writes the aliases with `alias` changed, then changes them in memory.
    fn replace(&self, alias: &str, collection: Option<&str>) -> Result<()> {
        let mut aliases = self.all();
        match collection {
            Some(collection) => aliases.insert(alias.to_string(), collection.to_string()),
            None => aliases.remove(alias),
        };
        self.write_file(&aliases)
            .map_err(|(path, source)| LatheError::StorageRefused {
                name: alias.to_string(),
                action: format!("writing the aliases to {ALIASES_FILE}"),
                path,
                source,
            })?;
        *self.map.write().unwrap_or_else(|p| p.into_inner()) = aliases;
        Ok(())
    }

    /// The whole file, atomically: a temporary file synced, renamed into place, the folder synced.
    fn write_file(
        &self,
        aliases: &BTreeMap<String, String>,
    ) -> std::result::Result<(), (PathBuf, std::io::Error)> {
        use std::io::Write;
        let temp = self.data_dir.join(ALIASES_TEMP_FILE);
        let path = self.data_dir.join(ALIASES_FILE);
        let file = AliasesFile {
            version: FORMAT_VERSION,
            aliases: aliases.clone(),
        };
        let json = serde_json::to_vec_pretty(&file).map_err(|e| (temp.clone(), e.into()))?;
        std::fs::File::create(&temp)
            .and_then(|mut out| out.write_all(&json).and_then(|()| out.sync_all()))
            .map_err(|e| (temp.clone(), e))?;
        std::fs::rename(&temp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&temp);
            (path.clone(), e)
        })?;
        // Renamed: the change has happened. A failed sync is logged, as the catalog does.
        if let Err(error) = sync_dir(&self.data_dir) {
            tracing::warn!(%error, "syncing the data dir after writing the aliases failed");
        }
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, String>> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }
}

fn alias_not_found(alias: &str) -> LatheError {
    LatheError::NotFound(format!("alias `{alias}` not found"))
}

/// The aliases of a file's bytes, checked: names by the collection rule, no alias naming an alias.
fn parse(bytes: &[u8]) -> std::result::Result<BTreeMap<String, String>, String> {
    let file: AliasesFile =
        serde_json::from_slice(bytes).map_err(|e| format!("not valid aliases: {e}"))?;
    if file.version != FORMAT_VERSION {
        return Err(format!(
            "format version {} (this build reads {FORMAT_VERSION})",
            file.version
        ));
    }
    for (alias, collection) in &file.aliases {
        if !is_valid_collection_name(alias) || !is_valid_collection_name(collection) {
            return Err(format!("`{alias}` → `{collection}` is not a valid name"));
        }
        if file.aliases.contains_key(collection) {
            return Err(format!(
                "alias `{alias}` names another alias, `{collection}`"
            ));
        }
    }
    Ok(file.aliases)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collections(name: &str) -> bool {
        ["a", "b"].contains(&name)
    }

    #[test]
    fn a_change_is_in_the_file_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let aliases = AliasMap::open(dir.path()).unwrap();
        assert_eq!(aliases.target("live"), None);
        aliases
            .set("live", "a", AliasChange::Create, collections)
            .unwrap();
        aliases
            .set("old", "a", AliasChange::Create, collections)
            .unwrap();
        aliases
            .set("live", "b", AliasChange::Switch, collections)
            .unwrap();
        assert_eq!(aliases.target("live").as_deref(), Some("b"));
        assert_eq!(aliases.naming("a"), ["old"]);
        assert_eq!(aliases.remove("old").unwrap(), "a");
        assert!(!dir.path().join(ALIASES_TEMP_FILE).exists());

        let reopened = AliasMap::open(dir.path()).unwrap();
        let expected: BTreeMap<String, String> = [("live".to_string(), "b".to_string())].into();
        assert_eq!(reopened.all(), expected);
    }

    #[test]
    fn changes_are_checked_against_the_collections_and_the_aliases() {
        let dir = tempfile::tempdir().unwrap();
        let aliases = AliasMap::open(dir.path()).unwrap();
        aliases
            .set("live", "a", AliasChange::Create, collections)
            .unwrap();
        let refusal = |alias: &str, collection: &str, change| {
            aliases
                .set(alias, collection, change, collections)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refusal("live", "b", AliasChange::Create),
            "`live` is already an alias (of collection `a`); collections and aliases share one namespace"
        );
        assert_eq!(
            refusal("b", "a", AliasChange::Create),
            "collection `b` already exists"
        );
        assert_eq!(
            refusal("next", "gone", AliasChange::Create),
            "collection `gone` not found"
        );
        assert!(refusal("next", "live", AliasChange::Create).contains("never another alias"));
        assert_eq!(
            refusal("next", "a", AliasChange::Switch),
            "alias `next` not found"
        );
        assert_eq!(
            aliases.remove("next").unwrap_err().to_string(),
            "alias `next` not found"
        );
        // Nothing refused reached the file.
        let reopened = AliasMap::open(dir.path()).unwrap();
        assert_eq!(reopened.all(), aliases.all());
        assert_eq!(reopened.all().len(), 1);
    }

    #[test]
    fn a_file_that_cannot_be_trusted_stops_the_open_and_a_leftover_temp_file_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(ALIASES_TEMP_FILE), b"half a write").unwrap();
        assert!(AliasMap::open(dir.path()).unwrap().all().is_empty());
        assert!(!dir.path().join(ALIASES_TEMP_FILE).exists());
        for (bytes, why) in [
            (&b"{\"version\":1,"[..], "not valid aliases"),
            (b"{\"version\":2,\"aliases\":{}}", "format version 2"),
            (
                b"{\"version\":1,\"aliases\":{\"a/b\":\"c\"}}",
                "not a valid name",
            ),
            (
                b"{\"version\":1,\"aliases\":{\"x\":\"y\",\"y\":\"z\"}}",
                "names another alias",
            ),
        ] {
            std::fs::write(dir.path().join(ALIASES_FILE), bytes).unwrap();
            let error = AliasMap::open(dir.path()).err().expect("refused");
            assert!(
                matches!(error, LatheError::Precondition(ref m) if m.contains(why)),
                "{error}"
            );
        }
    }
}
