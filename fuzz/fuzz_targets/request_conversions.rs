//! The gRPC edge: any bytes decoded as one of the request messages (the first byte picks which) and
//! converted to domain types. A rejection must map to INVALID_ARGUMENT with a message naming the
//! field; nothing may panic.

#![no_main]

use lathe::api::convert::{
    chunking_from_proto, documents_from_proto, retrieve_query_from_proto, settings_from_proto,
};
use lathe::api::proto;
use lathe::config::Config;
use lathe::error::LatheError;
use lathe::query::validate::validate_query;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fn check_rejection(error: LatheError) {
    let status = tonic::Status::from(error);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(!status.message().is_empty());
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    match selector % 4 {
        0 => {
            let Ok(request) = proto::RetrieveRequest::decode(bytes) else {
                return;
            };
            match retrieve_query_from_proto(request) {
                Ok(query) => {
                    let limits = Config::default().limits;
                    if let Err(error) = validate_query(&limits, &query) {
                        check_rejection(error);
                    }
                }
                Err(error) => check_rejection(error),
            }
        }
        1 => {
            let Ok(request) = proto::UpsertDocumentsRequest::decode(bytes) else {
                return;
            };
            let count = request.documents.len();
            match documents_from_proto(request.documents) {
                Ok(inputs) => assert_eq!(inputs.len(), count),
                Err(error) => check_rejection(error),
            }
        }
        2 => {
            let Ok(request) = proto::CreateCollectionRequest::decode(bytes) else {
                return;
            };
            if let Err(error) = settings_from_proto(request.settings) {
                check_rejection(error);
            }
        }
        _ => {
            let Ok(options) = proto::ChunkingOptions::decode(bytes) else {
                return;
            };
            if let Err(error) = chunking_from_proto(Some(options), "chunking") {
                check_rejection(error);
            }
        }
    }
});
