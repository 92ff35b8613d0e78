//! Conversions between proto messages and domain types. Every proto message is destructured by
//! field name, so a new proto field does not compile until someone decides what it means.

mod writes;

pub use writes::{document_from_proto, documents_from_proto};

use super::proto;
use crate::error::{LatheError, Result};
use crate::types::{
    normalise_query, Alias, ChunkSelection, ChunkingSpec, CollectionInfo, CollectionSettings,
    CollectionState, CollectionStats, DenseStats, ExactF32, Filter, ResultOrder, RetrieveQuery,
    RetrieveResult, RetrievedChunk, SemanticKind, SemanticRule, Strategy, Unit,
    DEFAULT_SECTION_TOKENS, METADATA_SEPARATOR,
};

pub fn strategy_from_proto(value: i32, field: &str) -> Result<Option<Strategy>> {
    use proto::ChunkStrategy as P;
    let strategy = match P::try_from(value) {
        Ok(P::Unspecified) => return Ok(None),
        Ok(P::Fixed) => Strategy::Fixed,
        Ok(P::Sentence) => Strategy::Sentence,
        Ok(P::Recursive) => Strategy::Recursive,
        Ok(P::Structure) => Strategy::Structure,
        Ok(P::Auto) => Strategy::Auto,
        Ok(P::Semantic) => Strategy::Semantic,
        Ok(P::Csv) => Strategy::Csv,
        Ok(P::Code) => Strategy::Code,
        Err(_) => {
            return Err(LatheError::invalid(
                field,
                format!("unknown strategy {value}; the allowed values are 0 (collection default) to 8: fixed=1, sentence=2, recursive=3, structure=4, auto=5, semantic=6, csv=7, code=8"),
            ))
        }
    };
    Ok(Some(strategy))
}

pub fn strategy_to_proto(strategy: Strategy) -> proto::ChunkStrategy {
    use proto::ChunkStrategy as P;
    match strategy {
        Strategy::Fixed => P::Fixed,
        Strategy::Sentence => P::Sentence,
        Strategy::Recursive => P::Recursive,
        Strategy::Structure => P::Structure,
        Strategy::Auto => P::Auto,
        Strategy::Semantic => P::Semantic,
        Strategy::Csv => P::Csv,
        Strategy::Code => P::Code,
    }
}

fn unit_from_proto(value: i32, field: &str) -> Result<Unit> {
    match proto::ChunkUnit::try_from(value) {
        Ok(proto::ChunkUnit::Tokens) => Ok(Unit::Tokens),
        Ok(proto::ChunkUnit::Words) => Ok(Unit::Words),
        Ok(proto::ChunkUnit::Chars) => Ok(Unit::Chars),
        Err(_) => Err(LatheError::invalid(
            field,
            format!(
                "unknown unit {value}; the allowed values are 0 (tokens), 1 (words), 2 (chars)"
            ),
        )),
    }
}

fn unit_to_proto(unit: Unit) -> proto::ChunkUnit {
    match unit {
        Unit::Tokens => proto::ChunkUnit::Tokens,
        Unit::Words => proto::ChunkUnit::Words,
        Unit::Chars => proto::ChunkUnit::Chars,
    }
}

pub fn chunking_from_proto(
    options: Option<proto::ChunkingOptions>,
    field: &str,
) -> Result<ChunkingSpec> {
    let Some(proto::ChunkingOptions {
        strategy,
        max_tokens,
        overlap_tokens,
        unit,
        separators,
        semantic_threshold,
        semantic_amount,
    }) = options
    else {
        return Ok(ChunkingSpec::default());
    };
    if let Some(i) = separators.iter().position(String::is_empty) {
        return Err(LatheError::invalid(
            format!("{field}.separators[{i}]"),
            "must not be empty",
        ));
    }
    Ok(ChunkingSpec {
        strategy: strategy_from_proto(strategy, &format!("{field}.strategy"))?,
        max_tokens,
        overlap_tokens,
        unit: unit_from_proto(unit, &format!("{field}.unit"))?,
        separators,
        semantic: semantic_rule_from_proto(semantic_threshold, semantic_amount, field)?,
    })
}

