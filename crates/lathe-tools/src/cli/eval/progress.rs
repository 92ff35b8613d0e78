//! What `lathe eval` shows while it ingests: the documents the server has applied to the
//! collection so far (its operations, read with ListOperations), as a progress bar on a terminal
//! and as a plain line every `--progress-seconds` otherwise (a CI log, a file), so that a long
//! ingest is never silent.

use std::convert::Infallible;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use crate::cli::units;
use crate::proto;

/// How often the operations are read for the bar on a terminal.
const BAR_POLL: Duration = Duration::from_millis(500);

/// What one upload holds, and when it started.
pub(super) struct UploadProgress {
    pub(super) collection: String,
    pub(super) total_documents: u64,
    pub(super) total_bytes: u64,
    pub(super) started: Instant,
}

impl UploadProgress {
    /// `ingesting into c: documents 120/500, 1.20 MB/5.00 MB, 400 KB/s, 40.0 documents/s`.
    pub(super) fn line(&self, documents: u64, bytes: u64) -> String {
        let elapsed = self.started.elapsed();
        format!(
            "ingesting into {}: documents {documents}/{}, {}/{}, {}, {} documents/s",
            self.collection,
            self.total_documents,
            units::bytes(bytes),
            units::bytes(self.total_bytes),
            units::rate(bytes, elapsed),
            units::count_rate(documents, elapsed),
        )
    }
}

/// Documents and bytes applied so far to `collection`: the sums over its operations (eval's
/// collections are new, so all of them are this upload's). `None` when the server does not say.
pub(super) async fn applied(
    client: &mut crate::client::Client,
    collection: &str,
) -> Option<(u64, u64)> {
    let request = proto::ListOperationsRequest {
        collection: collection.to_string(),
        limit: 1000,
    };
    let operations = client.list_operations(request).await.ok()?.into_inner();
    Some(
        operations
            .operations
            .iter()
            .fold((0, 0), |(docs, bytes), op| {
                (docs + u64::from(op.documents_done), bytes + op.bytes_done)
            }),
    )
}

/// Reports `upload`'s progress until the caller stops awaiting it (it never ends by itself): a
/// bar on a terminal, a line every `every` otherwise.
pub(super) async fn watch(
    mut client: crate::client::Client,
    upload: &UploadProgress,
    every: Duration,
) -> Infallible {
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(upload.total_bytes);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        loop {
            tokio::time::sleep(BAR_POLL).await;
            if let Some((documents, bytes)) = applied(&mut client, &upload.collection).await {
                bar.set_position(bytes);
                bar.set_message(format!(
                    "ingesting into {}: {documents}/{} documents",
                    upload.collection, upload.total_documents
                ));
            }
        }
    }
    loop {
        tokio::time::sleep(every).await;
        if let Some((documents, bytes)) = applied(&mut client, &upload.collection).await {
            eprintln!("{}", upload.line(documents, bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_documents_sizes_and_rates() {
        let progress = UploadProgress {
            collection: "eval-lathe".into(),
            total_documents: 500,
            total_bytes: 5_000_000,
            started: Instant::now() - Duration::from_secs(3),
        };
        let line = progress.line(120, 1_200_000);
        assert!(
            line.starts_with("ingesting into eval-lathe: documents 120/500, 1.20 MB/5.00 MB, "),
            "{line}"
        );
        assert!(line.ends_with(" documents/s"), "{line}");
        assert!(line.contains(" KB/s, "), "{line}");
    }
}
