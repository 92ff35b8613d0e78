//! A scrub of the index's files, while it serves: every file of every sealed segment the
//! manifest lists is read again (paced by the caller) and checked against its CRC32; a segment
//! whose files fail is dropped — its slots dead first, so that a merge under way cannot carry
//! them on, then out of the segment list and the manifest, its files removed — and the caller
//! inserts its live keys again from where they are stored.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::Ordering;

use super::persist::{self, SegmentEntry};
use super::DenseIndex;

impl DenseIndex {
    /// The sealed segments whose files no longer match the manifest, each with why; `pace` is
    /// told every chunk read and stops the scrub when it answers `false`. Nothing when the
    /// index is in memory only or its files are closed (a delete).
    pub fn scrub(&self, pace: &mut dyn FnMut(usize) -> bool) -> Vec<(u64, String)> {
        let Some(dir) = self.dir.clone() else {
            return Vec::new();
        };
        let listed: Vec<SegmentEntry> = self.writer_side().manifest.segments.clone();
        let mut damaged = Vec::new();
        for entry in listed {
            for file in &entry.files {
                if self.files_are_closed() {
                    return damaged;
                }
                let path = dir.join(&file.name);
                match paced_checksum(&path, pace) {
                    Ok(None) => {}
                    Ok(Some(found)) if found == (file.bytes, file.crc32) => {}
                    Ok(Some((bytes, crc32))) => {
                        damaged.push((
                            entry.id,
                            format!(
                                "`{}` has {bytes} bytes with CRC32 {crc32:08x}, the manifest says {} bytes with {:08x}",
                                path.display(),
                                file.bytes,
                                file.crc32
                            ),
                        ));
                        break;
                    }
                    Err(error) => {
                        damaged.push((entry.id, format!("`{}` {error}", path.display())));
                        break;
                    }
                }
                if !pace(0) {
                    return damaged;
                }
            }
        }
        damaged
    }

    /// Drops sealed segment `id` (its files failed): its slots dead, out of the segment list
    /// and the manifest, its files removed (counted as a damaged segment). Returns the keys that
    /// were live in it, which the caller inserts again; none when no sealed segment has the id
    /// (merged away meanwhile).
    pub fn drop_segment(&self, id: u64) -> Vec<u64> {
        let mut writer = self.writer_side();
        let Some(segment) = self.sealed_segments().into_iter().find(|s| s.id == id) else {
            return Vec::new();
        };
        let live: Vec<u64> = segment.live_keys().collect();
        for slot in 0..segment.reserved() {
            segment.set_dead(slot);
        }
        self.live_keys.fetch_sub(live.len(), Ordering::AcqRel);
        self.replace_segments(|segments| segments.retain(|s| s.id != id));
        self.counters
            .damaged_segments
            .fetch_add(1, Ordering::Relaxed);
        let Some(files) = self.files() else {
            return live;
        };
        let mut manifest = writer.manifest.clone();
        let dropped: Vec<SegmentEntry> = manifest
            .segments
            .iter()
            .filter(|e| e.id == id)
            .cloned()
            .collect();
        manifest.segments.retain(|e| e.id != id);
        match persist::write_manifest(files.dir, &manifest) {
            Ok(()) => {
                writer.manifest = manifest;
                for entry in &dropped {
                    persist::remove_segment_files(files.dir, entry);
                }
            }
            Err(error) => {
                // The next open finds the files failing and drops the segment then.
                tracing::error!(%error, "unlisting a damaged dense segment failed");
                self.count_persist_failure();
            }
        }
        live
    }
}

/// The length and CRC32 of `path`, read in chunks told to `pace`; `None` when it is gone or the
/// scrub was stopped.
fn paced_checksum(
    path: &Path,
    pace: &mut dyn FnMut(usize) -> bool,
) -> std::io::Result<Option<(u64, u32)>> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
        bytes += read as u64;
        if !pace(read) {
            return Ok(None);
        }
    }
    Ok(Some((bytes, hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{find_each, persisted_index, random_vectors};

    #[test]
    fn a_changed_segment_file_is_found_and_its_segment_dropped_with_its_live_keys() {
        let vectors = random_vectors(300, 16, 11);
        let dir = tempfile::tempdir().expect("tempdir");
        let index = persisted_index(dir.path(), &vectors, 100);
        index.delete(5);
        assert!(index.scrub(&mut |_| true).is_empty(), "intact");

        let data = dir.path().join("seg-0.flat");
        let mut bytes = std::fs::read(&data).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&data, bytes).expect("write");
        let damaged = index.scrub(&mut |_| true);
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert_eq!(damaged[0].0, 0);
        assert!(damaged[0].1.contains("seg-0.flat"), "{damaged:?}");

        let live = index.drop_segment(0);
        assert_eq!(live.len(), 99, "segment 0's live keys, key 5 deleted");
        assert!(!live.contains(&5));
        assert_eq!(index.len(), 200);
        assert_eq!(index.counters().damaged_segments, 1);
        assert!(!data.exists());
        assert!(index.scrub(&mut |_| true).is_empty());
        // The caller inserts them again: every vector is found once more.
        index
            .insert_many(
                live.iter()
                    .map(|&key| (key, vectors[key as usize].as_slice())),
            )
            .expect("inserts");
        index.insert(5, &vectors[5]).expect("insert");
        find_each(&index, &vectors);
    }
}
