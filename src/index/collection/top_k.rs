//! The best sections for a scored query across a snapshot's segments, equal scores by section
//! key. tantivy's `TopDocs` starts every segment's block-max WAND from nothing, so each of a
//! large index's segments pays to find its own `k` candidates before it can skip a block; here
//! the segments are searched largest first and each starts from the `k`-th best score found so
//! far, so the later ones skip every block that cannot enter the answer.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use tantivy::query::{EnableScoring, Query};
use tantivy::{DocAddress, Score, Searcher};

use super::snapshot::Snapshot;
use crate::error::Result;

/// The best `limit` documents for `query` by score, equal scores by the lower section key: the
/// same sections come back whatever the segments look like (on every replica, after any merge),
/// where tantivy's own order breaks ties by segment and position. The pruned search keeps every
/// document tied with the `limit`-th score ([`Best`]), so one search is enough however many tie
/// (a corpus with repeated sections ties often: asking again for twice as many re-ran a fifth of
/// a million-section benchmark's queries). Each comes with its section key as the fast field
/// holds it (`None` for a position without one: damaged).
pub(super) fn top_by_score_then_key(
    snapshot: &Snapshot,
    query: &dyn Query,
    limit: usize,
) -> Result<Vec<(Score, Option<u64>, DocAddress)>> {
    let top = top_scored(&snapshot.searcher, query, limit)?;
    let mut keyed: Vec<(Score, Option<u64>, DocAddress)> = top
        .into_iter()
        .map(|(score, address)| (score, snapshot.section_key_at(address), address))
        .collect();
    keyed.sort_unstable_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.unwrap_or(0).cmp(&b.1.unwrap_or(0)))
    });
    keyed.truncate(limit);
    Ok(keyed)
}

/// The `k` best-scoring live documents for `query` and every other one tied with the `k`-th,
/// best first (equal scores in no particular order): the documents tantivy's `TopDocs` keeps,
/// and those it leaves out only for a tie. A document is passed over only when its score is
/// below the `k`-th best of those already kept, which only grows. Up to the last bit of a score:
/// block-max WAND adds a document's term scores in the order its scorers happen to lie, which the
/// starting threshold changes, so two documents of equal BM25 can trade places (7 of 28,485
/// answers of covid-a's eval changed order deep in a long answer, none its set; docs/notebook,
/// "BM25's threshold carried across segments").
fn top_scored(
    searcher: &Searcher,
    query: &dyn Query,
    k: usize,
) -> Result<Vec<(Score, DocAddress)>> {
    let weight = query.weight(EnableScoring::enabled_from_searcher(searcher))?;
    let mut segments: Vec<(u32, &tantivy::SegmentReader)> = searcher
        .segment_readers()
        .iter()
        .enumerate()
        .map(|(ord, reader)| (ord as u32, reader))
        .collect();
    segments.sort_by_key(|(_, reader)| Reverse(reader.num_docs()));
    let mut best = Best::new(k);
    for (segment_ord, reader) in segments {
        if reader.num_docs() == 0 {
            continue;
        }
        let alive = reader.alive_bitset();
        weight.for_each_pruning(best.threshold(), reader, &mut |doc, score| {
            if !alive.is_some_and(|alive| alive.is_deleted(doc)) {
                best.push(score, DocAddress::new(segment_ord, doc));
            }
            best.threshold()
        })?;
    }
    Ok(best.into_sorted())
}

/// A bounded min-heap of the `k` best (score, address) pairs seen, and the pairs tied with the
/// `k`-th best score that the heap has no room for.
struct Best {
    k: usize,
    heap: BinaryHeap<Reverse<Entry>>,
    /// Pairs scored exactly the heap's least score, outside it.
    ties: Vec<Entry>,
}

#[derive(Clone, Copy)]
struct Entry(Score, DocAddress);

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(other.1.cmp(&self.1))
    }
}

impl Best {
    fn new(k: usize) -> Self {
        Self {
            k,
            heap: BinaryHeap::with_capacity(k + 1),
            ties: Vec::new(),
        }
    }

    /// The `k`-th best score, once `k` are kept.
    fn kth(&self) -> Option<Score> {
        if self.heap.len() < self.k {
            return None;
        }
        self.heap.peek().map(|Reverse(entry)| entry.0)
    }

    /// The score a document must exceed to be passed on: the float just below the `k`-th best,
    /// so that a document tying it is passed on too.
    fn threshold(&self) -> Score {
        self.kth().map_or(Score::MIN, Score::next_down)
    }

    fn push(&mut self, score: Score, address: DocAddress) {
        let entry = Entry(score, address);
        if self.k == 0 {
            return;
        }
        let Some(kth) = self.kth() else {
            self.heap.push(Reverse(entry));
            return;
        };
        if score > kth {
            let Some(mut least) = self.heap.peek_mut() else {
                return;
            };
            let Reverse(out) = std::mem::replace(&mut *least, Reverse(entry));
            drop(least);
            // The pair pushed out ties the new `k`-th score, or the `k`-th score rose past it and
            // past every tie kept so far.
            if Some(out.0) == self.kth() {
                self.ties.push(out);
            } else {
                self.ties.clear();
            }
        } else if score == kth {
            self.ties.push(entry);
        }
    }

