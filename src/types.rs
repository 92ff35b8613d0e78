//! Domain types shared by every layer below the edge: the service, the pipelines and the index.
//! Proto types never reach past `api`; these are what the service layer speaks. A leaf: it imports
//! nothing of the crate but the text crate's own types (the chunking strategies, the default
//! tokenizer's name, the query normalisation), which it re-exports under the names the server
//! has always used.

use std::collections::BTreeMap;
use std::ops::Range;

pub use lathe_text::tokenizer::DEFAULT_TOKENIZER;

pub use lathe_text::chunk::{SemanticThreshold, Strategy, Unit};

/// Joins the titles of a heading path into one line: a chunk's section title, and its heading
/// line in position order.
pub const HEADING_SEPARATOR: &str = " > ";

/// Separator of a metadata term `key\u{1f}value` (ASCII unit separator: never typed by users);
/// a metadata key must not hold it, or two different pairs would be one term.
pub const METADATA_SEPARATOR: char = '\u{1f}';

pub use lathe_text::normalise_query;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DocumentFormat {
    Plain,
    Markdown,
    Html,
}

/// A section boundary given by the caller, in code points into the document text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionBoundary {
    pub start: u64,
    pub end: u64,
    pub title: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentInput {
    pub id: String,
    pub title: String,
    pub text: String,
    pub format: DocumentFormat,
    pub metadata: BTreeMap<String, String>,
    /// Caller-given sections; `None` means split by structure.
    pub sections: Option<Vec<SectionBoundary>>,
}

/// Chunking as asked: unset fields fall back to the collection's default, then the server's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ChunkingSpec {
    pub strategy: Option<Strategy>,
    pub max_tokens: Option<u32>,
    pub overlap_tokens: Option<u32>,
    pub unit: Unit,
    pub separators: Vec<String>,
    /// Breakpoint rule of the semantic strategy; `None` = percentile 95.
    pub semantic: Option<SemanticRule>,
}

/// A semantic breakpoint rule and its amount (kept as f32 bits so requests stay hashable for the
/// result cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SemanticRule {
    pub kind: SemanticKind,
    pub amount_bits: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SemanticKind {
    Percentile,
    StdDev,
    Interquartile,
    Gradient,
}

