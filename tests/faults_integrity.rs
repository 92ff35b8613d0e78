//! Faults at rest (issue 11, item 2): Lathe never returns text other than what was written, and no
//! file makes the process allocate without bound. Each test runs the real `lathe serve` binary
//! (lexical mode) over real squad-a documents in two collections, damages the files of one
//! (bytes XORed with 0x20, as bit rot or a bad disk would), and retrieves every document by
//! `doc_ids`: each answer is exactly the written text or DATA_LOSS naming the collection and the
//! document, the process stays up, and the healthy collection keeps serving.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use lathe::api::proto;
use lathe::api::proto::lathe_client::LatheClient;
use tonic::transport::Channel;

const DOCUMENTS: usize = 8;
const DAMAGED: &str = "damaged";
const HEALTHY: &str = "healthy";

/// (seed, bytes flipped per file): the two-byte flips, and forty.
const STORE_DAMAGE: [(u64, usize); 6] = [(1, 2), (2, 2), (3, 2), (4, 2), (5, 2), (6, 40)];

struct Doc {
    id: String,
    title: String,
    text: String,
}

/// The first `DOCUMENTS` squad-a articles (`$LATHE_SQUAD_DIR`, else `../shared/eval/squad-a`
/// beside the repository, as for the benches).
fn corpus() -> Vec<Doc> {
    let folder = std::env::var_os("LATHE_SQUAD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/eval/squad-a"));
    let docs = std::fs::read_to_string(folder.join("docs.jsonl"))
        .expect("the squad-a eval set (set LATHE_SQUAD_DIR)");
    docs.lines()
        .take(DOCUMENTS)
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            Doc {
                id: value["doc_id"].as_str().unwrap().to_string(),
                title: value["title"].as_str().unwrap().to_string(),
                text: value["text"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

struct Server {
    process: binary::Server,
    client: LatheClient<Channel>,
}

async fn start(data_dir: &Path) -> Server {
    let process = binary::start(data_dir, &[("LATHE_MODELS__DENSE", "off".to_string())]);
    let client = binary::connect(&process.address).await;
    Server { process, client }
}

impl Server {
    fn assert_alive(&mut self, context: &str) {
        let exited = self.process.child.try_wait().expect("wait for lathe");
        assert!(exited.is_none(), "{context}: lathe died: {exited:?}");
    }

    /// SIGTERM and a clean exit.
    fn stop(mut self) {
        binary::sigterm(&self.process.child);
        let status = binary::wait_for_exit(&mut self.process.child, Duration::from_secs(60));
        assert!(status.success(), "lathe exited with {status}");
    }
}

/// Both collections with the same documents, committed; the server stopped.
async fn populate(data_dir: &Path, docs: &[Doc]) {
    let mut server = start(data_dir).await;
    for collection in [DAMAGED, HEALTHY] {
        create_collection(&mut server.client, collection).await;
        let documents = docs
            .iter()
            .map(|doc| proto::Document {
                id: doc.id.clone(),
                title: doc.title.clone(),
                text: doc.text.clone(),
                format: proto::DocumentFormat::Plain as i32,
                ..Default::default()
            })
            .collect();
        upsert(&mut server.client, collection, documents).await;
    }
    server.stop();
}

/// The index files of `collection` whose names end with `extension`.
fn index_files(data_dir: &Path, collection: &str, extension: &str) -> Vec<PathBuf> {
    let folder = data_dir.join("collections").join(collection).join("index");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(extension))
        .collect();
    files.sort();
    files
}

/// Every file of `collection`'s index with its bytes, to put back after each trial.
fn save_index(data_dir: &Path, collection: &str) -> Vec<(PathBuf, Vec<u8>)> {
    index_files(data_dir, collection, "")
        .into_iter()
        .filter(|path| path.is_file())
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect()
}

fn restore_index(saved: &[(PathBuf, Vec<u8>)]) {
    for (path, bytes) in saved {
        std::fs::write(path, bytes).unwrap();
    }
}

/// splitmix64: a seeded sequence without a dependency.
struct Positions(u64);

impl Positions {
    fn next_below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % bound
    }
}

