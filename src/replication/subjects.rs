//! The stream's subjects (see `proto/lathe/log/v1/log.proto`): one per collection and one per
//! document under `<prefix>.log.`, which is what replicas consume, and the parts of oversized
//! versions under `<prefix>.part.`, which they read by sequence.

/// Subject names of one stream; `prefix` is the stream's name in lower case.
#[derive(Clone, Debug)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    pub fn new(stream: &str) -> Self {
        Self {
            prefix: stream.to_ascii_lowercase(),
        }
    }

    /// The stream's subjects, as its configuration lists them.
    pub fn stream_subjects(&self) -> Vec<String> {
        vec![self.log_filter(), format!("{}.part.>", self.prefix)]
    }

    /// The log's incarnation: one message, written once by the replica that finds the stream
    /// without it, naming this log (see `watch`). Under `part.`, which replicas read by sequence
    /// only, and `$log` can be no collection's name, so no part subject is ever the same.
    pub fn incarnation(&self) -> String {
        format!("{}.part.$log.incarnation", self.prefix)
    }

    /// Every entry replicas apply.
    pub fn log_filter(&self) -> String {
        format!("{}.log.>", self.prefix)
    }

    /// The collection's state: created (with its settings) or deleted.
    pub fn collection(&self, collection: &str) -> String {
        format!("{}.log.col.{collection}", self.prefix)
    }

    /// The alias's latest state: set (naming a collection) or deleted.
    pub fn alias(&self, alias: &str) -> String {
        format!("{}.log.alias.{alias}", self.prefix)
    }

    /// The document's latest version or its tombstone.
    pub fn document(&self, collection: &str, doc_id: &str) -> String {
        format!("{}.log.doc.{collection}.{}", self.prefix, doc_token(doc_id))
    }

    /// Every document of the collection (to purge them when it is deleted).
    pub fn documents_of(&self, collection: &str) -> String {
        format!("{}.log.doc.{collection}.>", self.prefix)
    }

    /// Part `k` of one publication of a version of the document; `publication` is unique per
    /// attempt, so each part subject holds exactly one message.
    pub fn part(&self, collection: &str, doc_id: &str, publication: &str, k: usize) -> String {
        format!(
            "{}.part.{collection}.{}.{publication}.{k}",
            self.prefix,
            doc_token(doc_id)
        )
    }

    /// Every part of every version of the document.
    pub fn parts_of_document(&self, collection: &str, doc_id: &str) -> String {
        format!("{}.part.{collection}.{}.>", self.prefix, doc_token(doc_id))
    }

    /// Every part of the collection.
    pub fn parts_of(&self, collection: &str) -> String {
        format!("{}.part.{collection}.>", self.prefix)
    }

    /// The work stream's subjects (a stream of its own, beside the log's: see `work`).
    pub fn work_stream_subjects(&self) -> Vec<String> {
        vec![format!("{}.work.>", self.prefix)]
    }

    /// A write queued for the index workers of any replica.
    pub fn work(&self, collection: &str) -> String {
        format!("{}.work.q.{collection}", self.prefix)
    }

    /// Every queued write: what the index workers' consumer takes.
    pub fn work_filter(&self) -> String {
        format!("{}.work.q.>", self.prefix)
    }

    /// A stamp taken by a write published directly (no worker consumes it; it is deleted at
    /// once): its sequence orders the write among the queued ones.
    pub fn work_claim(&self) -> String {
        format!("{}.work.claim", self.prefix)
    }
}

/// A subject token for any document id (ids are free text; tokens may not hold `.`, `*`, `>` or
/// whitespace): the hex of 128 bits of BLAKE3 of the id, so two ids share a subject — and one
/// replaces the other in the compacted stream — with probability about n² / 2¹²⁹.
fn doc_token(doc_id: &str) -> String {
    let hash = blake3::hash(doc_id.as_bytes());
    hash.as_bytes()[..16]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_valid_tokens_for_any_id_and_fall_under_the_stream() {
        let subjects = Subjects::new("LATHE");
        for id in ["a", "with space", "dots.and>*", "ünï", ""] {
            let subject = subjects.document("docs", id);
            assert!(subject.starts_with("lathe.log.doc.docs."), "{subject}");
            let token = subject.rsplit('.').next().unwrap();
            assert_eq!(token.len(), 32);
            assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{subject}");
            assert!(subjects
                .part("docs", id, "p1", 3)
                .starts_with(&subjects.parts_of_document("docs", id).replace('>', "")));
        }
        assert_ne!(subjects.document("c", "a"), subjects.document("c", "b"));
        assert_eq!(subjects.collection("c"), "lathe.log.col.c");
        assert!(subjects
            .work("c")
            .starts_with(&subjects.work_filter().replace('>', "")));
        assert!(!subjects
            .work_claim()
            .starts_with(&subjects.work_filter().replace('>', "")));
        assert_eq!(
            subjects.stream_subjects(),
            ["lathe.log.>".to_string(), "lathe.part.>".to_string()]
        );
    }
}
