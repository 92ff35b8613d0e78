//! The plan of a query, made once its limits are checked and its collection is known: the
//! chunking it asks for resolved against the collection's defaults and then the server's, the
//! sizes its sections are cut at, and its coarse depth ([`QueryPlan`]).

use std::sync::Arc;

use super::validate::check_chunk_sizes;
use super::QueryPlan;
use crate::chunk::{ChunkOptions, SemanticThreshold, Strategy};
use crate::config::{LimitsConfig, RetrievalConfig};
use crate::error::Result;
use crate::types::{ChunkingSpec, RetrieveQuery};

/// What a query's plan falls back on where the request leaves a field unset: the collection's
/// defaults, then the server's.
pub struct PlanDefaults<'a> {
    /// The collection's default chunking.
    pub chunking: &'a ChunkingSpec,
    /// The collection's section size, in tokens.
    pub section_tokens: u32,
    pub limits: &'a LimitsConfig,
    pub retrieval: &'a RetrievalConfig,
}

/// The plan of `query` ([`resolve_chunking`], [`chunk_sizes`], [`resolve_top_k`],
/// [`semantic_threshold`]); an error when the chunk size it comes to is out of range.
pub fn plan(query: &RetrieveQuery, defaults: &PlanDefaults) -> Result<QueryPlan> {
    let budget = query.token_budget;
    let default_chunk_tokens = defaults.retrieval.default_chunk_tokens;
    let chunking = resolve_chunking(
        &query.chunking,
        defaults.chunking,
        budget,
        default_chunk_tokens,
        defaults.limits,
    )?;
    let sizes = chunk_sizes(
        &query.chunking,
        defaults.chunking,
        &chunking,
        budget,
        default_chunk_tokens,
    );
    let top_k = resolve_top_k(
        query.top_k,
        budget,
        defaults.section_tokens,
        defaults.limits,
        defaults.retrieval.default_top_k,
    );
    Ok(QueryPlan {
        chunking,
        sizes,
        top_k,
        semantic_threshold: semantic_threshold(&query.chunking),
    })
}

/// Tokens of section text the coarse stage retrieves per token of budget when the request sets no
/// `top_k`: chunks are cut from the retrieved sections and only the best are packed, so filling a
/// budget well takes several times its size in candidates (see docs/retrieval.md, "Budget-aware defaults",
/// for the measurements).
pub const SECTIONS_PER_BUDGET_SECTION: u32 = 12;

/// The least section text, in tokens, the coarse stage retrieves when the request sets no `top_k`:
/// the chunk scores choose among at least this much text (8 sections of 1,024 tokens, 32 of 256),
/// whatever the section size, however small the budget.
pub const MIN_DEPTH_TOKENS: u64 = 8_192;

/// The coarse depth of a query: `requested` when set; else the sections that hold
/// [`SECTIONS_PER_BUDGET_SECTION`] times the budget, and at least [`MIN_DEPTH_TOKENS`], of the
/// collection's section size (rounded up), never fewer than the server's
/// `retrieval.default_top_k`. At most `limits.max_top_k`, or, for sections so small that those
/// would not hold twice the budget, the sections that do: a budget can always be filled.
pub fn resolve_top_k(
    requested: Option<u32>,
    token_budget: u32,
    section_tokens: u32,
    limits: &LimitsConfig,
    default_top_k: u32,
) -> u32 {
    if let Some(top_k) = requested {
        return top_k;
    }
    let section_tokens = section_tokens.max(1) as u64;
    let budget = token_budget as u64;
    let wanted_tokens = (budget * SECTIONS_PER_BUDGET_SECTION as u64).max(MIN_DEPTH_TOKENS);
    let most = (limits.max_top_k as u64).max((2 * budget).div_ceil(section_tokens));
    wanted_tokens
        .div_ceil(section_tokens)
        .max(default_top_k as u64)
        .min(most) as u32
}