/// `count` distinct positions in `path`, drawn from `seed`.
fn random_positions(path: &Path, seed: u64, count: usize) -> Vec<u64> {
    let length = std::fs::metadata(path).unwrap().len();
    let mut positions = Positions(seed);
    let mut chosen: Vec<u64> = Vec::new();
    while chosen.len() < count.min(length as usize) {
        let position = positions.next_below(length);
        if !chosen.contains(&position) {
            chosen.push(position);
        }
    }
    chosen
}

/// XORs `count` distinct bytes of `path` (drawn from `seed`) with 0x20, in place.
fn flip_bytes(path: &Path, seed: u64, count: usize) {
    flip_at(path, &random_positions(path, seed, count));
}

/// XORs the bytes of `path` at `positions` with 0x20, in place (the same inode: a running server
/// that has the file memory-mapped sees the change).
fn flip_at(path: &Path, positions: &[u64]) {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    for &position in positions {
        let mut byte = [0u8];
        file.seek(SeekFrom::Start(position)).unwrap();
        file.read_exact(&mut byte).unwrap();
        byte[0] ^= 0x20;
        file.seek(SeekFrom::Start(position)).unwrap();
        file.write_all(&byte).unwrap();
    }
    file.sync_all().unwrap();
}

/// A request to reserve more than this can never be met (the abort asked for 21 PB).
const UNBOUNDED: u64 = 1 << 40;

/// The first byte of `store` whose XOR with 0x20 makes tantivy's own document decoder ask to
/// reserve more than [`UNBOUNDED`] bytes for one of its documents: what aborted the process in
/// the issue. tantivy's store reader hands out each document's bytes of the flipped file, and
/// [`tantivy_reservation`] follows its decoder over them.
fn position_that_aborts_tantivys_decoder(store: &Path) -> Option<u64> {
    use tantivy::directory::footer::Footer;
    use tantivy::directory::FileSlice;
    use tantivy::store::StoreReader;
    use tantivy::HasLen;
    let file = std::fs::read(store).unwrap();
    let (_, body) = Footer::extract_footer(FileSlice::from(file.clone())).unwrap();
    let body = file[..body.len()].to_vec();
    let documents = {
        let reader = StoreReader::open(FileSlice::from(body.clone()), 0).unwrap();
        (0u32..)
            .take_while(|doc| reader.get_document_bytes(*doc).is_ok())
            .count() as u32
    };
    // tantivy asserts on some damaged blocks: those flips are not the ones looked for.
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let found = (0..body.len()).find(|&position| {
        let mut flipped = body.clone();
        flipped[position] ^= 0x20;
        std::panic::catch_unwind(|| {
            let Ok(reader) = StoreReader::open(FileSlice::from(flipped), 100) else {
                return false;
            };
            (0..documents).any(|doc| {
                reader
                    .get_document_bytes(doc)
                    .is_ok_and(|bytes| tantivy_reservation(bytes.as_slice()) > UNBOUNDED)
            })
        })
        .unwrap_or(false)
    });
    std::panic::set_hook(quiet);
    found.map(|position| position as u64)
}

/// The largest length tantivy's document decoder (tantivy 0.27 `BinaryDocumentDeserializer`)
/// would reserve while decoding `bytes`: it reads a VInt count, then per value a u32 field, a
/// type code, and for text and bytes a VInt length it passes to `with_capacity` before reading.
fn tantivy_reservation(bytes: &[u8]) -> u64 {
    fn vint(bytes: &[u8], at: &mut usize) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..).step_by(7) {
            let byte = *bytes.get(*at)?;
            *at += 1;
            if shift < 64 {
                value |= u64::from(byte & 0x7f) << shift;
            }
            if byte & 0x80 != 0 {
                break;
            }
        }
        Some(value)
    }
    let mut at = 0;
    let mut largest = 0;
    let Some(count) = vint(bytes, &mut at) else {
        return 0;
    };
    for _ in 0..count {
        at += 4;
        let Some(&code) = bytes.get(at) else {
            return largest;
        };
        at += 1;
        match code {
            // Text and bytes: a length, reserved, then read.
            0 | 4 => {
                let Some(length) = vint(bytes, &mut at) else {
                    return largest;
                };
                largest = largest.max(length);
                if length > (bytes.len() - at) as u64 {
                    return largest;
                }
                at += length as usize;
            }
            // u64, i64, date, f64.
            1 | 2 | 5 | 6 => at += 8,
            _ => return largest,
        }
    }
    largest
}

