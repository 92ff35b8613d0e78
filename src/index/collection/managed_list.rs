//! Tantivy's list of the files it manages (`.managed.json`), written once for each new segment
//! instead of once for each of its files.
//!
//! Tantivy adds a file to the list, durably, before it creates the file, so that a crash can
//! leave no file that its garbage collection would not know to remove. It rewrites the whole
//! list for every file it adds: six writes, each synced, for the six files of every segment a
//! commit or a merge writes. [`ManagedList`] writes, with the first file of a new segment, the
//! names of the segment's other files as well (listed ahead of their creation), and skips
//! tantivy's next writes while the file on disk already lists everything tantivy lists. The
//! file on disk thus always lists a superset of tantivy's own list: as safe after a crash as
//! tantivy's, and a name listed for a file that was never created is dropped by the next
//! garbage collection (tantivy takes a missing file as deleted).

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The files tantivy writes for every segment (postings, positions, terms, field norms, fast
/// fields, doc store); a segment's deletes (`<id>.<opstamp>.del`) come later, one at a time.
const SEGMENT_FILES: [&str; 6] = ["fieldnorm", "term", "idx", "pos", "fast", "store"];

/// What this process knows of one folder's `.managed.json`.
#[derive(Debug, Default)]
pub(super) struct ManagedList {
    /// The names the file on disk lists, and the file as it was right after that write, when
    /// known.
    on_disk: Option<(BTreeSet<String>, FileStamp)>,
    /// The names of `on_disk` that tantivy has not listed itself yet.
    ahead: BTreeSet<String>,
}

/// Enough of a file's metadata to see that someone else replaced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    inode: u64,
    len: u64,
    modified_ns: i64,
}

impl FileStamp {
    fn of(path: &Path) -> io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        Ok(Self {
            inode: meta.ino(),
            len: meta.len(),
            modified_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        })
    }
}

