//! Reading a collection: BM25 and dense search over a [`Snapshot`], section loads and
//! statistics, as methods of [`CollectionIndex`]. Every section is read from tantivy's doc store
//! as bytes (`snapshot`) and decoded by `section_document` (bounded, verified against its
//! checksum and its position), never by tantivy's document decoder; one that fails is recorded
//! in the collection's `Integrity` and answers DATA_LOSS naming its document, while the others
//! are served.

use std::collections::{HashMap, HashSet};

use tantivy::collector::{Count, TopDocs};
use tantivy::directory::OwnedBytes;
use tantivy::query::{BooleanQuery, ConstScoreQuery, Occur, Query, TermQuery};
use tantivy::schema::IndexRecordOption;
use tantivy::{DocAddress, Term};

use super::handle::CollectionIndex;
use super::records::{SectionHit, StoredEmbedding};
use super::schema::{self, metadata_term};
use super::section_document::{decode_ranges, decode_verified_section, StoredSection};
use super::snapshot::{stored_document_id, FoundSection, Snapshot};
use super::top_k::top_by_score_then_key;
use crate::error::{LatheError, Result};
use crate::types::{CollectionStats, DenseStats, Filter};

impl CollectionIndex {
    /// Analysed terms of `text`, deduplicated, in first-seen order.
    pub fn query_terms(&self, text: &str) -> Vec<String> {
        let mut analyzer = schema::analyzer();
        let mut stream = analyzer.token_stream(text);
        let mut seen = HashSet::new();
        let mut terms = Vec::new();
        while stream.advance() {
            let term = &stream.token().text;
            if seen.insert(term.clone()) {
                terms.push(term.clone());
            }
        }
        terms
    }

