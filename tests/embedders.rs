//! The embedders against reference vectors computed in Python (onnxruntime 1.31.1 + tokenizers,
//! same model files; scripts/reference_vectors.py), and the behaviour of the two fine modes.
//! Needs the model files: `LATHE_MODELS_DIR`, else `<crate>/models`, else /work/main/models.

// Lists of one sentence range are meant, not ranges to collect.
#![allow(clippy::single_range_in_vec_init)]

use std::ops::Range;
use std::path::PathBuf;
use std::sync::OnceLock;

use lathe::embed::{
    cosine, Embedder, FineMode, MiniLmConfig, MiniLmEmbedder, QuantizedVectors, StaticEmbedder,
};
use unicode_segmentation::UnicodeSegmentation;

fn models_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("LATHE_MODELS_DIR") {
        return PathBuf::from(dir);
    }
    let in_crate = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models");
    if in_crate.join("minilm/model.onnx").exists() {
        return in_crate;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models")
}

fn minilm() -> &'static MiniLmEmbedder {
    static EMBEDDER: OnceLock<MiniLmEmbedder> = OnceLock::new();
    EMBEDDER.get_or_init(|| {
        MiniLmEmbedder::new(MiniLmConfig::from_models_dir(&models_dir())).expect("MiniLM loads")
    })
}

fn static_embedder() -> &'static StaticEmbedder {
    static EMBEDDER: OnceLock<StaticEmbedder> = OnceLock::new();
    EMBEDDER
        .get_or_init(|| StaticEmbedder::from_models_dir(&models_dir()).expect("wordllama loads"))
}

#[derive(serde::Deserialize)]
struct Reference {
    sentences: Vec<String>,
    minilm: Vec<Vec<f32>>,
    #[serde(rename = "static")]
    static_vectors: Vec<Vec<f32>>,
}

fn reference() -> Reference {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reference_vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture exists"))
        .expect("fixture parses")
}

/// Sentence ranges by Unicode sentence bounds (stand-in for `chunk::sentences`).
fn sentence_ranges(text: &str) -> Vec<Range<usize>> {
    text.split_sentence_bound_indices()
        .map(|(start, sentence)| start..start + sentence.len())
        .collect()
}

#[test]
fn minilm_matches_python_reference_vectors() {
    let reference = reference();
    let texts: Vec<&str> = reference.sentences.iter().map(String::as_str).collect();
    let vectors = minilm().embed_texts(&texts).expect("embeds");
    for (i, expected) in reference.minilm.iter().enumerate() {
        let similarity = cosine(vectors.row(i), expected);
        assert!(
            similarity >= 0.999,
            "sentence {i}: cosine {similarity} to the Python vector"
        );
    }
    // Reference cosines from Python onnxruntime.
    let cat_kitten = cosine(vectors.row(0), vectors.row(1));
    assert!((cat_kitten - 0.6406).abs() < 0.002, "{cat_kitten}");
    assert!((cosine(vectors.row(0), vectors.row(2)) + 0.0097).abs() < 0.002);
    assert!((cosine(vectors.row(1), vectors.row(2)) + 0.0096).abs() < 0.002);
    // Batching and sorting must not change a vector: each alone equals each in the batch.
    for (i, text) in texts.iter().enumerate() {
        let alone = minilm().embed_query(text).expect("embeds");
        assert!(cosine(&alone, vectors.row(i)) > 0.99999);
    }
}

/// A MiniLM that writes its optimised model into `dir` while it opens.
fn minilm_optimized_in(dir: &std::path::Path) -> MiniLmEmbedder {
    let mut config = MiniLmConfig::from_models_dir(&models_dir());
    config.session_count = 2;
    config.optimized_model_dir = Some(dir.to_path_buf());
    MiniLmEmbedder::new(config).expect("MiniLM loads")
}

/// Largest difference of two vector sets, element by element.
fn largest_difference(a: &lathe::embed::VectorMatrix, b: &lathe::embed::VectorMatrix) -> f32 {
    assert_eq!((a.rows(), a.dim()), (b.rows(), b.dim()));
    (0..a.rows())
        .flat_map(|i| a.row(i).iter().zip(b.row(i)).map(|(x, y)| (x - y).abs()))
        .fold(0.0, f32::max)
}