fn semantic_rule_from_proto(
    threshold: i32,
    amount: Option<f32>,
    field: &str,
) -> Result<Option<SemanticRule>> {
    use proto::SemanticThreshold as P;
    let (kind, default, range_text, valid): (SemanticKind, f32, &str, fn(f32) -> bool) = match P::try_from(threshold) {
        Ok(P::Percentile) => (SemanticKind::Percentile, 95.0, "0..=100", |a| (0.0..=100.0).contains(&a)),
        Ok(P::StdDev) => (SemanticKind::StdDev, 3.0, "a finite number above 0", |a| a.is_finite() && a > 0.0),
        Ok(P::Interquartile) => (SemanticKind::Interquartile, 1.5, "a finite number above 0", |a| a.is_finite() && a > 0.0),
        Ok(P::Gradient) => (SemanticKind::Gradient, 95.0, "0..=100", |a| (0.0..=100.0).contains(&a)),
        Err(_) => {
            return Err(LatheError::invalid(
                format!("{field}.semantic_threshold"),
                format!("unknown threshold {threshold}; the allowed values are 0 (percentile), 1 (std_dev), 2 (interquartile), 3 (gradient)"),
            ))
        }
    };
    if threshold == P::Percentile as i32 && amount.is_none() {
        return Ok(None);
    }
    let amount = amount.unwrap_or(default);
    if !valid(amount) {
        return Err(LatheError::invalid(
            format!("{field}.semantic_amount"),
            format!("is {amount}; the allowed range is {range_text}"),
        ));
    }
    Ok(Some(SemanticRule {
        kind,
        amount_bits: amount.to_bits(),
    }))
}

fn chunking_to_proto(spec: &ChunkingSpec) -> proto::ChunkingOptions {
    let ChunkingSpec {
        strategy,
        max_tokens,
        overlap_tokens,
        unit,
        separators,
        semantic,
    } = spec;
    let (semantic_threshold, semantic_amount) = match semantic {
        None => (proto::SemanticThreshold::Percentile, None),
        Some(rule) => (
            match rule.kind {
                SemanticKind::Percentile => proto::SemanticThreshold::Percentile,
                SemanticKind::StdDev => proto::SemanticThreshold::StdDev,
                SemanticKind::Interquartile => proto::SemanticThreshold::Interquartile,
                SemanticKind::Gradient => proto::SemanticThreshold::Gradient,
            },
            Some(f32::from_bits(rule.amount_bits)),
        ),
    };
    proto::ChunkingOptions {
        strategy: strategy.map_or(proto::ChunkStrategy::Unspecified, strategy_to_proto) as i32,
        max_tokens: *max_tokens,
        overlap_tokens: *overlap_tokens,
        unit: unit_to_proto(*unit) as i32,
        separators: separators.clone(),
        semantic_threshold: semantic_threshold as i32,
        semantic_amount,
    }
}

pub fn settings_from_proto(
    settings: Option<proto::CollectionSettings>,
) -> Result<CollectionSettings> {
    let proto::CollectionSettings {
        budget_tokenizer,
        default_chunking,
        section_tokens,
    } = settings.unwrap_or_default();
    Ok(CollectionSettings {
        budget_tokenizer,
        default_chunking: chunking_from_proto(default_chunking, "settings.default_chunking")?,
        section_tokens: section_tokens.unwrap_or(DEFAULT_SECTION_TOKENS),
    })
}

impl From<Alias> for proto::Alias {
    fn from(Alias { alias, collection }: Alias) -> Self {
        proto::Alias { alias, collection }
    }
}

impl From<CollectionInfo> for proto::CollectionInfo {
    fn from(info: CollectionInfo) -> Self {
        let CollectionInfo {
            name,
            state,
            reason,
            settings,
            stats,
            aliases,
        } = info;
        proto::CollectionInfo {
            name,
            aliases,
            settings: settings.map(
                |CollectionSettings {
                     budget_tokenizer,
                     default_chunking,
                     section_tokens,
                 }| proto::CollectionSettings {
                    budget_tokenizer,
                    default_chunking: Some(chunking_to_proto(&default_chunking)),
                    section_tokens: Some(section_tokens),
                },
            ),
            stats: stats.map(stats_to_proto),
            state: collection_state_to_proto(state) as i32,
            reason,
        }
    }
}