    /// BM25 over section text and titles for `terms`, restricted by `filter`; best `limit` first.
    pub fn search(
        &self,
        snapshot: &Snapshot,
        terms: &[String],
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<SectionHit>> {
        let found = self.find(snapshot, terms, filter, limit)?;
        self.read_found(snapshot, &found)
    }

    /// The sections at `found`, read and verified, each scored as found, returned in `found`'s
    /// order. They are read in the order they lie in the doc store, so each block is
    /// decompressed once for all the sections it holds, however few blocks the store caches.
    pub fn read_found(
        &self,
        snapshot: &Snapshot,
        found: &[FoundSection],
    ) -> Result<Vec<SectionHit>> {
        let mut order: Vec<usize> = (0..found.len()).collect();
        order.sort_unstable_by_key(|&i| (found[i].address.segment_ord, found[i].address.doc_id));
        let mut read: Vec<(usize, SectionHit)> = Vec::with_capacity(found.len());
        for i in order {
            let section = &found[i];
            read.push((i, self.load_hit(snapshot, section.score, section.address)?));
        }
        read.sort_unstable_by_key(|(i, _)| *i);
        Ok(read.into_iter().map(|(_, hit)| hit).collect())
    }

    /// [`Self::search`] without reading the sections.
    pub fn find(
        &self,
        snapshot: &Snapshot,
        terms: &[String],
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<FoundSection>> {
        if terms.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let fields = &self.fields;
        let mut should: Vec<(Occur, Box<dyn Query>)> = Vec::with_capacity(terms.len() * 2);
        for term in terms {
            for field in [fields.text, fields.title_text] {
                let term = Term::from_field_text(field, term);
                should.push((
                    Occur::Should,
                    Box::new(TermQuery::new(term, IndexRecordOption::WithFreqs)),
                ));
            }
        }
        let terms = BooleanQuery::new(should);
        let filters = self.filter_clauses(filter);
        // Unfiltered, the disjunction of term queries is the whole query: tantivy's top-k runs
        // it with block-max WAND, skipping blocks of postings that cannot reach the k-th score.
        // Nested under a MUST (as a filter needs), it is scored document by document.
        let query: Box<dyn Query> = if filters.is_empty() {
            Box::new(terms)
        } else {
            let mut clauses: Vec<(Occur, Box<dyn Query>)> = vec![(Occur::Must, Box::new(terms))];
            clauses.extend(filters);
            Box::new(BooleanQuery::new(clauses))
        };
        top_by_score_then_key(snapshot, query.as_ref(), limit)?
            .into_iter()
            .map(|(score, key, address)| self.found_keyed(snapshot, score, key, address))
            .collect()
    }

    /// The section at `address` as found, its key from the fast field.
    fn found(&self, snapshot: &Snapshot, score: f32, address: DocAddress) -> Result<FoundSection> {
        self.found_keyed(snapshot, score, snapshot.section_key_at(address), address)
    }

    /// The section at `address` with the key the fast field gave (`key`); a position without
    /// one is read at once, which reports it as damaged.
    fn found_keyed(
        &self,
        snapshot: &Snapshot,
        score: f32,
        key: Option<u64>,
        address: DocAddress,
    ) -> Result<FoundSection> {
        let section_key = match key {
            Some(key) => key,
            None => self.load_hit(snapshot, score, address)?.section_key,
        };
        Ok(FoundSection {
            address,
            section_key,
            score,
        })
    }

    /// Constant-zero clauses that hold `filter` (metadata terms, doc ids) in either leg.
    fn filter_clauses(&self, filter: &Filter) -> Vec<(Occur, Box<dyn Query>)> {
        let fields = &self.fields;
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        for (key, value) in &filter.metadata {
            let term = Term::from_field_text(fields.metadata_terms, &metadata_term(key, value));
            clauses.push((
                Occur::Must,
                constant_zero(TermQuery::new(term, IndexRecordOption::Basic)),
            ));
        }
        if !filter.doc_ids.is_empty() {
            let ids: Vec<(Occur, Box<dyn Query>)> = filter
                .doc_ids
                .iter()
                .map(|id| {
                    let term = Term::from_field_text(fields.doc_id, id);
                    (
                        Occur::Should,
                        Box::new(TermQuery::new(term, IndexRecordOption::Basic)) as Box<dyn Query>,
                    )
                })
                .collect();
            clauses.push((Occur::Must, constant_zero(BooleanQuery::new(ids))));
        }
        clauses
    }

    pub fn has_dense(&self) -> bool {
        self.dense.is_some()
    }

    /// The dense index of section vectors, for tools that inspect or time it alone.
    pub fn dense(&self) -> Option<&crate::dense::DenseIndex> {
        self.dense.as_deref()
    }

    /// The sections nearest to `query` in the dense index that are in `snapshot` and pass
    /// `filter`, best first, scored by cosine similarity.
    pub fn search_dense(
        &self,
        snapshot: &Snapshot,
        query: &[f32],
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<SectionHit>> {
        let found = self.find_dense(snapshot, query, filter, limit)?;
        self.read_found(snapshot, &found)
    }

    /// [`Self::search_dense`] without reading the sections.
    pub fn find_dense(
        &self,
        snapshot: &Snapshot,
        query: &[f32],
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<FoundSection>> {
        let Some(dense) = &self.dense else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Filters are checked in tantivy; ask for more neighbours when they may drop some.
        let unfiltered = filter.metadata.is_empty() && filter.doc_ids.is_empty();
        let wanted = if unfiltered {
            limit
        } else {
            (limit * 8).max(64)
        };
        let neighbours = dense
            .search(query, wanted, &|_| true)
            .map_err(|e| LatheError::internal(format!("dense search: {e}")))?;
        if neighbours.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<(Occur, Box<dyn Query>)> = neighbours
            .iter()
            .map(|(key, _)| {
                let term = Term::from_field_u64(self.fields.section_key, *key);
                (
                    Occur::Should,
                    Box::new(TermQuery::new(term, IndexRecordOption::Basic)) as Box<dyn Query>,
                )
            })
            .collect();
        let mut clauses: Vec<(Occur, Box<dyn Query>)> =
            vec![(Occur::Must, constant_zero(BooleanQuery::new(keys)))];
        clauses.extend(self.filter_clauses(filter));
        let found = snapshot.searcher.search(
            &BooleanQuery::new(clauses),
            &TopDocs::with_limit(neighbours.len()).order_by_score(),
        )?;
        let similarity: HashMap<u64, f32> = neighbours.into_iter().collect();
        let mut hits = found
            .into_iter()
            .map(|(_, address)| self.found(snapshot, 0.0, address))
            .collect::<Result<Vec<_>>>()?;
        for hit in &mut hits {
            hit.score = similarity.get(&hit.section_key).copied().unwrap_or(0.0);
        }
        hits.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then(a.section_key.cmp(&b.section_key))
        });
        hits.truncate(limit);
        Ok(hits)
    }

    /// The section at `address`, verified (see [`CollectionIndex::read_section`]).
    fn load_hit(&self, snapshot: &Snapshot, score: f32, address: DocAddress) -> Result<SectionHit> {
        let stored = self.stored_bytes(snapshot, address)?;
        self.read_section(snapshot, address, &stored)?.to_hit(score)
    }

    /// The doc-store bytes of the section at `address` and the key of the section that position
    /// holds, or DATA_LOSS naming its document.
    fn stored_bytes(
        &self,
        snapshot: &Snapshot,
        address: DocAddress,
    ) -> Result<(OwnedBytes, Option<u64>)> {
        snapshot
            .stored_bytes(address)
            .map_err(|why| self.damaged_section(snapshot, address, why))
    }

    /// Decodes `stored` (read for `address`) and verifies it: the section exactly as it was
    /// written, and the one at that position, or DATA_LOSS naming its document.
    fn read_section<'b>(
        &self,
        snapshot: &Snapshot,
        address: DocAddress,
        stored: &'b (OwnedBytes, Option<u64>),
    ) -> Result<StoredSection<'b>> {
        let (bytes, expected_key) = stored;
        decode_verified_section(bytes, *expected_key, &self.fields)
            .map_err(|why| self.damaged_section(snapshot, address, why))
    }

