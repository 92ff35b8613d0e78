//! Writes: documents from proto, and a write's outcome and operations back.

use std::collections::BTreeMap;

use super::separator_in_key;
use crate::api::proto;
use crate::error::{LatheError, Result};
use crate::types::{
    DocumentFormat, DocumentInput, Operation, OperationKind, OperationState, SectionBoundary,
    WriteOutcome, METADATA_SEPARATOR,
};

pub fn document_from_proto(document: proto::Document, index: usize) -> Result<DocumentInput> {
    let proto::Document {
        id,
        title,
        text,
        format,
        metadata,
        sections,
    } = document;
    let format = match proto::DocumentFormat::try_from(format) {
        Ok(proto::DocumentFormat::Unspecified | proto::DocumentFormat::Plain) => DocumentFormat::Plain,
        Ok(proto::DocumentFormat::Markdown) => DocumentFormat::Markdown,
        Ok(proto::DocumentFormat::Html) => DocumentFormat::Html,
        Err(_) => {
            return Err(LatheError::invalid(
                format!("documents[{index}].format"),
                format!("unknown format {format}; the allowed values are 0 or 1 (plain), 2 (markdown), 3 (html)"),
            ))
        }
    };
    if let Some(key) = metadata.keys().find(|k| k.is_empty()) {
        debug_assert!(key.is_empty());
        return Err(LatheError::invalid(
            format!("documents[{index}].metadata"),
            "keys must not be empty",
        ));
    }
    if let Some(key) = metadata.keys().find(|k| k.contains(METADATA_SEPARATOR)) {
        return Err(LatheError::invalid(
            format!("documents[{index}].metadata"),
            separator_in_key(key),
        ));
    }
    let sections = if sections.is_empty() {
        None
    } else {
        Some(
            sections
                .into_iter()
                .map(
                    |proto::SectionBoundary { start, end, title }| SectionBoundary {
                        start,
                        end,
                        title,
                    },
                )
                .collect(),
        )
    };
    Ok(DocumentInput {
        id,
        title,
        text,
        format,
        metadata: metadata.into_iter().collect::<BTreeMap<_, _>>(),
        sections,
    })
}

pub fn documents_from_proto(documents: Vec<proto::Document>) -> Result<Vec<DocumentInput>> {
    documents
        .into_iter()
        .enumerate()
        .map(|(i, document)| document_from_proto(document, i))
        .collect()
}

impl From<WriteOutcome> for proto::WriteResponse {
    fn from(outcome: WriteOutcome) -> Self {
        let WriteOutcome {
            documents,
            sections,
            generation,
            consistency_token,
            operation,
            operation_ids,
        } = outcome;
        proto::WriteResponse {
            documents,
            sections,
            generation,
            consistency_token,
            operation: operation.map(Into::into),
            operation_ids,
        }
    }
}

impl From<Operation> for proto::Operation {
    fn from(operation: Operation) -> Self {
        let Operation {
            id,
            collection,
            kind,
            state,
            documents_total,
            documents_done,
            bytes_total,
            bytes_done,
            bytes_per_second,
            eta_seconds,
            error,
            write_id,
            created_unix_ms,
            started_unix_ms,
            finished_unix_ms,
            sections,
            generation,
        } = operation;
        let kind = match kind {
            OperationKind::Upsert => proto::OperationKind::Upsert,
            OperationKind::Delete => proto::OperationKind::Delete,
        };
        let state = match state {
            OperationState::Queued => proto::OperationState::Queued,
            OperationState::Running => proto::OperationState::Running,
            OperationState::Applied => proto::OperationState::Applied,
            OperationState::Failed => proto::OperationState::Failed,
        };
        proto::Operation {
            id,
            collection,
            kind: kind as i32,
            state: state as i32,
            documents_total,
            documents_done,
            bytes_total,
            bytes_done,
            bytes_per_second,
            eta_seconds,
            error,
            write_id,
            // On a single node an operation's id is its consistency token.
            consistency_token: id,
            created_unix_ms,
            started_unix_ms,
            finished_unix_ms,
            sections,
            generation,
        }
    }
}