fn collection_state_to_proto(state: CollectionState) -> proto::CollectionState {
    match state {
        CollectionState::Ready => proto::CollectionState::Ready,
        CollectionState::Damaged => proto::CollectionState::Damaged,
        CollectionState::Offline => proto::CollectionState::Offline,
    }
}

fn stats_to_proto(stats: CollectionStats) -> proto::CollectionStats {
    let CollectionStats {
        documents,
        sections,
        bytes,
        generation,
        dense,
    } = stats;
    proto::CollectionStats {
        documents,
        sections,
        bytes,
        generation,
        dense: dense.map(
            |DenseStats {
                 vectors,
                 sections_with_vector,
             }| proto::DenseStats {
                vectors,
                sections_with_vector,
            },
        ),
    }
}

/// A metadata pair is indexed as one term `key U+001F value`: a key holding U+001F would let
/// `a\u{1f}b = c` and `a = b\u{1f}c` be the same term, so one document could match (or forge)
/// another's filter.
pub(super) fn separator_in_key(key: &str) -> String {
    format!(
        "key {key:?} contains U+001F (the metadata term separator); keys must not contain U+001F"
    )
}

pub fn retrieve_query_from_proto(request: proto::RetrieveRequest) -> Result<RetrieveQuery> {
    let proto::RetrieveRequest {
        collection,
        query,
        top_k,
        token_budget,
        chunking,
        filter,
        order,
        min_score,
        max_chunks_per_document,
        diversity,
        // Not part of the query (nor of its cache key): the service waits on it first.
        consistency_token: _,
    } = request;
    let selection = ChunkSelection {
        min_score: min_score.map(ExactF32),
        max_chunks_per_document,
        diversity: diversity.map(ExactF32),
    };
    let order = match proto::ResultOrder::try_from(order) {
        Ok(proto::ResultOrder::Score) => ResultOrder::Score,
        Ok(proto::ResultOrder::Position) => ResultOrder::Position,
        Err(_) => {
            return Err(LatheError::invalid(
                "order",
                format!("unknown order {order}; the allowed values are 0 (score), 1 (position)"),
            ))
        }
    };
    let filter = match filter {
        None => Filter::default(),
        Some(proto::Filter { metadata, doc_ids }) => {
            let mut terms = Vec::with_capacity(metadata.len());
            for (i, proto::MetadataTerm { key, value }) in metadata.into_iter().enumerate() {
                if key.is_empty() {
                    return Err(LatheError::invalid(
                        format!("filter.metadata[{i}].key"),
                        "must not be empty",
                    ));
                }
                if key.contains(METADATA_SEPARATOR) {
                    return Err(LatheError::invalid(
                        format!("filter.metadata[{i}].key"),
                        separator_in_key(&key),
                    ));
                }
                terms.push((key, value));
            }
            terms.sort();
            terms.dedup();
            let mut doc_ids = doc_ids;
            doc_ids.sort();
            doc_ids.dedup();
            Filter {
                metadata: terms,
                doc_ids,
            }
        }
    };
    Ok(RetrieveQuery {
        collection,
        query: normalise_query(&query),
        top_k,
        token_budget,
        chunking: chunking_from_proto(chunking, "chunking")?,
        filter,
        order,
        selection,
    })
}

