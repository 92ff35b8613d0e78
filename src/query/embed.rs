//! The embed stage: the query's only model pass (its vector, when the collection has a dense
//! index and the server a model) and its analysed terms. The
//! vector depends only on the model and the normalised query text, so it is cached by those: the
//! same question asked at another budget, or with other options, skips the model.

use std::sync::Arc;

use super::{term_hash, EmbeddedQuery, QueryTerms};
use crate::embed::Embedder;
use crate::error::{LatheError, Result};
use crate::index::CollectionIndex;
use crate::types::QueryVectorSource;

/// The query-vector cache's key: the model that embeds queries and the query text as the edge
/// normalised it (whitespace trimmed and collapsed).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QueryVectorKey {
    pub model: &'static str,
    pub query: String,
}

pub type QueryVectorCache = moka::sync::Cache<QueryVectorKey, Arc<[f32]>>;

/// The model that embeds queries, named as its cache entries are keyed.
#[derive(Clone, Copy)]
pub struct QueryModel<'a> {
    pub embedder: &'a dyn Embedder,
    pub name: &'static str,
}

/// The query's terms and, with a model and a dense index, its vector (from `vectors` when it
/// holds this query's, else from the model, then kept there); says where the vector came from.
#[tracing::instrument(level = "debug", skip_all, fields(model = model.is_some()))]
pub fn embed(
    query: &str,
    model: Option<QueryModel<'_>>,
    vectors: &QueryVectorCache,
    index: &CollectionIndex,
) -> Result<(EmbeddedQuery, QueryVectorSource)> {
    let (vector, source) = match model {
        Some(model) if index.has_dense() => {
            let (vector, source) = query_vector(query, model, vectors)?;
            (Some(vector), source)
        }
        _ => (None, QueryVectorSource::None),
    };
    let terms = index.query_terms(query);
    let scoring_terms = QueryTerms {
        hashes: terms.iter().map(|term| term_hash(term)).collect(),
    };
    let embedded = EmbeddedQuery {
        vector,
        terms,
        scoring_terms,
    };
    Ok((embedded, source))
}

/// The vector of `query`: cached, or embedded by the model and cached.
fn query_vector(
    query: &str,
    model: QueryModel<'_>,
    vectors: &QueryVectorCache,
) -> Result<(Vec<f32>, QueryVectorSource)> {
    let key = QueryVectorKey {
        model: model.name,
        query: query.to_string(),
    };
    if let Some(vector) = vectors.get(&key) {
        return Ok((vector.to_vec(), QueryVectorSource::Cache));
    }
    let vector = model
        .embedder
        .embed_query(query)
        .map_err(|e| LatheError::Unavailable(format!("embedding the query failed: {e}")))?;
    vectors.insert(key, Arc::from(vector.as_slice()));
    Ok((vector, QueryVectorSource::Model))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::{EmbedError, FineMode, VectorMatrix};
    use std::ops::Range;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A model that counts its query passes and gives each query a vector of its length.
    #[derive(Default)]
    struct CountingModel {
        queries: AtomicUsize,
    }

    impl Embedder for CountingModel {
        fn dim(&self) -> usize {
            1
        }
        fn embed_texts(&self, texts: &[&str]) -> std::result::Result<VectorMatrix, EmbedError> {
            unreachable!("only queries are embedded here: {texts:?}")
        }
        fn sentence_vectors(
            &self,
            _: &str,
            _: &[Range<usize>],
            _: FineMode,
        ) -> std::result::Result<VectorMatrix, EmbedError> {
            unreachable!("only queries are embedded here")
        }
        fn embed_query(&self, query: &str) -> std::result::Result<Vec<f32>, EmbedError> {
            self.queries.fetch_add(1, Ordering::Relaxed);
            Ok(vec![query.len() as f32])
        }
    }

    #[test]
    fn a_query_is_embedded_once_per_model() {
        let counting = CountingModel::default();
        let vectors = QueryVectorCache::new(1 << 20);
        let minilm = QueryModel {
            embedder: &counting,
            name: "minilm",
        };
        let first = query_vector("who won", minilm, &vectors).unwrap();
        assert_eq!(first, (vec![7.0], QueryVectorSource::Model));
        let again = query_vector("who won", minilm, &vectors).unwrap();
        assert_eq!(again, (vec![7.0], QueryVectorSource::Cache));
        assert_eq!(counting.queries.load(Ordering::Relaxed), 1);
        // Another query, or the same one under another model, goes to the model.
        query_vector("who lost", minilm, &vectors).unwrap();
        let other_model = QueryModel {
            name: "static",
            ..minilm
        };
        let (_, source) = query_vector("who won", other_model, &vectors).unwrap();
        assert_eq!(source, QueryVectorSource::Model);
        assert_eq!(counting.queries.load(Ordering::Relaxed), 3);
    }
}
