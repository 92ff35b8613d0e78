//! OpenTelemetry export (feature `otel`): the real binary with `log.otlp_endpoint` pointing at an
//! in-test OTLP/gRPC receiver exports a span for each RPC, named for it; the spans still batched
//! at SIGTERM are flushed before the process exits.
#![cfg(feature = "otel")]

mod common;

use std::time::{Duration, Instant};

use common::binary::*;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use tokio::sync::mpsc;

/// One received span: its name, its attributes and its resource's attributes, as strings.
#[derive(Debug)]
struct ReceivedSpan {
    name: String,
    attributes: Vec<(String, String)>,
    resource: Vec<(String, String)>,
}

struct Receiver {
    spans: mpsc::UnboundedSender<ReceivedSpan>,
}

fn strings(attributes: &[KeyValue]) -> Vec<(String, String)> {
    attributes
        .iter()
        .map(|attribute| {
            let value = match attribute.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(text)) => text.clone(),
                Some(any_value::Value::IntValue(number)) => number.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (attribute.key.clone(), value)
        })
        .collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans
                .resource
                .map(|resource| strings(&resource.attributes))
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    let _ = self.spans.send(ReceivedSpan {
                        name: span.name,
                        attributes: strings(&span.attributes),
                        resource: resource.clone(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_spans_reach_the_otlp_endpoint_named_for_the_rpc() {
    let (spans_tx, mut spans) = mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let receiver_address = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver { spans: spans_tx }))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    let dir = tempfile::tempdir().unwrap();
    let mut server = start(
        dir.path(),
        &[(
            "LATHE_LOG__OTLP_ENDPOINT",
            format!("http://{receiver_address}"),
        )],
    );
    let mut client = connect(&server.address).await;
    create_collection(&mut client, "c").await;
    upsert(
        &mut client,
        "c",
        vec![document(
            "d",
            "Lathes turn wood and metal. The tailstock holds long work steady.",
            lathe::api::proto::DocumentFormat::Plain,
        )],
    )
    .await;
    let answer = retrieve(&mut client, retrieve_request("c", "tailstock", 256)).await;
    assert!(!answer.chunks.is_empty());

    // The batch is flushed at shutdown at the latest.
    sigterm(&server.child);
    let status = wait_for_exit(&mut server.child, Duration::from_secs(120));
    assert!(status.success(), "lathe exited with {status}");

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut received = Vec::new();
    let retrieve_span = loop {
        if let Some(span) = received
            .iter()
            .position(|span: &ReceivedSpan| span.name == "lathe.v1.Lathe/Retrieve")
        {
            break received.swap_remove(span);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, spans.recv()).await {
            Ok(Some(span)) => received.push(span),
            _ => panic!("no lathe.v1.Lathe/Retrieve span arrived; got {received:#?}"),
        }
    };
    assert!(
        retrieve_span
            .attributes
            .contains(&("rpc".to_string(), "Retrieve".to_string())),
        "{retrieve_span:#?}"
    );
    assert!(
        retrieve_span
            .resource
            .contains(&("service.name".to_string(), "lathe".to_string())),
        "{retrieve_span:#?}"
    );
}
