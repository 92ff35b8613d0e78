//! Read-only views of a collection's stored data for tools that check the index from outside
//! the query path (`lathe-bench` measures the dense leg's recall against exact search over these
//! vectors). Nothing here is used when serving.

use tantivy::DocAddress;

use super::handle::CollectionIndex;
use super::section_document::{decode_verified_section, first_vector_row};
use crate::error::{LatheError, Result};

impl CollectionIndex {
    /// The section vector stored with every live section that has one, keyed by section key, in
    /// index order: the vectors the dense index is built from, as stored (the ground truth of an
    /// exact nearest-neighbour search). A section failing verification is an error: a tool
    /// measuring the index wants to know, not to skip it.
    pub fn stored_section_vectors(&self) -> Result<Vec<(u64, Vec<f32>)>> {
        let snapshot = self.snapshot();
        let mut vectors = Vec::new();
        for (segment_ord, segment) in snapshot.searcher.segment_readers().iter().enumerate() {
            for doc in segment.doc_ids_alive() {
                let address = DocAddress::new(segment_ord as u32, doc);
                let (bytes, expected_key) = snapshot.stored_bytes(address).map_err(|why| {
                    LatheError::internal(format!("section at {address:?}: {why}"))
                })?;
                let section =
                    decode_verified_section(&bytes, expected_key, &self.fields).map_err(|why| {
                        LatheError::internal(format!("section at {address:?}: {why}"))
                    })?;
                if let Some(vector) = first_vector_row(section.section_vector) {
                    vectors.push((section.section_key, vector));
                }
            }
        }
        Ok(vectors)
    }
}

#[cfg(test)]
mod tests {
    use super::super::records::{section_key, WriteOp};
    use super::super::testing::{document, open_dense, vector_bytes, write_and_wait};

    #[test]
    fn stored_section_vectors_are_the_live_sections_vectors_as_written() {
        let data_dir = tempfile::tempdir().unwrap();
        let index = open_dense(&data_dir.path().join("index"), 4).unwrap();
        let mut a = document("a", 1, &["boats in the harbour"]);
        a.sections[0].section_vector = vector_bytes(&[1.0, 0.0, 0.0, 0.0]);
        let mut b = document("b", 1, &["hazards in their line of sight"]);
        b.sections[0].section_vector = vector_bytes(&[0.0, 0.6, 0.8, 0.0]);
        write_and_wait(&index, vec![WriteOp::Upsert(a), WriteOp::Upsert(b)]);
        write_and_wait(
            &index,
            vec![WriteOp::Delete {
                doc_id: "a".to_string(),
            }],
        );

        let vectors = index.stored_section_vectors().unwrap();
        assert_eq!(vectors.len(), 1, "the deleted section is not live");
        assert_eq!(vectors[0].0, section_key("b", 0, 1));
        // Stored quantised: equal to the written vector within quantisation error.
        for (got, want) in vectors[0].1.iter().zip([0.0, 0.6, 0.8, 0.0]) {
            assert!((got - want).abs() < 0.02, "{:?}", vectors[0].1);
        }
    }
}