impl SemanticRule {
    pub fn threshold(self) -> SemanticThreshold {
        use SemanticThreshold as T;
        let amount = f32::from_bits(self.amount_bits);
        match self.kind {
            SemanticKind::Percentile => T::Percentile(amount),
            SemanticKind::StdDev => T::StdDev(amount),
            SemanticKind::Interquartile => T::Interquartile(amount),
            SemanticKind::Gradient => T::Gradient(amount),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectionSettings {
    pub budget_tokenizer: String,
    pub default_chunking: ChunkingSpec,
    pub section_tokens: u32,
}

/// The section size of a collection that sets none: small enough that the coarse stage ranks
/// passages rather than whole chapters (measured on squad-a and covid-a against 128 and 1,024;
/// see docs/notebook/benchmarks-notebook.md, "The defaults as shipped, covid-a").
pub const DEFAULT_SECTION_TOKENS: u32 = 256;

impl Default for CollectionSettings {
    fn default() -> Self {
        Self {
            budget_tokenizer: DEFAULT_TOKENIZER.to_string(),
            default_chunking: ChunkingSpec::default(),
            section_tokens: DEFAULT_SECTION_TOKENS,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollectionStats {
    pub documents: u64,
    pub sections: u64,
    pub bytes: u64,
    pub generation: u64,
    /// The dense index beside the lexical one; `None` without the neural stage.
    pub dense: Option<DenseStats>,
}

/// How the dense index lines up with the lexical one. They agree when every section has a vector
/// and there is no other: `sections_with_vector == sections == vectors`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DenseStats {
    /// Live vectors in the dense index.
    pub vectors: u64,
    /// Sections of the visible snapshot whose vector is live in the dense index.
    pub sections_with_vector: u64,
}

/// Whether a collection can serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectionState {
    Ready,
    /// Its own files are missing, truncated or garbled: calls answer DATA_LOSS.
    Damaged,
    /// Something outside its folder (its tokenizer file) is missing; its data is intact: calls
    /// answer FAILED_PRECONDITION.
    Offline,
}

impl CollectionState {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Damaged => "damaged",
            Self::Offline => "offline",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CollectionInfo {
    pub name: String,
    pub state: CollectionState,
    /// Why the collection is not ready: the file and the cause. Empty when ready.
    pub reason: String,
    /// `None` when its `collection.json` cannot be read.
    pub settings: Option<CollectionSettings>,
    /// `None` when the collection is not open or its statistics cannot be read.
    pub stats: Option<CollectionStats>,
    /// The aliases naming it, by name.
    pub aliases: Vec<String>,
}

/// An alias and the collection it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alias {
    pub alias: String,
    pub collection: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Filter {
    /// (key, value) pairs that must all match, sorted and deduplicated.
    pub metadata: Vec<(String, String)>,
    /// When non-empty, only these documents (sorted, deduplicated).
    pub doc_ids: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ResultOrder {
    #[default]
    Score,
    Position,
}

/// An `f32` compared and hashed by its bits, so that a query holding one can key a cache.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExactF32(pub f32);

impl PartialEq for ExactF32 {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for ExactF32 {}

impl std::hash::Hash for ExactF32 {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// What a caller asks of the chosen chunks beyond their score.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ChunkSelection {
    /// Chunks scoring below this are dropped.
    pub min_score: Option<ExactF32>,
    /// At most this many returned chunks (merged spans) per document.
    pub max_chunks_per_document: Option<u32>,
    /// MMR trade-off in 0..=1; 0 is off. Unset: the server's `retrieval.ambiguous_diversity`
    /// when the query is ambiguous ([`crate::query::diversify::is_ambiguous`]), else off.
    pub diversity: Option<ExactF32>,
}

/// A validated retrieve request, with every default resolved except the collection's chunking.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RetrieveQuery {
    pub collection: String,
    /// Trimmed, inner whitespace collapsed to single spaces.
    pub query: String,
    /// Sections to retrieve; none: the budget decides ([`crate::query::plan::resolve_top_k`]).
    pub top_k: Option<u32>,
    pub token_budget: u32,
    pub chunking: ChunkingSpec,
    pub filter: Filter,
    pub order: ResultOrder,
    pub selection: ChunkSelection,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScoreParts {
    pub bm25: f32,
    pub section: f32,
    pub dense: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RetrievedChunk {
    pub doc_id: String,
    pub section_ordinal: u64,
    pub heading_path: Vec<String>,
    pub doc_title: String,
    pub text: String,
    /// Text the caller puts before `text`, with a line break between: the header of the table the
    /// chunk continues without holding it. Empty for most chunks.
    pub context: String,
    /// UTF-8 byte range in the document text.
    pub bytes: Range<u64>,
    /// Code-point range in the document text.
    pub chars: Range<u64>,
    pub token_count: u32,
    pub score: f32,
    pub parts: ScoreParts,
    pub strategy: Strategy,
    pub metadata: BTreeMap<String, String>,
}

impl RetrievedChunk {
    pub fn section_id(&self) -> String {
        format!("{}#{}", self.doc_id, self.section_ordinal)
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.doc_id.len()
            + self.doc_title.len()
            + self.text.len()
            + self.context.len()
            + self.heading_path.iter().map(String::len).sum::<usize>()
            + self
                .metadata
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
            + std::mem::size_of::<Self>()
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RetrieveResult {
    pub chunks: Vec<RetrievedChunk>,
    pub tokens_used: u32,
    pub token_budget: u32,
    pub generation: u64,
    pub cache_hit: bool,
    /// (stage, microseconds), in pipeline order.
    pub timings: Vec<(&'static str, u64)>,
    pub sections_considered: u32,
    pub chunks_considered: u32,
    /// Sections whose analysis was not cached (for metrics; not sent to clients).
    pub section_cache_misses: u32,
    /// With replication: the log position applied when the answer's snapshot was taken.
    pub log_position: u64,
    /// Where the query vector came from (for metrics; not sent to clients).
    pub query_vector: QueryVectorSource,
}

/// Where a computed answer's query vector came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QueryVectorSource {
    /// No vector: the collection has no dense index or the server no model.
    #[default]
    None,
    /// The model embedded the query.
    Model,
    /// The query-vector cache held it (the same normalised query and model, at any budget).
    Cache,
}

impl RetrieveResult {
    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self
                .chunks
                .iter()
                .map(RetrievedChunk::heap_bytes)
                .sum::<usize>()
    }
}

/// How a write is to be acknowledged.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    /// Answer once the write is visible to the next Retrieve.
    pub wait: bool,
    /// Idempotency key; empty: none.
    pub write_id: String,
    /// With `wait`: when to stop waiting and answer that the write is queued (the call's
    /// deadline, less the time to answer).
    pub wait_until: Option<std::time::Instant>,
}

/// What a write reports back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WriteOutcome {
    pub documents: u32,
    pub sections: u32,
    /// Generation at which the write is visible (0 when not waited for).
    pub generation: u64,
    /// Read-your-writes: on a single node the write's place in the queue (its operation id),
    /// with replication its log position.
    pub consistency_token: u64,
    /// On a single node: the write's operation as it stood when answered (for an upload, the
    /// last one's).
    pub operation: Option<Operation>,
    /// Every operation the write queued, in order.
    pub operation_ids: Vec<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationKind {
    Upsert,
    Delete,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationState {
    /// Durable in the write queue, waiting for the collection's index worker.
    Queued,
    /// Being embedded and applied.
    Running,
    /// Visible to every Retrieve.
    Applied,
    /// Not applied (or applied up to `documents_done`); `error` says why.
    Failed,
}

impl OperationState {
    pub fn ended(self) -> bool {
        matches!(self, Self::Applied | Self::Failed)
    }
}

/// A queued write and how far it has come. On a single node its id is its place in the write
/// queue, which is also its consistency token.
#[derive(Clone, Debug, PartialEq)]
pub struct Operation {
    pub id: u64,
    pub collection: String,
    pub kind: OperationKind,
    pub state: OperationState,
    pub documents_total: u32,
    pub documents_done: u32,
    pub bytes_total: u64,
    pub bytes_done: u64,
    /// While running: so far; once applied: overall.
    pub bytes_per_second: f64,
    /// While queued or running, from the collection's recent rate.
    pub eta_seconds: Option<f64>,
    pub error: String,
    pub write_id: String,
    pub created_unix_ms: u64,
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    pub sections: u32,
    pub generation: u64,
}