/// The chunking of one query: each field as requested, else the collection's default, else the
/// server's (`default_chunk_tokens`, capped by the budget).
pub fn resolve_chunking(
    requested: &ChunkingSpec,
    collection: &ChunkingSpec,
    token_budget: u32,
    default_chunk_tokens: u32,
    limits: &LimitsConfig,
) -> Result<ChunkOptions> {
    let strategy = requested
        .strategy
        .or(collection.strategy)
        .unwrap_or(Strategy::Sentence);
    let max_size = requested
        .max_tokens
        .or(collection.max_tokens)
        .unwrap_or_else(|| budget_chunk_tokens(token_budget, default_chunk_tokens));
    let overlap = requested
        .overlap_tokens
        .or(collection.overlap_tokens)
        .unwrap_or(0);
    let unit = if requested.strategy.is_some() {
        requested.unit
    } else {
        collection.unit
    };
    check_chunk_sizes(max_size, overlap, limits.max_chunk_tokens)?;
    let separators = if requested.separators.is_empty() {
        None
    } else {
        Some(Arc::from(requested.separators.clone()))
    };
    Ok(ChunkOptions {
        strategy,
        max_size,
        overlap,
        unit,
        separators,
    })
}

/// Budgets up to this many tokens get [`SMALL_BUDGET_CHUNK_TOKENS`]-token chunks by default (from
/// 2,048 on, 128-token chunks answer as well on squad-a and better on covid-a, in fewer spans).
pub const SMALL_BUDGET_TOKENS: u32 = 1_024;

/// The default chunk size of small budgets: precise sentence chunks (measured on squad-a: 64-token
/// sentence chunks answer 0.82 / 0.90 at 128 / 256 tokens where 128-token ones answer 0.73 / 0.84).
pub const SMALL_BUDGET_CHUNK_TOKENS: u32 = 64;

/// The chunk size when neither the request nor the collection sets one: small chunks for small
/// budgets (leftover budget then grows them by neighbouring sentences), the server's
/// `retrieval.default_chunk_tokens` above [`SMALL_BUDGET_TOKENS`] (fewer candidates to pack when
/// whole sections fit anyway), and never more than the budget, so a caller with a tiny budget
/// gets small chunks rather than none.
pub fn budget_chunk_tokens(token_budget: u32, default_chunk_tokens: u32) -> u32 {
    let size = if token_budget <= SMALL_BUDGET_TOKENS {
        SMALL_BUDGET_CHUNK_TOKENS.min(default_chunk_tokens)
    } else {
        default_chunk_tokens
    };
    size.min(token_budget.max(1))
}

/// The sizes a query's sections are cut at. A size the request or the collection sets is the
/// only one. Otherwise the budget's chunk size `options.max_size` ([`budget_chunk_tokens`]) is
/// joined by half of it and by twice it, each at most the server's `default_chunk_tokens` (or the
/// budget's size when that is larger), at most the budget and above the overlap: the candidates then range from about
/// one sentence to a paragraph and the scores choose among them. Measured on both dev sets
/// (docs/notebook/benchmarks-notebook.md, "Chunks of several sizes"): on squad-a, whose answers are phrases, the
/// half-size chunks lift answer recall at 128 tokens from 0.872 to 0.912 on their own; on
/// covid-a, whose answers are sentences of long papers, the double-size ones lift 256–1,024 by
/// 0.02–0.03 on their own; the three sizes together keep most of both.
pub fn chunk_sizes(
    requested: &ChunkingSpec,
    collection: &ChunkingSpec,
    options: &ChunkOptions,
    token_budget: u32,
    default_chunk_tokens: u32,
) -> Vec<u32> {
    let size = options.max_size;
    if requested.max_tokens.is_some() || collection.max_tokens.is_some() {
        return vec![size];
    }
    let largest = default_chunk_tokens.max(size).min(token_budget);
    let mut sizes = vec![size];
    for other in [size / 2, size.saturating_mul(2)] {
        if other > options.overlap && other <= largest && !sizes.contains(&other) {
            sizes.push(other);
        }
    }
    sizes
}