    /// Records a section that failed verification and builds the caller's DATA_LOSS. The document
    /// is named from the `doc_id` fast field (in another, verified file), not from the damaged
    /// stored bytes.
    fn damaged_section(&self, snapshot: &Snapshot, address: DocAddress, why: String) -> LatheError {
        let segment = snapshot.searcher.segment_reader(address.segment_ord);
        let store_file = format!("{}.store", segment.segment_id().uuid_string());
        let document = stored_document_id(&snapshot.searcher, address)
            .unwrap_or_else(|| format!("at {store_file} position {}", address.doc_id));
        self.integrity.record(format!(
            "document `{document}` (in index file `{store_file}`): {why}"
        ));
        LatheError::DataLoss {
            collection: self.integrity.collection().to_string(),
            documents: vec![document],
            detail: format!(
                "{why}; upsert the document again or restore the collection from a backup"
            ),
        }
    }

    pub fn stats(&self) -> Result<CollectionStats> {
        let snapshot = self.snapshot();
        let searcher = &snapshot.searcher;
        let head = TermQuery::new(
            Term::from_field_u64(self.fields.head, 1),
            IndexRecordOption::Basic,
        );
        let documents = searcher.search(&head, &Count)? as u64;
        let mut bytes = 0u64;
        for segment in searcher.segment_readers() {
            let column = segment.fast_fields().u64("doc_bytes")?;
            for doc in segment.doc_ids_alive() {
                bytes += column.first(doc).unwrap_or(0);
            }
        }
        let dense = match &self.dense {
            None => None,
            Some(dense) => {
                let mut live_keys = Vec::with_capacity(searcher.num_docs() as usize);
                for segment in searcher.segment_readers() {
                    let keys = segment.fast_fields().u64("section_key")?;
                    live_keys.extend(segment.doc_ids_alive().filter_map(|doc| keys.first(doc)));
                }
                let sections_with_vector = dense.count_contained(live_keys);
                Some(DenseStats {
                    vectors: dense.len() as u64,
                    sections_with_vector,
                })
            }
        };
        Ok(CollectionStats {
            documents,
            sections: searcher.num_docs(),
            bytes,
            generation: snapshot.generation,
            dense,
        })
    }

