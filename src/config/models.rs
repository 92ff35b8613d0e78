//! The `models` section: which dense model makes the vectors, and how inference runs.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// Folder laid out by `scripts/fetch-models.sh`.
    pub dir: PathBuf,
    /// Dense embeddings: `minilm` (all-MiniLM-L6-v2 over ONNX Runtime), `static` (wordllama
    /// static vectors) or `off` (lexical only).
    pub dense: DenseModel,
    /// How sentence vectors are made at ingest: `late` (late chunking: the section is run through
    /// the model in windows and each sentence's token states are pooled) or `sentence` (each
    /// sentence embedded on its own).
    pub fine_mode: FineModeName,
    /// Threads ONNX Runtime uses inside one operator.
    pub inference_threads: usize,
    /// ONNX Runtime's CPU memory arena and memory patterns. On, a session reuses its arena across
    /// the runs of one write and hands the free part back after the write's last run (a peak of
    /// about 0.35 GiB above the idle server with 2,048-token batches); off, activations are
    /// allocated per run, which makes inference about twice as slow (the pages are faulted in
    /// again every run).
    pub inference_memory_arena: bool,
    /// Most padded tokens (sequences × the longest) in one model run at ingest, 256..=65536.
    /// Larger batches hold more activation memory per run without running faster on a CPU.
    pub inference_batch_tokens: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseModel {
    Minilm,
    Static,
    Off,
}

impl DenseModel {
    /// The name of the model that makes this server's vectors, as it is persisted: in each
    /// section's embed-reuse identity (`ingest::embed`), the query-vector cache's keys and the
    /// replicated log's vector stamp. Changing it makes stored vectors another model's. `Off`
    /// makes no vectors, so its name is never stored; it reads `minilm`.
    pub fn name(self) -> &'static str {
        match self {
            DenseModel::Static => "static",
            DenseModel::Minilm | DenseModel::Off => "minilm",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FineModeName {
    Late,
    Sentence,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("./models"),
            dense: DenseModel::Minilm,
            fine_mode: FineModeName::Late,
            inference_threads: 2,
            inference_memory_arena: true,
            inference_batch_tokens: 2048,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are stored (embed reuse, the query-vector cache, the log's vector stamp): a
    /// change must be deliberate.
    #[test]
    fn model_names_are_the_persisted_ones() {
        assert_eq!(DenseModel::Minilm.name(), "minilm");
        assert_eq!(DenseModel::Static.name(), "static");
        assert_eq!(DenseModel::Off.name(), "minilm");
    }
}
