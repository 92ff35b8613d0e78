//! A queued write ⇄ its stored bytes (`proto/lathe/queue/v1/queue.proto`), and an operation's
//! record ⇄ [`Operation`].

use prost::Message;

use super::proto;
use super::QueuedWrite;
use crate::error::{LatheError, Result};
use crate::ingest::SectionedDocument;
use crate::sections::SectionSpan;
use crate::types::{
    DocumentFormat, DocumentInput, Operation, OperationKind, OperationState, SectionBoundary,
};

pub fn encode_write(write: &QueuedWrite) -> Vec<u8> {
    let write = match write {
        QueuedWrite::Upsert(documents) => proto::queued_write::Write::Upsert(proto::QueuedUpsert {
            documents: documents.iter().map(encode_document).collect(),
        }),
        QueuedWrite::Delete(doc_ids) => proto::queued_write::Write::Delete(proto::QueuedDelete {
            doc_ids: doc_ids.clone(),
        }),
    };
    proto::QueuedWrite { write: Some(write) }.encode_to_vec()
}

/// An upsert of `documents` as encoded writes of at most `max_bytes` each, documents in order;
/// `None` when one document alone is larger.
pub fn encode_upsert_pieces(
    documents: &[SectionedDocument],
    max_bytes: usize,
) -> Option<Vec<Vec<u8>>> {
    // The write's own envelope: the oneof's key and length.
    const ENVELOPE: usize = 16;
    let wrap = |documents| {
        let write = proto::queued_write::Write::Upsert(proto::QueuedUpsert { documents });
        proto::QueuedWrite { write: Some(write) }.encode_to_vec()
    };
    let (mut pieces, mut piece, mut bytes) = (Vec::new(), Vec::new(), ENVELOPE);
    for document in documents {
        let encoded = encode_document(document);
        let len = encoded.encoded_len();
        let adds = 1 + prost::encoding::encoded_len_varint(len as u64) + len;
        if ENVELOPE + adds > max_bytes {
            return None;
        }
        if bytes + adds > max_bytes {
            pieces.push(wrap(std::mem::take(&mut piece)));
            bytes = ENVELOPE;
        }
        piece.push(encoded);
        bytes += adds;
    }
    if !piece.is_empty() {
        pieces.push(wrap(piece));
    }
    Some(pieces)
}

pub fn decode_write(bytes: &[u8]) -> Result<QueuedWrite> {
    let decoded = proto::QueuedWrite::decode(bytes).map_err(garbled)?;
    match decoded.write {
        Some(proto::queued_write::Write::Upsert(upsert)) => Ok(QueuedWrite::Upsert(
            upsert
                .documents
                .into_iter()
                .map(decode_document)
                .collect::<Result<_>>()?,
        )),
        Some(proto::queued_write::Write::Delete(delete)) => Ok(QueuedWrite::Delete(delete.doc_ids)),
        None => Err(garbled("no write")),
    }
}

fn encode_document(sectioned: &SectionedDocument) -> proto::QueuedDocument {
    let DocumentInput {
        id,
        title,
        text,
        format,
        metadata,
        sections,
    } = &sectioned.document;
    proto::QueuedDocument {
        id: id.clone(),
        title: title.clone(),
        text: text.clone(),
        format: match format {
            DocumentFormat::Plain => 0,
            DocumentFormat::Markdown => 1,
            DocumentFormat::Html => 2,
        },
        metadata: metadata.clone().into_iter().collect(),
        has_caller_sections: sections.is_some(),
        caller_sections: sections
            .iter()
            .flatten()
            .map(|b| proto::CallerSection {
                start: b.start,
                end: b.end,
                title: b.title.clone(),
            })
            .collect(),
        indexed_text: (sectioned.text != *text).then(|| sectioned.text.clone()),
        spans: sectioned
            .spans
            .iter()
            .map(|span| proto::QueuedSpan {
                start: span.start as u64,
                end: span.end as u64,
                heading_path: span.heading_path.clone(),
            })
            .collect(),
    }
}

