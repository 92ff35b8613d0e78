//! The embed stage: sentence vectors of every section (batched across the sections of all the
//! documents), stored as int8, and each section's vector: the mean of its sentence vectors
//! weighted by their length.
//!
//! Reuse: the model sees only a section's text and its sentence ranges, so a section whose
//! [`embed_key`] matches one already stored (the previous version of the same document, see
//! [`ReusableVectors`]) or one earlier in the same batch takes those vectors and is not sent to
//! the model. An edit of one paragraph costs one section's inference; a re-upsert of identical
//! content costs none.

use std::collections::HashMap;
use std::ops::Range;

use super::SentencedDocument;
use crate::content_hash::content_hash;
use crate::embed::{Embedder, FineMode, QuantizedVectors, VectorMatrix};
use crate::error::{LatheError, Result};
use crate::index::StoredEmbedding;

/// What makes a section's vectors: the model and how it is run. Part of every [`embed_key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbedIdentity<'a> {
    /// The model's name as the config gives it (`static`, `minilm`).
    pub model: &'a str,
    pub mode: FineMode,
}

/// The content hash of everything the model sees of a section (its text and sentence ranges)
/// and of what runs it: equal keys give equal vectors.
pub fn embed_key(identity: EmbedIdentity<'_>, text: &str, sentences: &[Range<u32>]) -> u64 {
    let mode: &[u8] = match identity.mode {
        FineMode::LateChunking => b"late",
        FineMode::PerSentence => b"sentence",
    };
    let text_len = (text.len() as u64).to_le_bytes();
    let ranges: Vec<u8> = sentences
        .iter()
        .flat_map(|range| [range.start.to_le_bytes(), range.end.to_le_bytes()])
        .flatten()
        .collect();
    content_hash([
        b"lathe embed input v1\0".as_slice(),
        identity.model.as_bytes(),
        b"\0",
        mode,
        b"\0",
        &text_len,
        text.as_bytes(),
        &ranges,
    ])
}

/// Stored vectors an upsert may reuse, by [`embed_key`].
#[derive(Debug, Default)]
pub struct ReusableVectors {
    by_key: HashMap<u64, SectionVectors>,
}

/// One section's vectors as stored: `QuantizedVectors` bytes of its sentences and of itself.
#[derive(Clone, Debug)]
struct SectionVectors {
    sentence_vectors: Vec<u8>,
    section_vector: Vec<u8>,
}

impl ReusableVectors {
    /// The stored sections' vectors, keyed as if `identity` had made them: a collection's stored
    /// vectors are those of the server's model and fine mode (its dense index and its queries
    /// already assume so). Sections stored without vectors, or whose vectors do not have `dim`
    /// columns and one row per sentence, are left out (they are embedded again).
    pub fn from_stored(
        identity: EmbedIdentity<'_>,
        dim: usize,
        stored: impl IntoIterator<Item = StoredEmbedding>,
    ) -> Self {
        let mut by_key = HashMap::new();
        for section in stored {
            let fits = |bytes: &[u8], rows: usize| {
                QuantizedVectors::from_bytes(bytes)
                    .is_ok_and(|vectors| vectors.dim() == dim && vectors.len() == rows)
            };
            if section.sentences.is_empty()
                || !fits(&section.sentence_vectors, section.sentences.len())
                || !fits(&section.section_vector, 1)
            {
                continue;
            }
            let key = embed_key(identity, &section.text, &section.sentences);
            by_key.insert(
                key,
                SectionVectors {
                    sentence_vectors: section.sentence_vectors,
                    section_vector: section.section_vector,
                },
            );
        }
        Self { by_key }
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

/// How many sections of a batch went to the model and how many reused vectors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmbedCounts {
    pub embedded: usize,
    pub reused: usize,
}

#[tracing::instrument(level = "debug", skip_all, fields(documents = documents.len(), reusable = reusable.len()))]
pub fn embed(
    embedder: &dyn Embedder,
    identity: EmbedIdentity<'_>,
    documents: &mut [SentencedDocument],
    reusable: &ReusableVectors,
) -> Result<EmbedCounts> {
    // Each section's key; the first section of each key not stored is the one sent to the model.
    let keys = section_keys(identity, documents);
    let (to_embed, inputs) = sections_to_embed(documents, &keys, reusable);
    let matrices = run_model(embedder, identity.mode, &inputs)?;
    drop(inputs);
    let embedded = pool_embedded_sections(documents, &keys, &to_embed, &matrices);
    Ok(assign_section_vectors(
        documents, &keys, reusable, &to_embed, &embedded,
    ))
}

/// The [`embed_key`] of every section of `documents`, in order.
fn section_keys(identity: EmbedIdentity<'_>, documents: &[SentencedDocument]) -> Vec<u64> {
    documents
        .iter()
        .flat_map(|document| {
            (0..document.sections.len()).map(|i| {
                embed_key(
                    identity,
                    document.section_text(i),
                    &document.sections[i].sentences,
                )
            })
        })
        .collect()
}

/// One input of the model: a section's text and its sentences' byte ranges.
type ModelInput<'a> = (&'a str, Vec<Range<usize>>);