impl From<RetrievedChunk> for proto::RetrievedChunk {
    fn from(chunk: RetrievedChunk) -> Self {
        let section_id = chunk.section_id();
        let RetrievedChunk {
            doc_id,
            section_ordinal: _,
            heading_path,
            doc_title,
            text,
            context,
            bytes,
            chars,
            token_count,
            score,
            parts,
            strategy,
            metadata,
        } = chunk;
        proto::RetrievedChunk {
            doc_id,
            section_id,
            section_title: heading_path.join(crate::types::HEADING_SEPARATOR),
            heading_path,
            doc_title,
            text,
            context,
            bytes: Some(proto::Span {
                start: bytes.start,
                end: bytes.end,
            }),
            chars: Some(proto::Span {
                start: chars.start,
                end: chars.end,
            }),
            token_count,
            score,
            score_parts: Some(proto::ScoreParts {
                bm25: parts.bm25,
                section: parts.section,
                dense: parts.dense,
            }),
            strategy: strategy_to_proto(strategy) as i32,
            metadata: metadata.into_iter().collect(),
        }
    }
}

impl From<RetrieveResult> for proto::RetrieveResponse {
    fn from(result: RetrieveResult) -> Self {
        let RetrieveResult {
            chunks,
            tokens_used,
            token_budget,
            generation,
            cache_hit,
            timings,
            sections_considered,
            chunks_considered,
            section_cache_misses: _,
            log_position,
            query_vector: _,
        } = result;
        proto::RetrieveResponse {
            chunks: chunks.into_iter().map(Into::into).collect(),
            tokens_used,
            token_budget,
            generation,
            cache_hit,
            timings: timings
                .into_iter()
                .map(|(stage, micros)| proto::StageTiming {
                    stage: stage.to_string(),
                    micros,
                })
                .collect(),
            sections_considered,
            chunks_considered,
            log_position,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_collection_converts_with_its_state_and_reason_and_no_stats() {
        let info = proto::CollectionInfo::from(CollectionInfo {
            name: "docs".into(),
            state: CollectionState::Damaged,
            reason: "/d/collections/docs/collection.json: No such file or directory".into(),
            settings: None,
            stats: None,
            aliases: vec!["live".into()],
        });
        assert_eq!(info.state(), proto::CollectionState::Damaged);
        assert_eq!(info.aliases, ["live"]);
        assert_eq!(
            info.reason,
            "/d/collections/docs/collection.json: No such file or directory"
        );
        assert_eq!((info.settings, info.stats), (None, None));
        let ready = proto::CollectionInfo::from(CollectionInfo {
            name: "docs".into(),
            state: CollectionState::Ready,
            reason: String::new(),
            settings: Some(CollectionSettings::default()),
            stats: Some(CollectionStats::default()),
            aliases: Vec::new(),
        });
        assert_eq!(ready.state(), proto::CollectionState::Ready);
        assert!(ready.settings.is_some() && ready.stats.is_some());
    }

    #[test]
    fn unknown_strategy_names_the_field_and_the_allowed_values() {
        let error = strategy_from_proto(42, "chunking.strategy").unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("chunking.strategy")
                && message.contains("0 (collection default) to 8"),
            "{message}"
        );
    }

    #[test]
    fn queries_are_normalised_and_top_k_is_left_to_the_budget() {
        let query = retrieve_query_from_proto(proto::RetrieveRequest {
            collection: "c".into(),
            query: "  who   won\tthe game ".into(),
            token_budget: 10,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(query.query, "who won the game");
        assert_eq!(query.top_k, None);
    }
}

#[cfg(test)]
mod semantic_tests {
    use super::*;

    #[test]
    fn semantic_amounts_are_checked_against_their_rule() {
        let error = semantic_rule_from_proto(
            proto::SemanticThreshold::Percentile as i32,
            Some(120.0),
            "chunking",
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("chunking.semantic_amount")
                && error.to_string().contains("0..=100"),
            "{error}"
        );
        let error = semantic_rule_from_proto(
            proto::SemanticThreshold::StdDev as i32,
            Some(-1.0),
            "chunking",
        )
        .unwrap_err();
        assert!(error.to_string().contains("above 0"), "{error}");
        assert!(semantic_rule_from_proto(9, None, "chunking").is_err());
        assert_eq!(semantic_rule_from_proto(0, None, "chunking").unwrap(), None);
        let rule = semantic_rule_from_proto(
            proto::SemanticThreshold::Interquartile as i32,
            None,
            "chunking",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            rule.threshold(),
            crate::chunk::SemanticThreshold::Interquartile(1.5)
        );
    }
}
