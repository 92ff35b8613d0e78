//! `lathe ops`: a collection's write operations, newest first, or one followed to its end with a
//! progress bar. Also what `lathe ingest` uses to follow the writes it queued.

use std::time::Duration;

use crate::proto;
#[derive(clap::Args, Debug)]
pub struct OpsArgs {
    /// The collection whose operations to list.
    #[arg(long, short)]
    pub collection: Option<String>,
    /// The server: `host:port`, or an `http://` or `https://` URI.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    /// Operations to list (newest first), 1..=1000.
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// Follow this operation until it ends, with a progress bar.
    #[arg(long)]
    pub wait: Option<u64>,
    #[command(flatten)]
    pub connect: crate::client::ConnectArgs,
}

pub async fn ops(args: OpsArgs) -> anyhow::Result<()> {
    let mut client = args.connect.connect(&args.addr).await?;
    if let Some(id) = args.wait {
        let operation = follow(&mut client, id, true).await?;
        println!("{}", describe(&operation));
        return ended_well(&operation);
    }
    let Some(collection) = args.collection else {
        anyhow::bail!("give --collection to list its operations, or --wait ID to follow one");
    };
    let operations = client
        .list_operations(proto::ListOperationsRequest {
            collection,
            limit: args.limit,
        })
        .await?
        .into_inner()
        .operations;
    for operation in &operations {
        println!("{}", describe(operation));
    }
    Ok(())
}

/// The operation's state, as its name without the prefix (`queued`, `applied`…).
pub fn state_name(operation: &proto::Operation) -> String {
    proto::OperationState::try_from(operation.state)
        .map(|state| {
            state
                .as_str_name()
                .trim_start_matches("OPERATION_STATE_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| format!("state {}", operation.state))
}

pub fn ended(operation: &proto::Operation) -> bool {
    matches!(
        proto::OperationState::try_from(operation.state),
        Ok(proto::OperationState::Applied | proto::OperationState::Failed)
    )
}

/// `Ok` for an applied operation; a failed one's reason as the error.
pub fn ended_well(operation: &proto::Operation) -> anyhow::Result<()> {
    match proto::OperationState::try_from(operation.state) {
        Ok(proto::OperationState::Applied) => Ok(()),
        _ => anyhow::bail!(
            "operation {} {}: {}",
            operation.id,
            state_name(operation),
            operation.error
        ),
    }
}

/// `42 upsert applied 49/49 documents, 1.15 MB/1.15 MB, 21.0 KB/s …`.
pub fn describe(operation: &proto::Operation) -> String {
    let kind = proto::OperationKind::try_from(operation.kind)
        .map(|kind| {
            kind.as_str_name()
                .trim_start_matches("OPERATION_KIND_")
                .to_lowercase()
        })
        .unwrap_or_default();
    let mut line = format!(
        "{} {kind} {} {}/{} documents, {}/{}, {}",
        operation.id,
        state_name(operation),
        operation.documents_done,
        operation.documents_total,
        super::units::bytes(operation.bytes_done),
        super::units::bytes(operation.bytes_total),
        super::units::per_second(operation.bytes_per_second),
    );
    if let Some(eta) = operation
        .eta_seconds
        .filter(|eta| eta.is_finite() && *eta >= 0.0)
    {
        let eta = super::units::duration(Duration::from_secs_f64(eta));
        line.push_str(&format!(", ETA {eta}"));
    }
    if !operation.write_id.is_empty() {
        line.push_str(&format!(", write_id {}", operation.write_id));
    }
    if !operation.error.is_empty() {
        line.push_str(&format!(": {}", operation.error));
    }
    line
}

/// Waits (in WaitOperation calls of a few seconds) until operation `id` ends, drawing its
/// progress as a bar when `bar`.
pub async fn follow(
    client: &mut crate::client::Client,
    id: u64,
    bar: bool,
) -> anyhow::Result<proto::Operation> {
    let progress = bar.then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar
    });
    loop {
        let operation = client
            .wait_operation(proto::WaitOperationRequest {
                id,
                timeout_ms: Some(Duration::from_secs(2).as_millis() as u32),
            })
            .await?
            .into_inner();
        if let Some(bar) = &progress {
            bar.set_length(operation.bytes_total);
            bar.set_position(operation.bytes_done);
            bar.set_message(format!(
                "operation {id} {}, {}/{} documents",
                state_name(&operation),
                operation.documents_done,
                operation.documents_total
            ));
        }
        if ended(&operation) {
            if let Some(bar) = progress {
                bar.finish();
            }
            return Ok(operation);
        }
    }
}

/// The operation a DEADLINE_EXCEEDED names when the write is queued and will be applied.
pub fn queued_operation(status: &tonic::Status) -> Option<u64> {
    use tonic_types::StatusExt;
    let details = status.get_error_details();
    let info = details.error_info()?;
    (info.reason == "WRITE_QUEUED")
        .then(|| info.metadata.get("operation_id")?.parse().ok())
        .flatten()
}