/// The model's inputs: the first section of each key that is not stored; with the input index
/// of each such key.
fn sections_to_embed<'a>(
    documents: &'a [SentencedDocument],
    keys: &[u64],
    reusable: &ReusableVectors,
) -> (HashMap<u64, usize>, Vec<ModelInput<'a>>) {
    let mut to_embed: HashMap<u64, usize> = HashMap::new();
    let mut inputs: Vec<ModelInput<'a>> = Vec::new();
    let texts = documents.iter().flat_map(|document| {
        (0..document.sections.len()).map(|i| (document.section_text(i), &document.sections[i]))
    });
    for ((text, section), key) in texts.zip(keys) {
        if reusable.by_key.contains_key(key) || to_embed.contains_key(key) {
            continue;
        }
        to_embed.insert(*key, inputs.len());
        let ranges = section
            .sentences
            .iter()
            .map(|r| r.start as usize..r.end as usize)
            .collect();
        inputs.push((text, ranges));
    }
    (to_embed, inputs)
}

/// The sentence vectors of each input, in one batched model call (none when nothing is new).
fn run_model(
    embedder: &dyn Embedder,
    mode: FineMode,
    inputs: &[ModelInput<'_>],
) -> Result<Vec<VectorMatrix>> {
    let model_inputs: Vec<(&str, &[Range<usize>])> = inputs
        .iter()
        .map(|(text, ranges)| (*text, ranges.as_slice()))
        .collect();
    if model_inputs.is_empty() {
        return Ok(Vec::new());
    }
    embedder
        .sentence_vectors_of_sections(&model_inputs, mode)
        .map_err(|e| LatheError::Unavailable(format!("embedding failed: {e}")))
}

/// Each embedded input's stored vectors, in input order: its matrix pooled with the sentence
/// lengths of the section it came from as weights.
fn pool_embedded_sections(
    documents: &[SentencedDocument],
    keys: &[u64],
    to_embed: &HashMap<u64, usize>,
    matrices: &[VectorMatrix],
) -> Vec<Option<SectionVectors>> {
    // The sentence lengths of each embedded input, in input order, to weight the pooling.
    let mut sentences_of_inputs: Vec<&[Range<u32>]> = vec![&[][..]; to_embed.len()];
    let sections = documents.iter().flat_map(|document| &document.sections);
    for (section, key) in sections.zip(keys) {
        if let Some(&input) = to_embed.get(key) {
            sentences_of_inputs[input] = &section.sentences;
        }
    }
    matrices
        .iter()
        .zip(&sentences_of_inputs)
        .map(|(matrix, sentences)| section_vectors(matrix, sentences))
        .collect()
}

/// Gives every section its vectors, stored or embedded, and counts which were which.
fn assign_section_vectors(
    documents: &mut [SentencedDocument],
    keys: &[u64],
    reusable: &ReusableVectors,
    to_embed: &HashMap<u64, usize>,
    embedded: &[Option<SectionVectors>],
) -> EmbedCounts {
    let mut counts = EmbedCounts::default();
    let mut sent = vec![false; embedded.len()];
    let sections = documents
        .iter_mut()
        .flat_map(|document| document.sections.iter_mut());
    for (section, key) in sections.zip(keys) {
        let vectors = match (reusable.by_key.get(key), to_embed.get(key)) {
            (Some(stored), _) => {
                counts.reused += 1;
                Some(stored)
            }
            (None, Some(&input)) => {
                // The first section of a key is the one the model saw; later ones reuse it.
                if std::mem::replace(&mut sent[input], true) {
                    counts.reused += 1;
                } else {
                    counts.embedded += 1;
                }
                embedded.get(input).and_then(Option::as_ref)
            }
            (None, None) => None,
        };
        if let Some(vectors) = vectors {
            section.sentence_vectors = vectors.sentence_vectors.clone();
            section.section_vector = vectors.section_vector.clone();
        }
    }
    counts
}

/// A section's stored vectors from the model's sentence vectors: int8 rows, and their mean
/// weighted by sentence length. None when the section has no sentences.
fn section_vectors(matrix: &VectorMatrix, sentences: &[Range<u32>]) -> Option<SectionVectors> {
    if matrix.is_empty() {
        return None;
    }
    let quantized = QuantizedVectors::from_matrix(matrix);
    let weights: Vec<f32> = sentences.iter().map(|r| (r.end - r.start) as f32).collect();
    let pooled = quantized.pool(0..quantized.len(), &weights).ok()?;
    let section_vector = VectorMatrix::from_values(pooled.len(), pooled)?;
    Some(SectionVectors {
        sentence_vectors: quantized.to_bytes(),
        section_vector: QuantizedVectors::from_matrix(&section_vector).to_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::embed::EmbedError;
    use crate::ingest::SentencedSection;
    use crate::sections::SectionSpan;
    use crate::types::{DocumentFormat, DocumentInput};

    const IDENTITY: EmbedIdentity<'static> = EmbedIdentity {
        model: "counting",
        mode: FineMode::LateChunking,
    };

    /// A deterministic 4-d embedder (each sentence's vector from its bytes) that counts the
    /// sections it is given.
    #[derive(Default)]
    struct CountingEmbedder {
        sections: AtomicUsize,
    }

    impl Embedder for CountingEmbedder {
        fn dim(&self) -> usize {
            4
        }

        fn embed_texts(&self, texts: &[&str]) -> std::result::Result<VectorMatrix, EmbedError> {
            let mut values = Vec::new();
            for text in texts {
                let mut row = [1.0f32; 4];
                for (i, byte) in text.bytes().enumerate() {
                    row[i % 4] += f32::from(byte);
                }
                let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
                values.extend(row.map(|v| v / norm));
            }
            Ok(VectorMatrix::from_values(4, values).expect("4 columns"))
        }

        fn sentence_vectors(
            &self,
            section_text: &str,
            sentences: &[Range<usize>],
            _mode: FineMode,
        ) -> std::result::Result<VectorMatrix, EmbedError> {
            self.sections.fetch_add(1, Ordering::SeqCst);
            let texts: Vec<&str> = sentences.iter().map(|r| &section_text[r.clone()]).collect();
            if texts.is_empty() {
                return Ok(VectorMatrix::zeros(4, 0));
            }
            self.embed_texts(&texts)
        }
    }

    /// A document whose sections are `texts`, each one sentence, joined by a blank line.
    fn sentenced(id: &str, texts: &[&str]) -> SentencedDocument {
        let text = texts.join("\n\n");
        let mut sections = Vec::new();
        let mut start = 0;
        for section_text in texts {
            sections.push(SentencedSection {
                span: SectionSpan {
                    start,
                    end: start + section_text.len(),
                    heading_path: Vec::new(),
                },
                sentences: std::iter::once(0..section_text.len() as u32).collect(),
                sentence_vectors: Vec::new(),
                section_vector: Vec::new(),
            });
            start += section_text.len() + 2;
        }
        SentencedDocument {
            document: DocumentInput {
                id: id.into(),
                title: String::new(),
                text: text.clone(),
                format: DocumentFormat::Plain,
                metadata: BTreeMap::new(),
                sections: None,
            },
            text,
            sections,
        }
    }

    /// What the index would hand back of `document`'s stored sections.
    fn stored(document: &SentencedDocument) -> Vec<StoredEmbedding> {
        (0..document.sections.len())
            .map(|i| StoredEmbedding {
                text: document.section_text(i).to_string(),
                sentences: document.sections[i].sentences.clone(),
                sentence_vectors: document.sections[i].sentence_vectors.clone(),
                section_vector: document.sections[i].section_vector.clone(),
            })
            .collect()
    }

    fn vectors(document: &SentencedDocument) -> Vec<(Vec<u8>, Vec<u8>)> {
        document
            .sections
            .iter()
            .map(|s| (s.sentence_vectors.clone(), s.section_vector.clone()))
            .collect()
    }

    #[test]
    fn unchanged_sections_reuse_stored_vectors_equal_to_fresh_ones() {
        let embedder = CountingEmbedder::default();
        let mut first = vec![sentenced("d", &["alpha one.", "beta two.", "gamma three."])];
        let counts = embed(&embedder, IDENTITY, &mut first, &ReusableVectors::default()).unwrap();
        assert_eq!(
            counts,
            EmbedCounts {
                embedded: 3,
                reused: 0
            }
        );
        let reusable = ReusableVectors::from_stored(IDENTITY, 4, stored(&first[0]));
        assert_eq!(reusable.len(), 3);

        let edited = ["alpha one.", "beta, rewritten and longer.", "gamma three."];
        let mut second = vec![sentenced("d", &edited)];
        embedder.sections.store(0, Ordering::SeqCst);
        let counts = embed(&embedder, IDENTITY, &mut second, &reusable).unwrap();
        assert_eq!(
            counts,
            EmbedCounts {
                embedded: 1,
                reused: 2
            }
        );
        assert_eq!(embedder.sections.load(Ordering::SeqCst), 1);

        let mut fresh = vec![sentenced("d", &edited)];
        embed(&embedder, IDENTITY, &mut fresh, &ReusableVectors::default()).unwrap();
        assert_eq!(vectors(&second[0]), vectors(&fresh[0]));
        assert!(vectors(&second[0])
            .iter()
            .all(|(s, v)| !s.is_empty() && !v.is_empty()));
    }

    #[test]
    fn identical_sections_of_one_batch_go_to_the_model_once() {
        let embedder = CountingEmbedder::default();
        let mut batch = vec![
            sentenced("a", &["shared footer.", "only in a."]),
            sentenced("b", &["shared footer.", "only in b."]),
        ];
        let counts = embed(&embedder, IDENTITY, &mut batch, &ReusableVectors::default()).unwrap();
        assert_eq!(
            counts,
            EmbedCounts {
                embedded: 3,
                reused: 1
            }
        );
        assert_eq!(embedder.sections.load(Ordering::SeqCst), 3);
        assert_eq!(vectors(&batch[0])[0], vectors(&batch[1])[0]);
        assert_ne!(vectors(&batch[0])[1], vectors(&batch[1])[1]);
    }

    #[test]
    fn stored_vectors_of_another_shape_or_another_input_are_not_reused() {
        let embedder = CountingEmbedder::default();
        let mut first = vec![sentenced("d", &["alpha one.", "beta two."])];
        embed(&embedder, IDENTITY, &mut first, &ReusableVectors::default()).unwrap();
        // Another dimension (another model), or no vectors stored (written lexical-only).
        assert!(ReusableVectors::from_stored(IDENTITY, 8, stored(&first[0])).is_empty());
        let mut bare = stored(&first[0]);
        for section in &mut bare {
            section.sentence_vectors.clear();
            section.section_vector.clear();
        }
        assert!(ReusableVectors::from_stored(IDENTITY, 4, bare).is_empty());

        let whole: &[Range<u32>] = &[Range { start: 0, end: 10 }];
        let key = embed_key(IDENTITY, "alpha one.", whole);
        let per_sentence = EmbedIdentity {
            mode: FineMode::PerSentence,
            ..IDENTITY
        };
        let other_model = EmbedIdentity {
            model: "other",
            ..IDENTITY
        };
        for other in [
            embed_key(per_sentence, "alpha one.", whole),
            embed_key(other_model, "alpha one.", whole),
            embed_key(IDENTITY, "alpha one!", whole),
            embed_key(IDENTITY, "alpha one.", &[0..5, 6..10]),
        ] {
            assert_ne!(other, key);
        }
    }
}
