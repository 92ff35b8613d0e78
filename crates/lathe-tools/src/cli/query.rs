//! `lathe query`: one retrieve request, printed with scores and offsets, or as proto3 JSON.

use anyhow::Context;

use crate::proto;

#[derive(clap::Args, Debug)]
pub struct QueryArgs {
    /// The question.
    pub query: String,
    /// The collection (or alias) to ask.
    #[arg(long, short)]
    pub collection: String,
    /// The server: `host:port`, or an `http://` or `https://` URI.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    /// LLM token budget for the returned text.
    #[arg(long, short, default_value_t = 512)]
    pub budget: u32,
    /// Sections retrieved and re-chunked (default: the server's, deeper for larger budgets).
    #[arg(long)]
    pub top_k: Option<u32>,
    /// fixed, sentence, recursive, structure, auto, semantic, csv or code (default: the collection's).
    #[arg(long)]
    pub strategy: Option<String>,
    /// Largest chunk, in --unit (default: the collection's, else the server's, at most the budget).
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// Overlap between neighbouring chunks of the fixed strategy, in --unit.
    #[arg(long)]
    pub overlap: Option<u32>,
    /// Unit of the fixed strategy: tokens, words or chars.
    #[arg(long, default_value = "tokens")]
    pub unit: String,
    /// Order of results: score or position.
    #[arg(long, default_value = "score")]
    pub order: String,
    /// Only documents with this metadata (key=value, repeatable).
    #[arg(long = "filter", value_name = "KEY=VALUE")]
    pub filters: Vec<String>,
    /// Drop chunks scoring below this.
    #[arg(long)]
    pub min_score: Option<f32>,
    /// At most this many chunks of one document.
    #[arg(long)]
    pub max_chunks_per_document: Option<u32>,
    /// MMR trade-off in 0..=1 (0: off): higher prefers chunks unlike those already chosen.
    /// Unset: the server applies it only to an ambiguous query (docs/retrieval.md, "Budget-aware defaults").
    #[arg(long)]
    pub diversity: Option<f32>,
    /// With replication: answer once the replica has applied the log up to this position (a
    /// write's consistency token).
    #[arg(long, default_value_t = 0)]
    pub consistency_token: u64,
    /// Print the RetrieveResponse in the proto3 JSON mapping, as the HTTP/JSON API and grpcurl
    /// write it (lowerCamelCase names, 64-bit integers as strings, defaults left out).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: crate::client::ConnectArgs,
}

pub async fn query(args: QueryArgs) -> anyhow::Result<()> {
    let strategy = match args.strategy.as_deref() {
        None => proto::ChunkStrategy::Unspecified,
        Some(name) => crate::client::strategy_from_name(name)?,
    };
    let unit =
        proto::ChunkUnit::from_str_name(&format!("CHUNK_UNIT_{}", args.unit.to_ascii_uppercase()))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown unit `{}`: expected tokens, words or chars",
                    args.unit
                )
            })?;
    let order = match args.order.as_str() {
        "score" => proto::ResultOrder::Score,
        "position" => proto::ResultOrder::Position,
        other => anyhow::bail!("unknown order `{other}`: expected score or position"),
    };
    let mut metadata = Vec::new();
    for filter in &args.filters {
        let (key, value) = filter
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("filter `{filter}` must be KEY=VALUE"))?;
        metadata.push(proto::MetadataTerm {
            key: key.to_string(),
            value: value.to_string(),
        });
    }
    let request = proto::RetrieveRequest {
        collection: args.collection.clone(),
        query: args.query.clone(),
        top_k: args.top_k,
        token_budget: args.budget,
        chunking: Some(proto::ChunkingOptions {
            strategy: strategy as i32,
            max_tokens: args.max_tokens,
            overlap_tokens: args.overlap,
            unit: unit as i32,
            separators: Vec::new(),
            ..Default::default()
        }),
        filter: Some(proto::Filter {
            metadata,
            doc_ids: Vec::new(),
        }),
        order: order as i32,
        min_score: args.min_score,
        max_chunks_per_document: args.max_chunks_per_document,
        diversity: args.diversity,
        consistency_token: args.consistency_token,
    };
    let mut client = args.connect.connect(&args.addr).await?;
    let response = client
        .retrieve(request)
        .await
        .map_err(|status| anyhow::anyhow!("{}", crate::client::status_line(&status)))?
        .into_inner();
    let mut out = std::io::stdout().lock();
    match print_response(&mut out, &response, args.json) {
        // `lathe query ... | head` closes the pipe early: that is not an error.
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => result.context("writing the answer"),
    }
}

fn print_response(
    out: &mut impl std::io::Write,
    response: &proto::RetrieveResponse,
    json: bool,
) -> std::io::Result<()> {
    if json {
        let text = serde_json::to_string(response).map_err(std::io::Error::other)?;
        return writeln!(out, "{text}");
    }
    for (rank, chunk) in response.chunks.iter().enumerate() {
        let bytes = chunk.bytes.unwrap_or_default();
        let chars = chunk.chars.unwrap_or_default();
        let parts = chunk.score_parts.unwrap_or_default();
        writeln!(
            out,
            "#{} {} [{}] score {:.3} (bm25 {:.2}, section {:.2}, dense {:.2}) · {} tokens · bytes {}..{} · chars {}..{} · {}",
            rank + 1,
            chunk.section_id,
            chunk.section_title,
            chunk.score,
            parts.bm25,
            parts.section,
            parts.dense,
            chunk.token_count,
            bytes.start,
            bytes.end,
            chars.start,
            chars.end,
            proto::ChunkStrategy::try_from(chunk.strategy).map_or("?", |s| s.as_str_name()),
        )?;
        if !chunk.context.is_empty() {
            writeln!(out, "{}", chunk.context)?;
        }
        writeln!(out, "{}\n", chunk.text.trim())?;
    }
    let timings: Vec<String> = response
        .timings
        .iter()
        .map(|t| format!("{} {} µs", t.stage, t.micros))
        .collect();
    writeln!(
        out,
        "{} chunks, {} / {} tokens, from index generation {}, cache {}; {}",
        response.chunks.len(),
        response.tokens_used,
        response.token_budget,
        response.generation,
        if response.cache_hit { "hit" } else { "miss" },
        timings.join(", ")
    )
}
