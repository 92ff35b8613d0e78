//! The embed stage: the query's only model pass (its vector, when the collection has a dense
//! index and the server a model) and its analysed terms with their idf over the snapshot.

use super::{term_hash, EmbeddedQuery, QueryTerms};
use crate::embed::Embedder;
use crate::error::{LatheError, Result};
use crate::index::{CollectionIndex, Snapshot};

#[tracing::instrument(level = "debug", skip_all, fields(model = embedder.is_some()))]
pub fn embed(
    query: &str,
    embedder: Option<&dyn Embedder>,
    index: &CollectionIndex,
    snapshot: &Snapshot,
) -> Result<EmbeddedQuery> {
    let vector = match embedder {
        Some(embedder) if index.has_dense() => Some(
            embedder
                .embed_query(query)
                .map_err(|e| LatheError::Unavailable(format!("embedding the query failed: {e}")))?,
        ),
        _ => None,
    };
    let terms = index.query_terms(query);
    let scoring_terms = QueryTerms {
        hashes: terms.iter().map(|term| term_hash(term)).collect(),
        idf: index.idf(snapshot, &terms)?,
    };
    Ok(EmbeddedQuery {
        vector,
        terms,
        scoring_terms,
    })
}