fn decode_document(document: proto::QueuedDocument) -> Result<SectionedDocument> {
    let proto::QueuedDocument {
        id,
        title,
        text,
        format,
        metadata,
        has_caller_sections,
        caller_sections,
        indexed_text,
        spans,
    } = document;
    let format = match format {
        0 => DocumentFormat::Plain,
        1 => DocumentFormat::Markdown,
        2 => DocumentFormat::Html,
        other => return Err(garbled(format!("document format {other}"))),
    };
    let indexed = indexed_text.unwrap_or_else(|| text.clone());
    let spans = spans
        .into_iter()
        .map(|span| {
            let (start, end) = (span.start as usize, span.end as usize);
            let fits = start <= end
                && end <= indexed.len()
                && indexed.is_char_boundary(start)
                && indexed.is_char_boundary(end);
            if !fits {
                return Err(garbled(format!("section {start}..{end} of `{id}`")));
            }
            Ok(SectionSpan {
                start,
                end,
                heading_path: span.heading_path,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let sections = has_caller_sections.then(|| {
        caller_sections
            .into_iter()
            .map(|b| SectionBoundary {
                start: b.start,
                end: b.end,
                title: b.title,
            })
            .collect()
    });
    Ok(SectionedDocument {
        document: DocumentInput {
            id,
            title,
            text,
            format,
            metadata: metadata.into_iter().collect(),
            sections,
        },
        text: indexed,
        spans,
    })
}

pub fn encode_record(record: &proto::OperationRecord) -> Vec<u8> {
    record.encode_to_vec()
}

pub fn decode_record(bytes: &[u8]) -> Result<proto::OperationRecord> {
    proto::OperationRecord::decode(bytes).map_err(garbled)
}

pub const KIND_UPSERT: u32 = 1;
pub const KIND_DELETE: u32 = 2;
pub const STATE_QUEUED: u32 = 1;
pub const STATE_APPLIED: u32 = 3;
pub const STATE_FAILED: u32 = 4;

/// The operation `id` as its record stands (running progress is the caller's to add).
pub fn operation(id: u64, record: &proto::OperationRecord) -> Operation {
    let state = match record.state {
        STATE_APPLIED => OperationState::Applied,
        STATE_FAILED => OperationState::Failed,
        _ => OperationState::Queued,
    };
    let applied = state == OperationState::Applied;
    let seconds = record
        .finished_unix_ms
        .saturating_sub(record.started_unix_ms) as f64
        / 1e3;
    Operation {
        id,
        collection: record.collection.clone(),
        kind: if record.kind == KIND_DELETE {
            OperationKind::Delete
        } else {
            OperationKind::Upsert
        },
        state,
        documents_total: record.documents,
        documents_done: if applied { record.documents } else { 0 },
        bytes_total: record.bytes,
        bytes_done: if applied { record.bytes } else { 0 },
        bytes_per_second: if applied && seconds > 0.0 {
            record.bytes as f64 / seconds
        } else {
            0.0
        },
        eta_seconds: None,
        error: record.error.clone(),
        write_id: record.write_id.clone(),
        created_unix_ms: record.created_unix_ms,
        started_unix_ms: record.started_unix_ms,
        finished_unix_ms: record.finished_unix_ms,
        sections: record.sections,
        generation: record.generation,
    }
}

fn garbled(cause: impl std::fmt::Display) -> LatheError {
    LatheError::internal(format!(
        "the write queue holds an entry this build cannot read ({cause})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sectioned_document_round_trips_with_its_extracted_text_and_caller_sections() {
        let document = SectionedDocument {
            document: DocumentInput {
                id: "d".into(),
                title: "T".into(),
                text: "<p>héllo</p><p>wörld</p>".into(),
                format: DocumentFormat::Html,
                metadata: [("k".to_string(), "v".to_string())].into(),
                sections: Some(vec![SectionBoundary {
                    start: 0,
                    end: 3,
                    title: "a".into(),
                }]),
            },
            text: "héllo\n\nwörld".into(),
            spans: vec![
                SectionSpan {
                    start: 0,
                    end: 6,
                    heading_path: vec!["H".into()],
                },
                SectionSpan {
                    start: 8,
                    end: 14,
                    heading_path: vec![],
                },
            ],
        };
        let bytes = encode_write(&QueuedWrite::Upsert(vec![document.clone()]));
        let QueuedWrite::Upsert(decoded) = decode_write(&bytes).unwrap() else {
            panic!("an upsert comes back an upsert");
        };
        assert_eq!(decoded[0].document, document.document);
        assert_eq!(decoded[0].text, document.text);
        assert_eq!(decoded[0].spans, document.spans);
        let deletes = QueuedWrite::Delete(vec!["a".into(), "b".into()]);
        assert!(matches!(decode_write(&encode_write(&deletes)).unwrap(),
            QueuedWrite::Delete(ids) if ids == ["a", "b"]));
    }

    #[test]
    fn an_upsert_cut_into_pieces_keeps_every_document_in_order_each_piece_within_the_bound() {
        let documents: Vec<SectionedDocument> = (0..40)
            .map(|i| {
                let text = "word ".repeat(10 + i * 7);
                SectionedDocument {
                    document: DocumentInput {
                        id: format!("d{i}"),
                        title: String::new(),
                        text: text.clone(),
                        format: DocumentFormat::Plain,
                        metadata: Default::default(),
                        sections: None,
                    },
                    spans: vec![SectionSpan {
                        start: 0,
                        end: text.len(),
                        heading_path: vec![],
                    }],
                    text,
                }
            })
            .collect();
        let largest = encode_write(&QueuedWrite::Upsert(vec![documents[39].clone()])).len();
        // The bound keeps a few bytes for the write's envelope.
        for max in [largest + 16, 1_000, 4_096, 1 << 20] {
            let Some(pieces) = encode_upsert_pieces(&documents, max) else {
                assert!(max < largest + 16, "{max}");
                continue;
            };
            assert!(pieces.iter().all(|piece| piece.len() <= max), "{max}");
            let ids: Vec<String> = pieces
                .iter()
                .flat_map(|piece| match decode_write(piece).unwrap() {
                    QueuedWrite::Upsert(documents) => documents,
                    QueuedWrite::Delete(_) => panic!("an upsert comes back an upsert"),
                })
                .map(|document| document.document.id)
                .collect();
            let wanted: Vec<String> = (0..40).map(|i| format!("d{i}")).collect();
            assert_eq!(ids, wanted, "{max}");
        }
        assert!(encode_upsert_pieces(&documents, largest - 1).is_none());
        assert_eq!(encode_upsert_pieces(&documents, 1 << 20).unwrap().len(), 1);
    }

    /// The queue's write hash is of these bytes, and a repeated `write_id` must match it: a
    /// write with several metadata entries encodes to the same bytes every time (maps in key
    /// order), as `lathe ingest` run again sends each file's path, dir and ext.
    #[test]
    fn a_write_encodes_to_the_same_bytes_every_time_whatever_its_metadata() {
        let write = || {
            let metadata = (0..16)
                .map(|i| (format!("key{i}"), format!("value{i}")))
                .collect();
            QueuedWrite::Upsert(vec![SectionedDocument {
                document: DocumentInput {
                    id: "d".into(),
                    title: String::new(),
                    text: "text".into(),
                    format: DocumentFormat::Plain,
                    metadata,
                    sections: None,
                },
                text: "text".into(),
                spans: vec![],
            }])
        };
        let first = encode_write(&write());
        for _ in 0..8 {
            assert_eq!(encode_write(&write()), first);
        }
    }

    #[test]
    fn a_span_off_a_character_boundary_is_refused_not_trusted() {
        let mut document = encode_document(&SectionedDocument {
            document: DocumentInput {
                id: "d".into(),
                title: String::new(),
                text: "héllo".into(),
                format: DocumentFormat::Plain,
                metadata: Default::default(),
                sections: None,
            },
            text: "héllo".into(),
            spans: vec![],
        });
        document.spans.push(proto::QueuedSpan {
            start: 0,
            end: 2,
            heading_path: vec![],
        });
        assert!(decode_document(document).is_err());
    }
}