#[test]
fn the_optimised_model_gives_the_same_vectors_and_leaves_no_files() {
    let scratch = tempfile::tempdir().expect("temp dir");
    let dir = scratch.path().join("minilm-optimized");
    // What a crash during an earlier open left behind is emptied first.
    std::fs::create_dir_all(&dir).expect("creates");
    std::fs::write(dir.join("weights.bin"), b"a torn write").expect("writes");
    let optimized = minilm_optimized_in(&dir);
    assert!(optimized.loaded_optimized_model());
    assert!(!minilm().loaded_optimized_model());
    assert!(
        !dir.exists(),
        "the optimised model's files are removed once loaded"
    );

    let reference = reference();
    let mut texts: Vec<&str> = reference.sentences.iter().map(String::as_str).collect();
    let long = "Lathe cuts chunks at query time, for each caller's budget. ".repeat(40);
    texts.push(&long);
    let direct = minilm().embed_texts(&texts).expect("embeds");
    let from_optimized = optimized.embed_texts(&texts).expect("embeds");
    let difference = largest_difference(&direct, &from_optimized);
    assert!(difference <= 1e-5, "largest difference {difference}");

    // Sentence vectors in both fine modes too (late chunking runs windows of 256 tokens).
    let ranges = sentence_ranges(&long);
    for mode in [FineMode::LateChunking, FineMode::PerSentence] {
        let direct = minilm()
            .sentence_vectors(&long, &ranges, mode)
            .expect("embeds");
        let from_optimized = optimized
            .sentence_vectors(&long, &ranges, mode)
            .expect("embeds");
        let difference = largest_difference(&direct, &from_optimized);
        assert!(
            difference <= 1e-5,
            "{mode:?}: largest difference {difference}"
        );
    }
}

#[test]
fn an_unwritable_optimised_model_dir_still_loads_the_model() {
    let scratch = tempfile::tempdir().expect("temp dir");
    let file = scratch.path().join("a-file");
    std::fs::write(&file, b"not a directory").expect("writes");
    // A directory cannot be made under a file: the sessions optimise the model file themselves.
    let optimized = minilm_optimized_in(&file.join("minilm-optimized"));
    assert!(!optimized.loaded_optimized_model());
    let reference = reference();
    let texts: Vec<&str> = reference.sentences.iter().map(String::as_str).collect();
    let difference = largest_difference(
        &minilm().embed_texts(&texts).expect("embeds"),
        &optimized.embed_texts(&texts).expect("embeds"),
    );
    assert!(difference <= 1e-5, "largest difference {difference}");
    assert_eq!(std::fs::read(&file).expect("reads"), b"not a directory");
}

#[test]
fn static_embedder_matches_python_reference_vectors() {
    let reference = reference();
    let texts: Vec<&str> = reference.sentences.iter().map(String::as_str).collect();
    let vectors = static_embedder().embed_texts(&texts).expect("embeds");
    assert_eq!(static_embedder().dim(), 256);
    for (i, expected) in reference.static_vectors.iter().enumerate() {
        let similarity = cosine(vectors.row(i), expected);
        assert!(similarity >= 0.9999, "sentence {i}: cosine {similarity}");
    }
    assert!(static_embedder()
        .embed_texts(&[""])
        .expect("embeds")
        .row(0)
        .iter()
        .all(|&x| x == 0.0));
}

#[test]
fn per_sentence_vectors_equal_embedding_each_sentence_alone() {
    let text = "The cat sits on the mat.   \n\nQuarterly revenue grew 12 percent. A kitten is resting on a rug.";
    let mut ranges = sentence_ranges(text);
    ranges.push(24..27); // spaces only: no tokens
    let vectors = minilm()
        .sentence_vectors(text, &ranges, FineMode::PerSentence)
        .expect("embeds");
    assert_eq!(vectors.rows(), ranges.len());
    for (row, range) in ranges.iter().enumerate() {
        let sentence = &text[range.clone()];
        if sentence.trim().is_empty() {
            assert!(
                vectors.row(row).iter().all(|&x| x == 0.0),
                "a sentence without tokens gets a zero vector"
            );
            continue;
        }
        let alone = minilm().embed_query(sentence).expect("embeds");
        assert!(
            cosine(&alone, vectors.row(row)) > 0.99999,
            "sentence {row}: {sentence:?}"
        );
    }
    assert!(minilm()
        .sentence_vectors(text, &[0..1000], FineMode::PerSentence)
        .is_err());
}

#[test]
fn late_chunking_resolves_references_to_earlier_sentences() {
    // The example of Günther et al. (2024): "Its" and "The city" only mean Berlin in context.
    let text = "Berlin is the capital and largest city of Germany. Its more than 3.85 million inhabitants make it \
        the most populous city of the European Union. The city is also one of the states of Germany.";
    let ranges = sentence_ranges(text);
    assert_eq!(ranges.len(), 3);
    let late = minilm()
        .sentence_vectors(text, &ranges, FineMode::LateChunking)
        .expect("embeds");
    let alone = minilm()
        .sentence_vectors(text, &ranges, FineMode::PerSentence)
        .expect("embeds");
    let query = minilm()
        .embed_query("What is the population of Berlin?")
        .expect("embeds");
    for row in 1..3 {
        let gain = cosine(&query, late.row(row)) - cosine(&query, alone.row(row));
        assert!(
            gain > 0.08,
            "sentence {row}: late chunking gained only {gain}"
        );
    }
    // One sentence covering the whole text: late chunking is the mean of its content tokens,
    // close to (not equal to) the plain embedding, which also averages [CLS] and [SEP].
    let whole = minilm()
        .sentence_vectors(text, &[0..text.len()], FineMode::LateChunking)
        .expect("embeds");
    let similarity = cosine(whole.row(0), &minilm().embed_query(text).expect("embeds"));
    assert!(similarity > 0.99 && similarity < 0.99999, "{similarity}");
}