/// Byte positions to flip, per file.
type Flips = Vec<(PathBuf, Vec<u64>)>;

/// Which bytes of which store files each trial flips: the seeded draws of [`STORE_DAMAGE`] in
/// every store file, and one byte of the first store file chosen to make tantivy's own decoder
/// ask for an unbounded allocation (the abort).
fn store_trials(stores: &[PathBuf]) -> Vec<(String, Flips)> {
    let mut trials: Vec<(String, Flips)> = STORE_DAMAGE
        .iter()
        .map(|&(seed, count)| {
            let flips = stores
                .iter()
                .map(|store| (store.clone(), random_positions(store, seed, count)))
                .collect();
            (format!("seed {seed}, {count} bytes"), flips)
        })
        .collect();
    let aborting = position_that_aborts_tantivys_decoder(&stores[0])
        .expect("a flip that makes tantivy's decoder reserve without bound");
    trials.push((
        format!(
            "byte {aborting} of {}",
            stores[0].file_name().unwrap().to_string_lossy()
        ),
        vec![(stores[0].clone(), vec![aborting])],
    ));
    trials
}

/// How a Retrieve of one document by `doc_ids` went.
#[derive(Debug)]
enum Outcome {
    /// Chunks, every one exactly the document's text at its offsets.
    Exact,
    /// DATA_LOSS, with its message.
    DataLoss(String),
}

/// Retrieves each document of `docs` from `collection` by `doc_ids` (its title as the query, so
/// that every section matches) and checks the answer: `Err` describes anything that is neither
/// the exact text nor DATA_LOSS naming the collection and the document.
async fn retrieve_each(
    client: &mut LatheClient<Channel>,
    collection: &str,
    docs: &[Doc],
) -> Vec<(String, Result<Outcome, String>)> {
    let mut outcomes = Vec::new();
    for doc in docs {
        let mut request = retrieve_request(collection, &doc.title, 32_768);
        request.top_k = Some(100);
        request.filter = Some(proto::Filter {
            metadata: Vec::new(),
            doc_ids: vec![doc.id.clone()],
        });
        let outcome = match client.retrieve(request).await {
            Ok(response) => check_chunks(doc, &response.into_inner().chunks),
            Err(status) if status.code() == tonic::Code::DataLoss => {
                let message = status.message().to_string();
                let names_both = message.contains(&format!("collection `{collection}`"))
                    && message.contains(&format!("`{}`", doc.id));
                if names_both {
                    Ok(Outcome::DataLoss(message))
                } else {
                    Err(format!(
                        "DATA_LOSS not naming the collection and document: {message}"
                    ))
                }
            }
            Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
        };
        outcomes.push((doc.id.clone(), outcome));
    }
    outcomes
}

fn check_chunks(doc: &Doc, chunks: &[proto::RetrievedChunk]) -> Result<Outcome, String> {
    if chunks.is_empty() {
        return Err("OK without a single chunk".to_string());
    }
    for chunk in chunks {
        let chars = chunk.chars.unwrap_or_default();
        let written = char_slice(&doc.text, chars.start, chars.end);
        if chunk.doc_id != doc.id || chunk.text != written {
            let returned: String = chunk.text.chars().take(80).collect();
            let written: String = written.chars().take(80).collect();
            return Err(format!(
                "OK with text other than what was written: chunk of `{}` at chars {}..{} is \
                 {returned:?}, written {written:?}",
                chunk.doc_id, chars.start, chars.end
            ));
        }
    }
    Ok(Outcome::Exact)
}

