//! The dense index with real MiniLM vectors: a paraphrased question finds its section.

use std::collections::HashSet;
use std::path::PathBuf;

use lathe::dense::{DenseIndex, DenseIndexConfig};
use lathe::embed::{Embedder, MiniLmConfig, MiniLmEmbedder};

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

const SECTIONS: [&str; 20] = [
    "To set up the software, run the installer and follow the prompts; it copies the binaries and adds them to your path.",
    "The quarterly report shows revenue grew twelve percent while operating costs stayed flat.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The Treaty of Westphalia in 1648 ended the Thirty Years' War in Europe.",
    "Preheat the oven to 200 degrees and bake the bread for forty minutes until golden.",
    "The goalkeeper saved a penalty in the final minute, sending the match to extra time.",
    "Mitochondria are the organelles that produce most of a cell's chemical energy.",
    "Interest rates were raised by the central bank to curb inflation.",
    "The Amazon rainforest spans nine countries and holds a tenth of known species.",
    "Use a torque wrench to tighten the wheel nuts in a star pattern.",
    "The sonnet is a fourteen-line poem with a fixed rhyme scheme.",
    "Jupiter is the largest planet in the solar system, with dozens of moons.",
    "Back up your data regularly to an external drive or cloud storage.",
    "The orchestra tuned to the oboe's A before the symphony began.",
    "Glaciers carve U-shaped valleys as they move slowly downhill.",
    "A balanced diet includes vegetables, whole grains and lean protein.",
    "The court ruled that the contract was void because it lacked consideration.",
    "Honeybees communicate the location of flowers through a waggle dance.",
    "Concrete cures over several weeks and gains most of its strength in the first month.",
    "The museum's new wing displays impressionist paintings from private collections.",
];

#[test]
fn paraphrased_question_finds_its_section_and_survives_seal_and_reopen() {
    let embedder =
        MiniLmEmbedder::new(MiniLmConfig::from_models_dir(&models_dir())).expect("MiniLM loads");
    let vectors = embedder.embed_texts(&SECTIONS).expect("embeds");
    let dir = tempfile::tempdir().expect("tempdir");
    let (index, _) = DenseIndex::open(
        dir.path(),
        DenseIndexConfig::new(embedder.dim()),
        &HashSet::new(),
    )
    .expect("opens");
    index
        .insert_many((0..SECTIONS.len()).map(|i| (1000 + i as u64, vectors.row(i))))
        .expect("inserts");

    let query = embedder
        .embed_query("How do I install the package?")
        .expect("embeds");
    let hits = index.search(&query, 5, &|_| true).expect("searches");
    assert_eq!(hits[0].0, 1000, "{hits:?}");
    let backup = embedder
        .embed_query("How should I keep copies of my files safe?")
        .expect("embeds");
    assert_eq!(
        index.search(&backup, 1, &|_| true).expect("searches")[0].0,
        1012
    );

    index.seal();
    drop(index);
    let live: HashSet<u64> = (0..SECTIONS.len()).map(|i| 1000 + i as u64).collect();
    let (loaded, missing) =
        DenseIndex::open(dir.path(), DenseIndexConfig::new(embedder.dim()), &live).expect("opens");
    assert!(missing.is_empty(), "{missing:?}");
    let reloaded_hits = loaded.search(&query, 5, &|_| true).expect("searches");
    assert_eq!(
        hits.iter().map(|h| h.0).collect::<Vec<_>>(),
        reloaded_hits.iter().map(|h| h.0).collect::<Vec<_>>()
    );

    // Deleted: the install section never comes back, whatever the query.
    assert!(loaded.delete(1000));
    for _ in 0..3 {
        let hits = loaded.search(&query, 20, &|_| true).expect("searches");
        assert_eq!(hits.len(), 19);
        assert!(hits.iter().all(|(id, _)| *id != 1000));
    }
}