#[test]
fn late_chunking_windows_cut_long_sections_consistently() {
    // About 700 tokens: several windows, so sentences meet window cuts.
    let paragraph = "Marie Curie was a physicist and chemist who conducted pioneering research on radioactivity. \
        She was the first woman to win a Nobel Prize. Her husband Pierre shared the first prize with her. \
        The couple discovered polonium and radium in a shed in Paris. ";
    let text = paragraph.repeat(12);
    let ranges = sentence_ranges(&text);
    let tokens = minilm().count_tokens(&text).expect("tokenizes");
    assert!(tokens > 600, "{tokens} tokens");
    let late = minilm()
        .sentence_vectors(&text, &ranges, FineMode::LateChunking)
        .expect("embeds");
    assert_eq!(late.rows(), ranges.len());

    // Other windows (wider overlap) must give similar vectors. Not identical: a sentence near the
    // end of one window sits mid-window in the other, and token states depend on position
    // (observed: 1.0 in the shared first and last windows, 0.86..0.998 in between).
    let mut config = MiniLmConfig::from_models_dir(&models_dir());
    config.late_chunking_overlap_tokens = 96;
    let other = MiniLmEmbedder::new(config).expect("loads");
    let late_other = other
        .sentence_vectors(&text, &ranges, FineMode::LateChunking)
        .expect("embeds");
    let mut similarity_sum = 0.0;
    for row in 0..late.rows() {
        let norm = late.row(row).iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "row {row} norm {norm}");
        let similarity = cosine(late.row(row), late_other.row(row));
        assert!(
            similarity > 0.8,
            "row {row}: {similarity} between overlaps 32 and 96"
        );
        similarity_sum += similarity;
    }

    let mean_similarity = similarity_sum / late.rows() as f32;
    assert!(mean_similarity > 0.95, "mean similarity {mean_similarity}");

    // Pooled chunk vectors from stored int8 sentence vectors stay close to the chunk embedded whole.
    let stored = QuantizedVectors::from_bytes(&QuantizedVectors::from_matrix(&late).to_bytes())
        .expect("parses");
    let weights: Vec<f32> = ranges[0..4]
        .iter()
        .map(|r| minilm().count_tokens(&text[r.clone()]).unwrap_or(0) as f32)
        .collect();
    let pooled = stored.pool(0..4, &weights).expect("pools");
    let direct = minilm()
        .embed_query(&text[ranges[0].start..ranges[3].end])
        .expect("embeds");
    let similarity = cosine(&pooled, &direct);
    assert!(
        similarity > 0.8,
        "pooled chunk vs chunk embedded whole: {similarity}"
    );
}

#[test]
fn static_sentence_vectors_ignore_the_mode() {
    let text = "Rust is fast. Python is friendly.  ";
    let ranges = sentence_ranges(text);
    let a = static_embedder()
        .sentence_vectors(text, &ranges, FineMode::PerSentence)
        .expect("embeds");
    let b = static_embedder()
        .sentence_vectors(text, &ranges, FineMode::LateChunking)
        .expect("embeds");
    assert_eq!(a, b);
    assert!(static_embedder()
        .sentence_vectors(text, &[3..100], FineMode::PerSentence)
        .is_err());
}

#[test]
fn sections_embedded_together_equal_sections_embedded_alone() {
    let texts = [
        "Berlin is the capital of Germany. Its population is 3.8 million.",
        "   ",
        "Rust is a systems language. It has no garbage collector. Cargo builds it.",
    ];
    let ranges: Vec<Vec<Range<usize>>> = texts.iter().map(|t| sentence_ranges(t)).collect();
    let sections: Vec<(&str, &[Range<usize>])> = texts
        .iter()
        .zip(&ranges)
        .map(|(t, r)| (*t, r.as_slice()))
        .collect();
    for mode in [FineMode::PerSentence, FineMode::LateChunking] {
        let together = minilm()
            .sentence_vectors_of_sections(&sections, mode)
            .expect("embeds");
        assert_eq!(together.len(), texts.len());
        for (i, (text, sentence_ranges)) in sections.iter().enumerate() {
            let alone = minilm()
                .sentence_vectors(text, sentence_ranges, mode)
                .expect("embeds");
            assert_eq!(alone.rows(), together[i].rows());
            for row in 0..alone.rows() {
                let similarity = cosine(alone.row(row), together[i].row(row));
                let both_zero = alone
                    .row(row)
                    .iter()
                    .chain(together[i].row(row))
                    .all(|&x| x == 0.0);
                assert!(
                    both_zero || similarity > 0.99999,
                    "{mode:?} section {i} row {row}: {similarity}"
                );
            }
        }
    }
}
