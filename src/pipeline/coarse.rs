//! Stage 1: coarse retrieval of whole sections.

use crate::error::Result;
use crate::index::{CollectionIndex, SectionHit, Snapshot};
use crate::types::Filter;

/// The top `top_k` sections for the analysed `terms`, best first.
pub fn retrieve(
    index: &CollectionIndex,
    snapshot: &Snapshot,
    terms: &[String],
    filter: &Filter,
    top_k: usize,
) -> Result<Vec<SectionHit>> {
    index.search(snapshot, terms, filter, top_k)
}