/// The outcomes that are neither exact text nor a DATA_LOSS naming collection and document.
fn failures(outcomes: &[(String, Result<Outcome, String>)]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|(id, outcome)| outcome.as_ref().err().map(|why| format!("{id}: {why}")))
        .collect()
}

fn data_losses(outcomes: &[(String, Result<Outcome, String>)]) -> usize {
    outcomes
        .iter()
        .filter(|(_, outcome)| matches!(outcome, Ok(Outcome::DataLoss(_))))
        .count()
}

/// The healthy collection answers every document with its exact text.
async fn assert_healthy_serves(server: &mut Server, docs: &[Doc], context: &str) {
    let healthy = retrieve_each(&mut server.client, HEALTHY, docs).await;
    let exact = healthy
        .iter()
        .filter(|(_, outcome)| matches!(outcome, Ok(Outcome::Exact)))
        .count();
    assert_eq!(
        exact,
        docs.len(),
        "{context}: healthy collection: {healthy:?}"
    );
}

/// The fault: bytes of the `.store` file flipped while the server is stopped, then a
/// start. The file fails its footer checksum at open, so the collection opens damaged and every
/// read answers DATA_LOSS naming it, the document asked for and the file; before, most seeds
/// returned altered text with OK, and forty flips could abort the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_bytes_flipped_at_rest_never_come_back_as_text() {
    let data_dir = tempfile::tempdir().unwrap();
    let docs = corpus();
    populate(data_dir.path(), &docs).await;
    let saved = save_index(data_dir.path(), DAMAGED);
    let stores = index_files(data_dir.path(), DAMAGED, ".store");
    assert!(!stores.is_empty(), "no .store file");
    let store_names: Vec<String> = stores
        .iter()
        .map(|store| store.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut all_failures = Vec::new();
    for (trial, flips) in store_trials(&stores) {
        restore_index(&saved);
        for (store, positions) in &flips {
            flip_at(store, positions);
        }
        let context = format!("{trial} flipped at rest");
        let mut server = start(data_dir.path()).await;
        let outcomes = retrieve_each(&mut server.client, DAMAGED, &docs).await;
        if let Some(exit) = server.process.child.try_wait().expect("wait for lathe") {
            all_failures.push(format!("{context}: lathe died: {exit}"));
            continue;
        }
        all_failures.extend(
            failures(&outcomes)
                .into_iter()
                .map(|failure| format!("{context}: {failure}")),
        );
        // The whole collection is refused (a damaged file means nothing in it is trusted), and
        // the message names the file.
        for (id, outcome) in &outcomes {
            match outcome {
                Ok(Outcome::DataLoss(message))
                    if store_names.iter().any(|name| message.contains(name)) => {}
                Ok(Outcome::DataLoss(message)) => all_failures.push(format!(
                    "{context}: {id}: the damaged file is not named: {message}"
                )),
                Ok(Outcome::Exact) => all_failures.push(format!(
                    "{context}: {id}: served from a collection whose store file is damaged"
                )),
                Err(_) => {}
            }
        }
        assert_healthy_serves(&mut server, &docs, &context).await;
        server.stop();
    }
    assert!(all_failures.is_empty(), "{}", all_failures.join("\n"));
}

