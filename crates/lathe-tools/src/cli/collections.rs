//! `lathe collections` (list, get, create, delete) and `lathe alias` (list, create, switch,
//! delete): a server's collections and the second names it serves them under, one line each.

use crate::proto;

#[derive(clap::Args, Debug)]
pub struct CollectionsArgs {
    /// The server: `host:port`, or an `http://` or `https://` URI.
    #[arg(long, default_value = "127.0.0.1:50051", global = true)]
    pub addr: String,
    #[command(flatten)]
    pub connect: crate::client::ConnectArgs,
    #[command(subcommand)]
    pub command: CollectionsCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum CollectionsCommand {
    /// One line per collection: name, state, documents, sections and the aliases naming it.
    List,
    /// One collection: its line, then its settings, sizes and, when it does not serve, the
    /// reason.
    Get {
        /// A collection, or an alias (the collection it names).
        name: String,
    },
    /// Create an empty collection.
    Create {
        /// 1 to 64 characters of [A-Za-z0-9_-].
        name: String,
        /// Target size of a section cut at ingest, in budget tokens (server default: 256).
        #[arg(long)]
        section_tokens: Option<u32>,
        /// The tokenizer that counts budgets: minilm, cl100k_base, o200k_base or a path to a
        /// tokenizer.json on the server (server default: minilm).
        #[arg(long)]
        budget_tokenizer: Option<String>,
    },
    /// Delete a collection and its documents (refused while an alias names it).
    Delete {
        /// The collection (not an alias).
        name: String,
    },
}

#[derive(clap::Args, Debug)]
pub struct AliasArgs {
    /// The server: `host:port`, or an `http://` or `https://` URI.
    #[arg(long, default_value = "127.0.0.1:50051", global = true)]
    pub addr: String,
    #[command(flatten)]
    pub connect: crate::client::ConnectArgs,
    #[command(subcommand)]
    pub command: AliasCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum AliasCommand {
    /// One line per alias: `ALIAS -> COLLECTION`, by alias name.
    List,
    /// Create an alias naming an existing collection.
    Create {
        /// The alias: a name no collection or other alias holds (the rule of collection names).
        alias: String,
        /// The collection it names (never another alias).
        collection: String,
    },
    /// Point an existing alias at another collection, at once for every reader.
    Switch {
        /// The alias to point elsewhere.
        alias: String,
        /// The collection it names from now on (never another alias).
        collection: String,
    },
    /// Delete an alias (its collection stays).
    Delete {
        /// The alias to delete.
        alias: String,
    },
}

pub async fn collections(args: CollectionsArgs) -> anyhow::Result<()> {
    let mut client = args.connect.connect(&args.addr).await?;
    match args.command {
        CollectionsCommand::List => {
            let listed = client
                .list_collections(proto::ListCollectionsRequest {})
                .await?
                .into_inner()
                .collections;
            for collection in &listed {
                println!("{}", describe(collection));
            }
        }
        CollectionsCommand::Get { name } => {
            let collection = client
                .get_collection(proto::GetCollectionRequest { name })
                .await?
                .into_inner();
            println!("{}", describe(&collection));
            for line in details(&collection) {
                println!("  {line}");
            }
        }
        CollectionsCommand::Create {
            name,
            section_tokens,
            budget_tokenizer,
        } => {
            let settings = proto::CollectionSettings {
                budget_tokenizer: budget_tokenizer.unwrap_or_default(),
                default_chunking: None,
                section_tokens,
            };
            let created = client
                .create_collection(proto::CreateCollectionRequest {
                    name,
                    settings: Some(settings),
                })
                .await?
                .into_inner();
            println!("{}", describe(&created));
        }
        CollectionsCommand::Delete { name } => {
            client
                .delete_collection(proto::DeleteCollectionRequest { name: name.clone() })
                .await?;
            println!("deleted {name}");
        }
    }
    Ok(())
}

pub async fn alias(args: AliasArgs) -> anyhow::Result<()> {
    let mut client = args.connect.connect(&args.addr).await?;
    let changed = match args.command {
        AliasCommand::List => {
            let listed = client
                .list_aliases(proto::ListAliasesRequest {})
                .await?
                .into_inner()
                .aliases;
            for alias in &listed {
                println!("{}", describe_alias(alias));
            }
            return Ok(());
        }
        AliasCommand::Create { alias, collection } => client
            .create_alias(proto::CreateAliasRequest { alias, collection })
            .await?
            .into_inner(),
        AliasCommand::Switch { alias, collection } => client
            .switch_alias(proto::SwitchAliasRequest { alias, collection })
            .await?
            .into_inner(),
        AliasCommand::Delete { alias } => {
            client
                .delete_alias(proto::DeleteAliasRequest {
                    alias: alias.clone(),
                })
                .await?;
            println!("deleted alias {alias}");
            return Ok(());
        }
    };
    println!("{}", describe_alias(&changed));
    Ok(())
}

fn describe_alias(alias: &proto::Alias) -> String {
    format!("{} -> {}", alias.alias, alias.collection)
}

/// `docs  ready  documents 12  sections 40  aliases live,staging` (`-` for what is unknown or
/// empty: a collection that does not serve has no sizes).
fn describe(collection: &proto::CollectionInfo) -> String {
    let (documents, sections) = match &collection.stats {
        Some(stats) => (stats.documents.to_string(), stats.sections.to_string()),
        None => ("-".to_string(), "-".to_string()),
    };
    let aliases = if collection.aliases.is_empty() {
        "-".to_string()
    } else {
        collection.aliases.join(",")
    };
    format!(
        "{}  {}  documents {documents}  sections {sections}  aliases {aliases}",
        collection.name,
        state_name(collection.state)
    )
}

/// The lines `lathe collections get` prints under the collection's own.
fn details(collection: &proto::CollectionInfo) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(settings) = &collection.settings {
        let tokenizer = match settings.budget_tokenizer.as_str() {
            "" => "minilm (default)",
            named => named,
        };
        lines.push(format!("budget tokenizer {tokenizer}"));
        if let Some(tokens) = settings.section_tokens {
            lines.push(format!("section tokens {tokens}"));
        }
        if let Some(chunking) = &settings.default_chunking {
            lines.push(format!("default chunking {}", describe_chunking(chunking)));
        }
    }
    if let Some(stats) = &collection.stats {
        lines.push(format!(
            "bytes {}  generation {}",
            stats.bytes, stats.generation
        ));
        if let Some(dense) = &stats.dense {
            lines.push(format!(
                "dense vectors {}  sections with a vector {}",
                dense.vectors, dense.sections_with_vector
            ));
        }
    }
    if !collection.reason.is_empty() {
        lines.push(format!("reason {}", collection.reason));
    }
    lines
}

/// `auto`, or `fixed, max 128 tokens, overlap 16 tokens`; `by the budget` when the collection
/// leaves the strategy to each request's budget.
fn describe_chunking(chunking: &proto::ChunkingOptions) -> String {
    let strategy = match proto::ChunkStrategy::try_from(chunking.strategy) {
        Ok(proto::ChunkStrategy::Unspecified) => "by the budget".to_string(),
        Ok(strategy) => enum_name(strategy.as_str_name(), "CHUNK_STRATEGY_"),
        Err(_) => format!("strategy {}", chunking.strategy),
    };
    let unit = proto::ChunkUnit::try_from(chunking.unit)
        .map(|u| enum_name(u.as_str_name(), "CHUNK_UNIT_"))
        .unwrap_or_else(|_| format!("unit {}", chunking.unit));
    let mut parts = vec![strategy];
    if let Some(max) = chunking.max_tokens {
        parts.push(format!("max {max} {unit}"));
    }
    if let Some(overlap) = chunking.overlap_tokens.filter(|o| *o > 0) {
        parts.push(format!("overlap {overlap} {unit}"));
    }
    parts.join(", ")
}

/// `ready`, `damaged`, `offline` (the proto name without its prefix).
fn state_name(state: i32) -> String {
    proto::CollectionState::try_from(state)
        .map(|s| enum_name(s.as_str_name(), "COLLECTION_STATE_"))
        .unwrap_or_else(|_| format!("state {state}"))
}

fn enum_name(proto_name: &str, prefix: &str) -> String {
    proto_name.trim_start_matches(prefix).to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collection_reads_as_one_line_with_dashes_for_what_it_lacks() {
        let mut info = proto::CollectionInfo {
            name: "docs".into(),
            state: proto::CollectionState::Ready as i32,
            stats: Some(proto::CollectionStats {
                documents: 12,
                sections: 40,
                ..Default::default()
            }),
            aliases: vec!["live".into(), "staging".into()],
            ..Default::default()
        };
        assert_eq!(
            describe(&info),
            "docs  ready  documents 12  sections 40  aliases live,staging"
        );
        info.state = proto::CollectionState::Damaged as i32;
        info.stats = None;
        info.aliases.clear();
        info.reason = "segment.idx: truncated".into();
        assert_eq!(
            describe(&info),
            "docs  damaged  documents -  sections -  aliases -"
        );
        assert_eq!(details(&info), vec!["reason segment.idx: truncated"]);
    }

    #[test]
    fn settings_read_with_their_units() {
        let chunking = proto::ChunkingOptions {
            strategy: proto::ChunkStrategy::Fixed as i32,
            max_tokens: Some(128),
            overlap_tokens: Some(16),
            unit: proto::ChunkUnit::Words as i32,
            ..Default::default()
        };
        assert_eq!(
            describe_chunking(&chunking),
            "fixed, max 128 words, overlap 16 words"
        );
        let info = proto::CollectionInfo {
            settings: Some(proto::CollectionSettings {
                budget_tokenizer: String::new(),
                default_chunking: Some(proto::ChunkingOptions::default()),
                section_tokens: Some(256),
            }),
            ..Default::default()
        };
        assert_eq!(
            details(&info),
            vec![
                "budget tokenizer minilm (default)",
                "section tokens 256",
                "default chunking by the budget",
            ]
        );
    }
}
