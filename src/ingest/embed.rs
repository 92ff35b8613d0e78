//! The embed stage: sentence vectors of every section (batched across the sections of all the
//! documents), stored as int8, and each section's vector: the mean of its sentence vectors
//! weighted by their length.

use std::ops::Range;

use super::SentencedDocument;
use crate::embed::{Embedder, FineMode, QuantizedVectors, VectorMatrix};
use crate::error::{LatheError, Result};

#[tracing::instrument(level = "debug", skip_all, fields(documents = documents.len()))]
pub fn embed(
    embedder: &dyn Embedder,
    mode: FineMode,
    documents: &mut [SentencedDocument],
) -> Result<()> {
    let ranges: Vec<Vec<Range<usize>>> = documents
        .iter()
        .flat_map(|document| &document.sections)
        .map(|section| {
            section
                .sentences
                .iter()
                .map(|r| r.start as usize..r.end as usize)
                .collect()
        })
        .collect();
    let texts = documents
        .iter()
        .flat_map(|document| (0..document.sections.len()).map(|i| document.section_text(i)));
    let inputs: Vec<(&str, &[Range<usize>])> = texts
        .zip(&ranges)
        .map(|(text, ranges)| (text, ranges.as_slice()))
        .collect();
    let matrices = embedder
        .sentence_vectors_of_sections(&inputs, mode)
        .map_err(|e| LatheError::Unavailable(format!("embedding failed: {e}")))?;
    drop(inputs);
    let sections = documents
        .iter_mut()
        .flat_map(|document| document.sections.iter_mut());
    for (section, matrix) in sections.zip(matrices) {
        if matrix.is_empty() {
            continue;
        }
        let quantized = QuantizedVectors::from_matrix(&matrix);
        let weights: Vec<f32> = section
            .sentences
            .iter()
            .map(|r| (r.end - r.start) as f32)
            .collect();
        let Ok(pooled) = quantized.pool(0..quantized.len(), &weights) else {
            continue;
        };
        let Some(section_vector) = VectorMatrix::from_values(pooled.len(), pooled) else {
            continue;
        };
        section.sentence_vectors = quantized.to_bytes();
        section.section_vector = QuantizedVectors::from_matrix(&section_vector).to_bytes();
    }
    Ok(())
}
