//! `lathe snapshot` (create, list, delete, download) and `lathe restore`: backups of
//! collections, taken by the server while it serves, and collections made from them.

use std::io::{Read, Write};
use std::path::PathBuf;

use crate::proto;
/// Bytes per uploaded message (the server's default message limit is larger).
const UPLOAD_CHUNK: usize = 1 << 20;

#[derive(clap::Args, Debug)]
pub struct SnapshotArgs {
    /// The server: `host:port`, or an `http://` or `https://` URI.
    #[arg(long, default_value = "127.0.0.1:50051", global = true)]
    pub addr: String,
    #[command(flatten)]
    pub connect: crate::client::ConnectArgs,
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Snapshot collections (into the server's data dir, `snapshots/<collection>/`).
    Create {
        /// The collections to snapshot.
        collections: Vec<String>,
        /// Snapshot every collection the server lists as ready.
        #[arg(long, conflicts_with = "collections")]
        all: bool,
        /// Then keep only this many newest snapshots of each collection snapshotted.
        #[arg(long)]
        keep: Option<usize>,
        /// Also download each new snapshot into this folder.
        #[arg(long)]
        download_to: Option<PathBuf>,
    },
    /// List snapshots (of one collection, or of all), newest first.
    List {
        /// Only this collection's snapshots.
        collection: Option<String>,
    },
    /// Delete one snapshot.
    Delete {
        /// The collection the snapshot was taken of.
        collection: String,
        /// The snapshot's name, as `lathe snapshot list` prints it after the `/`.
        name: String,
    },
    /// Copy a snapshot off the server into a file.
    Download {
        /// The collection the snapshot was taken of.
        collection: String,
        /// The snapshot's name, as `lathe snapshot list` prints it after the `/`.
        name: String,
        /// The file to write (default: the snapshot's name, in the current folder).
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// A snapshot file to upload (as `lathe snapshot download` writes it).
    pub file: Option<PathBuf>,
    /// The collection to create (default: the one the snapshot was taken of).
    #[arg(long, short)]
    pub collection: Option<String>,
    /// Restore a snapshot the server keeps instead: `COLLECTION/NAME`, as `lathe snapshot list`
    /// prints it.
    #[arg(long, conflicts_with = "file")]
    pub snapshot: Option<String>,
    /// The server: `host:port`, or an `http://` or `https://` URI.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    #[command(flatten)]
    pub connect: crate::client::ConnectArgs,
}

pub async fn snapshot(args: SnapshotArgs) -> anyhow::Result<()> {
    let mut client = args.connect.connect(&args.addr).await?;
    match args.command {
        SnapshotCommand::Create {
            collections,
            all,
            keep,
            download_to,
        } => create(&mut client, collections, all, keep, download_to).await,
        SnapshotCommand::List { collection } => {
            let listed = client
                .list_snapshots(proto::ListSnapshotsRequest {
                    collection: collection.unwrap_or_default(),
                })
                .await?
                .into_inner()
                .snapshots;
            for snapshot in &listed {
                println!("{}", describe(snapshot));
            }
            Ok(())
        }
        SnapshotCommand::Delete { collection, name } => {
            client
                .delete_snapshot(proto::DeleteSnapshotRequest { collection, name })
                .await?;
            Ok(())
        }
        SnapshotCommand::Download {
            collection,
            name,
            out,
        } => {
            let out = out.unwrap_or_else(|| PathBuf::from(&name));
            let bytes = download(&mut client, &collection, &name, &out).await?;
            println!("{} ({bytes} bytes)", out.display());
            Ok(())
        }
    }
}

async fn create(
    client: &mut crate::client::Client,
    mut collections: Vec<String>,
    all: bool,
    keep: Option<usize>,
    download_to: Option<PathBuf>,
) -> anyhow::Result<()> {
    if all {
        let listed = client
            .list_collections(proto::ListCollectionsRequest {})
            .await?
            .into_inner()
            .collections;
        collections = listed
            .into_iter()
            .filter(|c| c.state == proto::CollectionState::Ready as i32)
            .map(|c| c.name)
            .collect();
    } else if collections.is_empty() {
        anyhow::bail!("name the collections to snapshot, or give --all");
    }
    let mut failed = Vec::new();
    for collection in collections {
        let taken = client
            .create_snapshot(proto::CreateSnapshotRequest {
                collection: collection.clone(),
            })
            .await;
        let taken = match taken {
            Ok(taken) => taken.into_inner(),
            Err(status) => {
                // One collection never stops the others' backups.
                eprintln!("{collection}: {}", crate::client::status_line(&status));
                failed.push(collection);
                continue;
            }
        };
        println!("{}", describe(&taken));
        if let Some(folder) = &download_to {
            std::fs::create_dir_all(folder)?;
            download(client, &collection, &taken.name, &folder.join(&taken.name)).await?;
        }
        if let Some(keep) = keep {
            prune(client, &collection, keep).await?;
        }
    }
    match failed.as_slice() {
        [] => Ok(()),
        failed => anyhow::bail!("no snapshot of {}", failed.join(", ")),
    }
}

/// Deletes all but the `keep` newest snapshots of `collection`.
async fn prune(
    client: &mut crate::client::Client,
    collection: &str,
    keep: usize,
) -> anyhow::Result<()> {
    let listed = client
        .list_snapshots(proto::ListSnapshotsRequest {
            collection: collection.to_string(),
        })
        .await?
        .into_inner()
        .snapshots;
    for old in listed.into_iter().skip(keep) {
        client
            .delete_snapshot(proto::DeleteSnapshotRequest {
                collection: old.collection.clone(),
                name: old.name.clone(),
            })
            .await?;
        println!("deleted {}/{}", old.collection, old.name);
    }
    Ok(())
}

/// Writes the snapshot to `out` (through a `.partial` file renamed at the end); its bytes.
async fn download(
    client: &mut crate::client::Client,
    collection: &str,
    name: &str,
    out: &std::path::Path,
) -> anyhow::Result<u64> {
    let mut stream = client
        .download_snapshot(proto::DownloadSnapshotRequest {
            collection: collection.to_string(),
            name: name.to_string(),
        })
        .await?
        .into_inner();
    let partial = out.with_extension("partial");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&partial)?);
    let mut bytes = 0u64;
    while let Some(chunk) = stream.message().await? {
        file.write_all(&chunk.data)?;
        bytes += chunk.data.len() as u64;
    }
    file.into_inner()?.sync_all()?;
    std::fs::rename(&partial, out)?;
    Ok(bytes)
}