impl ManagedList {
    /// Replaces the list at `path` with tantivy's new list `content`, through `write` (which
    /// replaces the file atomically and durably), unless the file on disk already lists every
    /// name of `content` and no name tantivy dropped.
    pub(super) fn replace(
        &mut self,
        path: &Path,
        content: &[u8],
        write: impl FnOnce(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let Some(listed) = parse(content) else {
            // Not a list this code knows: written as it is.
            self.on_disk = None;
            return write(content);
        };
        let on_disk = self.on_disk.take();
        if let Some((names, stamp)) = &on_disk {
            let covered = listed.is_subset(names)
                && names
                    .difference(&listed)
                    .all(|name| self.ahead.contains(name));
            if covered && FileStamp::of(path).ok() == Some(*stamp) {
                self.ahead = names.difference(&listed).cloned().collect();
                self.on_disk = on_disk;
                return Ok(());
            }
        }
        let known = on_disk.map(|(names, _)| names).unwrap_or_default();
        let mut names = listed.clone();
        for name in listed.difference(&known) {
            names.extend(segment_files(name));
        }
        let mut bytes = serde_json::to_vec(&names).map_err(io::Error::other)?;
        bytes.push(b'\n');
        write(&bytes)?;
        self.ahead = names.difference(&listed).cloned().collect();
        self.on_disk = Some((names, FileStamp::of(path)?));
        Ok(())
    }
}

fn parse(content: &[u8]) -> Option<BTreeSet<String>> {
    serde_json::from_slice(content).ok()
}

/// The names of all the files of the segment that `name` belongs to, when it is one of a
/// segment's files (`<32 hex digits>.<one of SEGMENT_FILES>`); none otherwise.
fn segment_files(name: &str) -> impl Iterator<Item = String> + '_ {
    let segment = name.split_once('.').and_then(|(id, extension)| {
        let is_id = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
        (is_id && SEGMENT_FILES.contains(&extension)).then_some(id)
    });
    segment
        .into_iter()
        .flat_map(|id| SEGMENT_FILES.iter().map(move |ext| format!("{id}.{ext}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEGMENT: &str = "0123456789abcdef0123456789abcdef";

    fn list(names: &[String]) -> Vec<u8> {
        let mut bytes = serde_json::to_vec(names).unwrap();
        bytes.push(b'\n');
        bytes
    }

    /// A folder's `.managed.json` and its list, written through a plain `std::fs::write`, with
    /// the writes counted.
    struct Folder {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        managed: ManagedList,
        writes: usize,
    }

    impl Folder {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(".managed.json");
            Self {
                _dir: dir,
                path,
                managed: ManagedList::default(),
                writes: 0,
            }
        }

        fn replace(&mut self, names: &[String]) {
            let (path, writes) = (&self.path, &mut self.writes);
            self.managed
                .replace(path, &list(names), |bytes| {
                    *writes += 1;
                    std::fs::write(path, bytes)
                })
                .unwrap();
        }

        fn on_disk(&self) -> BTreeSet<String> {
            serde_json::from_slice(&std::fs::read(&self.path).unwrap()).unwrap()
        }
    }

    #[test]
    fn a_segments_files_cost_one_write_and_the_file_always_lists_all_that_tantivy_lists() {
        let mut folder = Folder::new();
        let mut tantivy = vec!["meta.json".to_string()];
        folder.replace(&tantivy);
        for ext in SEGMENT_FILES {
            tantivy.push(format!("{SEGMENT}.{ext}"));
            folder.replace(&tantivy);
            let listed: BTreeSet<String> = tantivy.iter().cloned().collect();
            assert!(listed.is_subset(&folder.on_disk()), "after {ext}");
        }
        assert_eq!(
            folder.writes, 2,
            "the list before the segment, then its first file"
        );
        // A delete's file is not a segment's: it is written when tantivy lists it.
        tantivy.push(format!("{SEGMENT}.7.del"));
        folder.replace(&tantivy);
        assert_eq!(folder.writes, 3);
        assert_eq!(folder.on_disk().len(), tantivy.len());
    }

    #[test]
    fn a_name_tantivy_drops_is_written_at_once() {
        let mut folder = Folder::new();
        let segment: Vec<String> = segment_files(&format!("{SEGMENT}.idx")).collect();
        folder.replace(&segment);
        // Garbage collection removed the segment: the list shrinks on disk too.
        folder.replace(&[]);
        assert_eq!(folder.writes, 2);
        assert!(folder.on_disk().is_empty());
    }

    #[test]
    fn a_file_someone_else_replaced_is_written_again() {
        let mut folder = Folder::new();
        folder.replace(&[format!("{SEGMENT}.fieldnorm")]);
        std::fs::write(&folder.path, b"[]\n").unwrap();
        let second = [format!("{SEGMENT}.fieldnorm"), format!("{SEGMENT}.term")];
        folder.replace(&second);
        assert_eq!(
            folder.writes, 2,
            "the file changed under the list: written again"
        );
        assert!(folder.on_disk().contains(&second[1]));
    }

    #[test]
    fn a_failed_write_leaves_nothing_assumed() {
        let mut folder = Folder::new();
        let names = [format!("{SEGMENT}.fieldnorm")];
        let failed = folder.managed.replace(&folder.path, &list(&names), |_| {
            Err(io::Error::other("full"))
        });
        assert!(failed.is_err());
        let more = [format!("{SEGMENT}.fieldnorm"), format!("{SEGMENT}.term")];
        folder.replace(&more);
        assert_eq!(folder.writes, 1);
        assert!(folder.on_disk().contains(&more[1]));
    }

    #[test]
    fn only_a_segments_own_file_names_bring_their_companions() {
        assert_eq!(segment_files(&format!("{SEGMENT}.store")).count(), 6);
        for name in [
            "meta.json",
            "0123.idx",
            "0123456789abcdef0123456789abcdeg.idx",
            &format!("{SEGMENT}.7.del"),
            &format!("{SEGMENT}.json"),
        ] {
            assert_eq!(segment_files(name).count(), 0, "{name}");
        }
    }
}