/// Bytes of the `.store` file changed in place while the server runs, after the file was verified
/// (it is memory-mapped, so the server reads the new bytes): each section's own checksum catches
/// the change, and the bounded decoder keeps damaged lengths from reaching an allocation. Besides
/// the seeded flips, one byte is chosen that makes tantivy's own decoder ask for an unbounded
/// allocation; before, that aborted the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_bytes_changed_under_a_running_server_never_come_back_as_text() {
    let data_dir = tempfile::tempdir().unwrap();
    let docs = corpus();
    populate(data_dir.path(), &docs).await;
    let saved = save_index(data_dir.path(), DAMAGED);
    let stores = index_files(data_dir.path(), DAMAGED, ".store");
    let mut all_failures = Vec::new();
    let mut total_data_losses = 0;
    for (trial, flips) in store_trials(&stores) {
        restore_index(&saved);
        let context = format!("{trial} flipped under the running server");
        let mut server = start(data_dir.path()).await;
        for (store, positions) in &flips {
            flip_at(store, positions);
        }
        let outcomes = retrieve_each(&mut server.client, DAMAGED, &docs).await;
        if let Some(exit) = server.process.child.try_wait().expect("wait for lathe") {
            all_failures.push(format!("{context}: lathe died: {exit}"));
            continue;
        }
        all_failures.extend(
            failures(&outcomes)
                .into_iter()
                .map(|failure| format!("{context}: {failure}")),
        );
        total_data_losses += data_losses(&outcomes);
        assert_healthy_serves(&mut server, &docs, &context).await;
        server.stop();
    }
    assert!(all_failures.is_empty(), "{}", all_failures.join("\n"));
    // The flips did reach what was read (else this test would prove nothing).
    assert!(total_data_losses > 0, "no flip was ever detected");
}

/// One flipped byte in each other kind of segment file (postings, terms, fast fields, field
/// norms, positions when there are any): the file fails its footer checksum at open, and every
/// read and write of the collection answers DATA_LOSS naming it; nothing is served from an index
/// whose postings or terms may be wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_any_other_segment_file_is_reported_not_served() {
    let data_dir = tempfile::tempdir().unwrap();
    let docs = corpus();
    populate(data_dir.path(), &docs).await;
    let saved = save_index(data_dir.path(), DAMAGED);
    let mut extensions: Vec<String> = saved
        .iter()
        .filter_map(|(path, _)| {
            let name = path.file_name()?.to_string_lossy().into_owned();
            // Segment files are `<32 hex digits>.<component>`.
            let (stem, extension) = name.split_once('.')?;
            (stem.len() == 32 && extension != "store").then(|| format!(".{extension}"))
        })
        .collect();
    extensions.sort();
    extensions.dedup();
    for required in [".idx", ".term", ".fast", ".fieldnorm"] {
        assert!(
            extensions.iter().any(|e| e == required),
            "no {required} file: {extensions:?}"
        );
    }
    let mut all_failures = Vec::new();
    for (seed, extension) in extensions.iter().enumerate() {
        restore_index(&saved);
        let damaged_files = index_files(data_dir.path(), DAMAGED, extension);
        let file = &damaged_files[0];
        let file_name = file.file_name().unwrap().to_string_lossy().into_owned();
        flip_bytes(file, seed as u64 + 100, 1);
        let context = format!("one byte of {file_name} flipped");
        let mut server = start(data_dir.path()).await;
        let outcomes = retrieve_each(&mut server.client, DAMAGED, &docs).await;
        server.assert_alive(&context);
        for (id, outcome) in &outcomes {
            match outcome {
                Ok(Outcome::DataLoss(message)) if message.contains(&file_name) => {}
                other => all_failures.push(format!(
                    "{context}: {id}: {other:?} (wanted DATA_LOSS naming {file_name})"
                )),
            }
        }
        let write = server
            .client
            .upsert_documents(proto::UpsertDocumentsRequest {
                collection: DAMAGED.to_string(),
                documents: vec![document("new", "new text", proto::DocumentFormat::Plain)],
                wait: true,
                write_id: String::new(),
            })
            .await;
        match write {
            Err(status)
                if status.code() == tonic::Code::DataLoss
                    && status.message().contains(&file_name) => {}
            other => all_failures.push(format!(
                "{context}: upsert: {other:?} (wanted DATA_LOSS naming {file_name})"
            )),
        }
        assert_healthy_serves(&mut server, &docs, &context).await;
        server.stop();
    }
    assert!(all_failures.is_empty(), "{}", all_failures.join("\n"));
}