    fn into_sorted(self) -> Vec<(Score, DocAddress)> {
        let mut entries: Vec<Entry> = self.heap.into_iter().map(|Reverse(e)| e).collect();
        entries.extend(self.ties);
        // Descending entries: best first.
        entries.sort_unstable_by(|a, b| b.cmp(a));
        entries
            .into_iter()
            .map(|Entry(score, address)| (score, address))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use tantivy::collector::TopDocs;
    use tantivy::query::{BooleanQuery, Occur, TermQuery};
    use tantivy::schema::{IndexRecordOption, Schema, TEXT};
    use tantivy::{doc, Index, IndexWriter, Term};

    use super::*;

    /// An index of `segments` commits of sentences over a small vocabulary (so that scores
    /// tie often and every term is in many documents), with some documents deleted.
    fn index(segments: usize) -> (Index, tantivy::schema::Field) {
        let mut schema = Schema::builder();
        let text = schema.add_text_field("text", TEXT);
        let index = Index::create_in_ram(schema.build());
        let mut writer: IndexWriter = index.writer_with_num_threads(1, 15_000_000).unwrap();
        writer.set_merge_policy(Box::new(tantivy::indexer::NoMergePolicy));
        let words = ["harbour", "boats", "sail", "wind", "rope", "tide", "anchor"];
        let mut n = 0u64;
        for segment in 0..segments {
            // Segments of very different sizes, as a merge policy leaves them.
            for _ in 0..(40 + 300 * (segment % 3)) {
                n += 1;
                let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut sentence = Vec::new();
                for _ in 0..(1 + x % 9) {
                    sentence.push(words[(x % words.len() as u64) as usize]);
                    x = x.rotate_left(7).wrapping_mul(31);
                }
                sentence.push(if n.is_multiple_of(5) {
                    "rare"
                } else {
                    "common"
                });
                writer
                    .add_document(doc!(text => sentence.join(" ")))
                    .unwrap();
            }
            writer.commit().unwrap();
        }
        writer.delete_term(Term::from_field_text(text, "rope"));
        writer.commit().unwrap();
        (index, text)
    }

    fn disjunction(field: tantivy::schema::Field, words: &[&str]) -> BooleanQuery {
        BooleanQuery::new(
            words
                .iter()
                .map(|word| {
                    let term = Term::from_field_text(field, word);
                    let query: Box<dyn Query> =
                        Box::new(TermQuery::new(term, IndexRecordOption::WithFreqs));
                    (Occur::Should, query)
                })
                .collect(),
        )
    }

    #[test]
    fn the_carried_threshold_keeps_the_documents_tantivy_keeps_and_every_tie() {
        let (index, text) = index(7);
        let searcher = index.reader().unwrap().searcher();
        assert!(searcher.segment_readers().len() >= 7);
        let queries = [
            vec!["harbour"],
            vec!["boats", "wind"],
            vec!["rare", "anchor", "tide"],
            vec!["common", "sail", "rope", "harbour"],
        ];
        let mut extra_ties = 0;
        for words in queries {
            let query = disjunction(text, &words);
            let every = searcher
                .search(&query, &TopDocs::with_limit(100_000).order_by_score())
                .unwrap();
            for k in [1, 5, 48, 2_000] {
                let ours = top_scored(&searcher, &query, k).unwrap();
                let theirs = searcher
                    .search(&query, &TopDocs::with_limit(k).order_by_score())
                    .unwrap();
                // The first k are tantivy's scores; the rest tie the k-th.
                let scores =
                    |top: &[(Score, DocAddress)]| top.iter().map(|t| t.0).collect::<Vec<_>>();
                assert!(ours.len() >= theirs.len(), "{words:?} k {k}");
                assert_eq!(
                    scores(&ours[..theirs.len()]),
                    scores(&theirs),
                    "{words:?} k {k}"
                );
                let last = theirs.last().map_or(Score::MIN, |t| t.0);
                assert!(
                    ours[theirs.len()..].iter().all(|t| t.0 == last),
                    "{words:?} k {k}"
                );
                extra_ties += ours.len() - theirs.len();
                // Exactly the documents scoring at least the k-th, whichever tantivy kept.
                let at_least = |top: &[(Score, DocAddress)]| {
                    let mut at_least: Vec<DocAddress> =
                        top.iter().filter(|t| t.0 >= last).map(|t| t.1).collect();
                    at_least.sort();
                    at_least
                };
                assert_eq!(at_least(&ours), at_least(&every), "{words:?} k {k}");
                for (_, address) in &ours {
                    let reader = searcher.segment_reader(address.segment_ord);
                    assert!(!reader
                        .alive_bitset()
                        .is_some_and(|a| a.is_deleted(address.doc_id)));
                }
            }
        }
        // The small vocabulary ties often: the ties were there to keep.
        assert!(extra_ties > 0);
    }

    #[test]
    fn ties_pushed_out_of_the_heap_are_kept_until_the_kth_score_rises_past_them() {
        let at = |doc| DocAddress::new(0, doc);
        let mut best = Best::new(2);
        for (doc, score) in [(0, 1.0), (1, 1.0), (2, 1.0), (3, 2.0)] {
            best.push(score, at(doc));
        }
        // 2.0 pushed one 1.0 out; the k-th is still 1.0, so all three 1.0s stay.
        assert_eq!(best.threshold(), 1.0f32.next_down());
        assert_eq!(best.into_sorted().len(), 4);

        let mut best = Best::new(2);
        for (doc, score) in [(0, 1.0), (1, 1.0), (2, 1.0), (3, 2.0), (4, 3.0), (5, 1.5)] {
            best.push(score, at(doc));
        }
        assert_eq!(best.into_sorted(), vec![(3.0, at(4)), (2.0, at(3))]);

        let mut none = Best::new(0);
        none.push(1.0, at(0));
        assert!(none.into_sorted().is_empty());
    }
}