    /// Every live section of `doc_id` as (ordinal, version), for consistency checks.
    pub fn document_sections(&self, doc_id: &str) -> Result<Vec<(u64, u64)>> {
        let mut sections =
            self.map_document_sections(doc_id, |section| (section.ordinal, section.version))?;
        sections.sort_unstable();
        Ok(sections)
    }

    /// The text, sentence ranges and vectors of every live section of `doc_id` (each verified
    /// against its checksum), in no particular order: what an upsert of a new version of the
    /// document may reuse.
    pub fn document_embeddings(&self, doc_id: &str) -> Result<Vec<StoredEmbedding>> {
        self.map_document_sections(doc_id, |section| StoredEmbedding {
            text: section.text.to_string(),
            sentences: decode_ranges(section.sentence_ranges),
            sentence_vectors: section.sentence_vectors.to_vec(),
            section_vector: section.section_vector.to_vec(),
        })
    }

    /// `each` of every live section of `doc_id`, read and verified in one snapshot, in no
    /// particular order; DATA_LOSS naming the document if one is damaged.
    fn map_document_sections<T>(
        &self,
        doc_id: &str,
        each: impl Fn(StoredSection<'_>) -> T,
    ) -> Result<Vec<T>> {
        let snapshot = self.snapshot();
        let query = TermQuery::new(
            Term::from_field_text(self.fields.doc_id, doc_id),
            IndexRecordOption::Basic,
        );
        let hits = snapshot
            .searcher
            .search(&query, &TopDocs::with_limit(1_000_000).order_by_score())?;
        let mut sections = Vec::with_capacity(hits.len());
        for (_, address) in hits {
            let stored = self.stored_bytes(&snapshot, address)?;
            let section = self.read_section(&snapshot, address, &stored)?;
            sections.push(each(section));
        }
        Ok(sections)
    }
}

fn constant_zero(query: impl Query) -> Box<dyn Query> {
    Box::new(ConstScoreQuery::new(Box::new(query), 0.0))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::records::{section_key, WriteOp};
    use super::super::testing::{document, open, record, write_and_wait, written_collection};
    use super::*;

    #[test]
    fn equal_scores_come_back_by_section_key_whatever_the_segments() {
        // Twelve documents with the same text score the same for any query: which of them make
        // the top five must not depend on how commits cut the index into segments.
        let ids: Vec<String> = (0..12).map(|i| format!("twin{i}")).collect();
        let answers: Vec<Vec<u64>> = [1, 5, 12]
            .iter()
            .map(|&per_commit| {
                let data_dir = tempfile::tempdir().unwrap();
                let index = open(&data_dir.path().join("index")).unwrap();
                // Commits of `per_commit` documents, in another order each time.
                let mut order = ids.clone();
                order.rotate_left(per_commit);
                for group in order.chunks(per_commit) {
                    let ops = group
                        .iter()
                        .map(|id| WriteOp::Upsert(record(id, "boats in the harbour")))
                        .collect();
                    write_and_wait(&index, ops);
                }
                let snapshot = index.snapshot();
                let terms = index.query_terms("boats");
                let hits = index
                    .search(&snapshot, &terms, &Filter::default(), 5)
                    .unwrap();
                assert!(hits.windows(2).all(|pair| pair[0].score == pair[1].score));
                hits.iter().map(|hit| hit.section_key).collect()
            })
            .collect();
        let mut lowest: Vec<u64> = ids.iter().map(|id| section_key(id, 0, 1)).collect();
        lowest.sort_unstable();
        lowest.truncate(5);
        for answer in &answers {
            assert_eq!(answer, &lowest);
        }
    }

    #[test]
    fn found_sections_come_back_in_the_order_asked_whatever_their_order_in_the_store() {
        // Three commits, so three segments; read_found reads in store order, and must still
        // return each section at the place the caller put it.
        let data_dir = tempfile::tempdir().unwrap();
        let index = open(&data_dir.path().join("index")).unwrap();
        for commit in 0..3 {
            let ops = (0..2)
                .map(|i| {
                    let n = commit * 2 + i;
                    let text = format!("harbour {}boats", "harbour ".repeat(n));
                    WriteOp::Upsert(record(&format!("doc{n}"), &text))
                })
                .collect();
            write_and_wait(&index, ops);
        }
        let snapshot = index.snapshot();
        let terms = index.query_terms("harbour");
        let mut found = index
            .find(&snapshot, &terms, &Filter::default(), 10)
            .unwrap();
        assert_eq!(found.len(), 6);
        // Neither score order nor store order.
        found.swap(0, 3);
        found.swap(1, 5);
        let hits = index.read_found(&snapshot, &found).unwrap();
        let asked: Vec<(u64, f32)> = found.iter().map(|f| (f.section_key, f.score)).collect();
        let read: Vec<(u64, f32)> = hits.iter().map(|h| (h.section_key, h.score)).collect();
        assert_eq!(read, asked);
        for hit in &hits {
            let n: usize = hit.doc_id["doc".len()..].parse().unwrap();
            assert_eq!(hit.text.matches("harbour").count(), n + 1);
        }
    }

    #[test]
    fn sections_read_back_exactly_and_verified() {
        let data_dir = tempfile::tempdir().unwrap();
        let index = open(&written_collection(data_dir.path())).unwrap();
        let snapshot = index.snapshot();
        let hits = index
            .search(
                &snapshot,
                &index.query_terms("hazards"),
                &Filter::default(),
                8,
            )
            .unwrap();
        assert_eq!(hits.len(), 1);
        let hit = &hits[0];
        assert_eq!(
            (
                hit.doc_id.as_str(),
                hit.text.as_str(),
                hit.heading_path.clone()
            ),
            (
                "a",
                "hazards in their line of sight",
                vec!["Intro".to_string()]
            )
        );
        assert_eq!(hit.metadata.get("lang").map(String::as_str), Some("en"));
        assert_eq!(hit.sentences, vec![0..7, 8..30]);
        assert_eq!(index.document_sections("b").unwrap(), vec![(0, 1)]);
        assert_eq!(index.damage(), None);
    }

    #[test]
    fn filters_restrict_the_search_and_stats_count_what_is_live() {
        let data_dir = tempfile::tempdir().unwrap();
        let index = open(&data_dir.path().join("index")).unwrap();
        let mut french = record("b", "boats in the harbour and hazards");
        french.metadata = BTreeMap::from([("lang".to_string(), "fr".to_string())]);
        let documents = [
            record("a", "hazards in their line of sight"),
            french,
            document("c", 1, &["hazards at sea", "calm water"]),
        ];
        let bytes: u64 = documents.iter().map(|document| document.text_bytes).sum();
        write_and_wait(&index, documents.map(WriteOp::Upsert).into());
        let snapshot = index.snapshot();
        let terms = index.query_terms("Hazards, hazards and HARBOURS");
        assert_eq!(terms, ["hazard", "and", "harbour"]);
        let found = |filter: Filter| -> Vec<String> {
            let hits = index.search(&snapshot, &terms[..1], &filter, 8).unwrap();
            let mut ids: Vec<String> = hits.into_iter().map(|hit| hit.doc_id).collect();
            ids.sort();
            ids
        };
        assert_eq!(found(Filter::default()), ["a", "b", "c"]);
        let lang = |value: &str| vec![("lang".to_string(), value.to_string())];
        let metadata_fr = Filter {
            metadata: lang("fr"),
            doc_ids: Vec::new(),
        };
        assert_eq!(found(metadata_fr), ["b"]);
        let ids_a_c = Filter {
            metadata: Vec::new(),
            doc_ids: vec!["a".to_string(), "c".to_string()],
        };
        assert_eq!(found(ids_a_c), ["a", "c"]);
        // Both must hold: `b` is French.
        let en_and_b = Filter {
            metadata: lang("en"),
            doc_ids: vec!["b".to_string()],
        };
        assert!(found(en_and_b).is_empty());

        let stats = index.stats().unwrap();
        assert_eq!(
            (stats.documents, stats.sections, stats.bytes),
            (3, 4, bytes)
        );
        assert_eq!(stats.generation, snapshot.generation);
        assert!(stats.dense.is_none());
    }
}