pub async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let mut client = args.connect.connect(&args.addr).await?;
    let restored = match (&args.file, &args.snapshot) {
        (None, Some(kept)) => {
            let Some((snapshot_collection, snapshot_name)) = kept.split_once('/') else {
                anyhow::bail!(
                    "--snapshot takes COLLECTION/NAME, as `lathe snapshot list` prints it"
                );
            };
            let collection = args
                .collection
                .clone()
                .unwrap_or_else(|| snapshot_collection.to_string());
            let first = proto::RestoreSnapshotRequest {
                collection,
                snapshot_collection: snapshot_collection.to_string(),
                snapshot_name: snapshot_name.to_string(),
                data: Vec::new(),
            };
            client.restore_snapshot(tokio_stream::iter([first])).await?
        }
        (Some(file), None) => {
            let collection = match &args.collection {
                Some(name) => name.clone(),
                None => collection_of(file)?,
            };
            client
                .restore_snapshot(upload_stream(file, collection)?)
                .await?
        }
        _ => anyhow::bail!("give a snapshot FILE to upload, or --snapshot COLLECTION/NAME"),
    }
    .into_inner();
    let name = restored.collection.map(|c| c.name).unwrap_or_default();
    println!(
        "restored `{name}` from a snapshot of `{}` at generation {} ({} files, {} bytes)",
        restored.source_collection, restored.generation, restored.files, restored.bytes
    );
    Ok(())
}

/// The messages of an upload: the first names the collection, each carries the file's next
/// bytes. Read as they are sent, so a large snapshot is never held in memory.
fn upload_stream(
    file: &std::path::Path,
    collection: String,
) -> anyhow::Result<impl tokio_stream::Stream<Item = proto::RestoreSnapshotRequest>> {
    let mut reader = std::fs::File::open(file)?;
    let mut first = Some(collection);
    let messages = std::iter::from_fn(move || {
        let mut data = vec![0; UPLOAD_CHUNK];
        let mut filled = 0;
        while filled < data.len() {
            match reader.read(&mut data[filled..]) {
                Ok(0) => break,
                Ok(read) => filled += read,
                // The server sees the upload end early and refuses it as cut short.
                Err(_) => break,
            }
        }
        data.truncate(filled);
        let collection = first.take();
        (filled > 0 || collection.is_some()).then(|| proto::RestoreSnapshotRequest {
            collection: collection.unwrap_or_default(),
            data,
            ..Default::default()
        })
    });
    Ok(tokio_stream::iter(messages))
}

/// The collection a snapshot file was taken of, from its name (`<collection>-g<generation>-…`).
fn collection_of(file: &std::path::Path) -> anyhow::Result<String> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    match name.rsplit_once("-g").map(|(collection, _)| collection) {
        Some(collection) if !collection.is_empty() => Ok(collection.to_string()),
        _ => anyhow::bail!(
            "{}: give --collection (the file's name does not say which)",
            file.display()
        ),
    }
}

fn describe(snapshot: &proto::SnapshotInfo) -> String {
    format!(
        "{}/{}  generation {}  {} bytes",
        snapshot.collection, snapshot.name, snapshot.generation, snapshot.bytes
    )
}
