//! The validate stage: the query's own limits, checked before any work is done, and the chunk
//! sizes a plan or a collection's default chunking comes to. Resolving what the query asks for
//! against the collection's defaults and the server's is `plan`'s.

use crate::config::LimitsConfig;
use crate::error::{LatheError, Result};
use crate::types::{ChunkSelection, ExactF32, RetrieveQuery};

/// The query's own limits (text length, top_k, budget).
pub fn validate_query(limits: &LimitsConfig, query: &RetrieveQuery) -> Result<()> {
    if query.query.is_empty() {
        return Err(LatheError::invalid(
            "query",
            "must contain at least one non-whitespace character",
        ));
    }
    if query.query.len() > limits.max_query_bytes {
        return Err(LatheError::invalid(
            "query",
            format!(
                "is {} bytes; the allowed range is 1..={} bytes",
                query.query.len(),
                limits.max_query_bytes
            ),
        ));
    }
    if let Some(top_k) = query.top_k {
        check_from_one("top_k", top_k, limits.max_top_k)?;
    }
    check_from_one("token_budget", query.token_budget, limits.max_token_budget)?;
    validate_selection(&query.selection)
}

/// The largest `max_chunks_per_document` accepted: no answer holds more chunks than this.
pub const MAX_CHUNKS_PER_DOCUMENT: u32 = 1_000;

/// `min_score` finite, `max_chunks_per_document` in 1..=1000, `diversity` in 0..=1.
fn validate_selection(selection: &ChunkSelection) -> Result<()> {
    if let Some(min_score) = selection.min_score {
        if !min_score.0.is_finite() {
            return Err(LatheError::invalid(
                "min_score",
                format!("is {}; it must be a finite number", min_score.0),
            ));
        }
    }
    if let Some(cap) = selection.max_chunks_per_document {
        check_from_one("max_chunks_per_document", cap, MAX_CHUNKS_PER_DOCUMENT)?;
    }
    if let Some(ExactF32(diversity)) = selection.diversity {
        if !(0.0..=1.0).contains(&diversity) {
            return Err(LatheError::invalid(
                "diversity",
                format!("is {diversity}; the allowed range is 0..=1 (0: off)"),
            ));
        }
    }
    Ok(())
}

/// `value` of `field` in 1..=`max`.
fn check_from_one(field: &str, value: u32, max: u32) -> Result<()> {
    if (1..=max).contains(&value) {
        return Ok(());
    }
    Err(LatheError::invalid(
        field,
        format!("is {value}; the allowed range is 1..={max}"),
    ))
}

/// A chunk size in 1..=`max_chunk_tokens` and an overlap below it (also checked for a
/// collection's default chunking when it is created).
pub fn check_chunk_sizes(max_size: u32, overlap: u32, max_chunk_tokens: u32) -> Result<()> {
    if !(1..=max_chunk_tokens).contains(&max_size) {
        return Err(LatheError::invalid(
            "chunking.max_tokens",
            format!("is {max_size}; the allowed range is 1..={max_chunk_tokens}"),
        ));
    }
    if overlap >= max_size {
        return Err(LatheError::invalid(
            "chunking.overlap_tokens",
            format!(
                "is {overlap}; it must be below chunking.max_tokens ({max_size}), i.e. in 0..={}",
                max_size - 1
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ChunkingSpec;

    fn query(top_k: u32, token_budget: u32) -> RetrieveQuery {
        RetrieveQuery {
            collection: "c".into(),
            query: "plane iron".into(),
            top_k: Some(top_k),
            token_budget,
            chunking: ChunkingSpec::default(),
            filter: Default::default(),
            order: Default::default(),
            selection: ChunkSelection::default(),
        }
    }

    fn reason(result: Result<()>) -> String {
        match result {
            Err(error) => error.to_string(),
            Ok(()) => panic!("the query was accepted"),
        }
    }

    #[test]
    fn top_k_and_budget_outside_their_range_name_the_field_and_the_range() {
        let limits = LimitsConfig::default();
        assert!(validate_query(&limits, &query(1, 1)).is_ok());
        let max = (limits.max_top_k, limits.max_token_budget);
        assert!(validate_query(&limits, &query(max.0, max.1)).is_ok());
        assert_eq!(
            reason(validate_query(&limits, &query(0, 1))),
            format!("invalid `top_k`: is 0; the allowed range is 1..={}", max.0)
        );
        assert_eq!(
            reason(validate_query(&limits, &query(1, max.1 + 1))),
            format!(
                "invalid `token_budget`: is {}; the allowed range is 1..={}",
                max.1 + 1,
                max.1
            )
        );
    }

    #[test]
    fn selection_controls_outside_their_range_name_the_field_and_the_range() {
        use crate::types::ExactF32;
        let limits = LimitsConfig::default();
        let with = |selection: ChunkSelection| RetrieveQuery {
            selection,
            ..query(8, 100)
        };
        let fine = ChunkSelection {
            min_score: Some(ExactF32(-3.5)),
            max_chunks_per_document: Some(1),
            diversity: Some(ExactF32(1.0)),
        };
        assert!(validate_query(&limits, &with(fine)).is_ok());
        let cases = [
            (
                ChunkSelection {
                    min_score: Some(ExactF32(f32::NAN)),
                    ..fine
                },
                "invalid `min_score`: is NaN; it must be a finite number",
            ),
            (
                ChunkSelection {
                    max_chunks_per_document: Some(0),
                    ..fine
                },
                "invalid `max_chunks_per_document`: is 0; the allowed range is 1..=1000",
            ),
            (
                ChunkSelection {
                    diversity: Some(ExactF32(1.5)),
                    ..fine
                },
                "invalid `diversity`: is 1.5; the allowed range is 0..=1 (0: off)",
            ),
            (
                ChunkSelection {
                    diversity: Some(ExactF32(f32::NAN)),
                    ..fine
                },
                "invalid `diversity`: is NaN; the allowed range is 0..=1 (0: off)",
            ),
        ];
        for (selection, message) in cases {
            assert_eq!(reason(validate_query(&limits, &with(selection))), message);
        }
    }
}