/// The semantic strategy's breakpoint rule; the default when the query names none.
pub fn semantic_threshold(requested: &ChunkingSpec) -> SemanticThreshold {
    requested
        .semantic
        .map(|rule| rule.threshold())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_grows_with_the_budget_unless_the_request_sets_it() {
        let limits = LimitsConfig::default();
        let depth = |requested, budget| resolve_top_k(requested, budget, 1024, &limits, 8);
        // Small budgets keep the server's default depth.
        assert_eq!(depth(None, 128), 8);
        assert_eq!(depth(None, 512), 8);
        // Then twelve sections per section's worth of budget, up to the limit.
        assert_eq!(depth(None, 1024), 12);
        assert_eq!(depth(None, 2048), 24);
        assert_eq!(depth(None, 4096), 48);
        assert_eq!(depth(None, 8192), 96);
        assert_eq!(depth(None, 16384), limits.max_top_k);
        assert_eq!(depth(None, 32768), limits.max_top_k);
        // Smaller sections need more of them: the same text, at least 8,192 tokens of it, and
        // beyond the limit only as many as hold twice the budget.
        let small = |budget| resolve_top_k(None, budget, 256, &limits, 8);
        assert_eq!(small(128), 32);
        assert_eq!(small(512), 32);
        assert_eq!(small(1024), 48);
        assert_eq!(small(2048), 96);
        assert_eq!(small(4096), limits.max_top_k);
        assert_eq!(small(8192), limits.max_top_k);
        assert_eq!(small(16384), 128);
        assert_eq!(small(32768), 256);
        // Never fewer than the server's default depth.
        assert_eq!(resolve_top_k(None, 128, 4096, &limits, 8), 8);
        // An explicit top_k always wins, at any budget.
        assert_eq!(depth(Some(3), 32768), 3);
        assert_eq!(depth(Some(50), 128), 50);
    }

    #[test]
    fn sizes_range_from_half_to_twice_the_budget_size_unless_a_size_is_set() {
        let limits = LimitsConfig::default();
        let unset = ChunkingSpec::default();
        let sizes = |requested: &ChunkingSpec, collection: &ChunkingSpec, budget| {
            let options =
                resolve_chunking(requested, collection, budget, 128, &limits).expect("valid");
            chunk_sizes(requested, collection, &options, budget, 128)
        };
        // Small budgets: 64-token chunks with 32- and 128-token ones beside them.
        assert_eq!(sizes(&unset, &unset, 128), [64, 32, 128]);
        assert_eq!(sizes(&unset, &unset, 1024), [64, 32, 128]);
        // From 2,048: 128 and 64; never above the server's default size.
        assert_eq!(sizes(&unset, &unset, 2048), [128, 64]);
        assert_eq!(sizes(&unset, &unset, 32768), [128, 64]);
        // Never above the budget.
        assert_eq!(sizes(&unset, &unset, 100), [64, 32]);
        assert_eq!(sizes(&unset, &unset, 20), [20, 10]);
        assert_eq!(sizes(&unset, &unset, 1), [1]);
        // A size the request or the collection sets is the only one.
        let asked = ChunkingSpec {
            max_tokens: Some(300),
            ..ChunkingSpec::default()
        };
        assert_eq!(sizes(&asked, &unset, 128), [300]);
        assert_eq!(sizes(&unset, &asked, 32768), [300]);
        // Every size stays above the overlap.
        let overlapping = ChunkingSpec {
            overlap_tokens: Some(40),
            ..ChunkingSpec::default()
        };
        assert_eq!(sizes(&overlapping, &unset, 1024), [64, 128]);
    }

    #[test]
    fn chunk_size_follows_the_budget_unless_the_request_or_collection_sets_it() {
        let limits = LimitsConfig::default();
        let unset = ChunkingSpec::default();
        let size = |requested: &ChunkingSpec, collection: &ChunkingSpec, budget| {
            resolve_chunking(requested, collection, budget, 128, &limits)
                .expect("valid")
                .max_size
        };
        assert_eq!(size(&unset, &unset, 20), 20);
        assert_eq!(size(&unset, &unset, 128), 64);
        assert_eq!(size(&unset, &unset, 1024), 64);
        assert_eq!(size(&unset, &unset, 2048), 128);
        assert_eq!(size(&unset, &unset, 8192), 128);
        let asked = ChunkingSpec {
            max_tokens: Some(300),
            ..ChunkingSpec::default()
        };
        assert_eq!(size(&asked, &unset, 128), 300);
        assert_eq!(size(&unset, &asked, 32768), 300);
        let options = resolve_chunking(&unset, &unset, 128, 128, &limits).expect("valid");
        assert_eq!(options.strategy, Strategy::Sentence);
    }
}
