//! One collection's scrub (the server runs it over every open collection every
//! `storage.scrub_interval_s`, paced to `storage.scrub_bytes_per_second`): the files of its
//! current commit are read again and checked against their footer checksums, and its dense
//! segments against their manifest. Files are verified once when first opened; this finds what
//! changed on disk after that (a bad disk, a copy over a live data dir). A tantivy file that
//! fails is a finding of the collection's [`Integrity`]: the collection is DAMAGED, with one
//! ERROR line naming the file. A dense segment that fails is dropped and its vectors inserted
//! again from the stored sections (the sections are the truth; the graph is derived).

use std::collections::HashSet;

use tantivy::index::SegmentComponent;

use super::dense_upkeep::insert_stored_vectors;
use super::handle::CollectionIndex;
use super::integrity::{scrub_tantivy_file, Pace};
use crate::error::Result;

/// What one scrub of a collection found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Files found changed: tantivy files (the collection is damaged) and dense segments.
    pub findings: usize,
    /// Dense segments dropped and inserted again from the stored sections.
    pub rebuilt_segments: usize,
}

impl CollectionIndex {
    /// Scrubs the collection (see the module doc), reading at `pace`; stops early when it is
    /// told to.
    pub fn scrub(&self, pace: &mut Pace) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        let snapshot = self.snapshot();
        let metas = snapshot.searcher.index().searchable_segment_metas()?;
        for meta in metas {
            let mut components = vec![
                SegmentComponent::Postings,
                SegmentComponent::Positions,
                SegmentComponent::Terms,
                SegmentComponent::Store,
                SegmentComponent::FastFields,
                SegmentComponent::FieldNorms,
            ];
            if meta.has_deletes() {
                components.push(SegmentComponent::Delete);
            }
            for component in components {
                let path = self.path().join(meta.relative_path(component));
                if let Err(why) = scrub_tantivy_file(&path, pace) {
                    self.integrity
                        .record(format!("{}: {why} (found by the scrub)", path.display()));
                    report.findings += 1;
                }
                if pace.stopped() {
                    return Ok(report);
                }
            }
        }
        let Some(dense) = &self.dense else {
            return Ok(report);
        };
        for (segment, why) in dense.scrub(&mut |bytes| pace.read(bytes)) {
            tracing::error!(collection = self.integrity.collection(), segment, %why, "the scrub found a dense segment changed on disk; dropping it and inserting its vectors again from the stored sections");
            report.findings += 1;
            let keys: HashSet<u64> = dense.drop_segment(segment).into_iter().collect();
            // Read after the drop: what it holds live is what the segment held live.
            insert_stored_vectors(
                dense,
                &self.snapshot(),
                &self.fields,
                &keys,
                &self.integrity,
            )?;
            report.rebuilt_segments += 1;
        }
        Ok(report)
    }
}
