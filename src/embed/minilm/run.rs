//! Model runs: sequences sorted by length and packed into batches under a padded-token budget,
//! each batch one run of a session, the runs counted in the embedder's [`InferenceClock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ort::value::TensorRef;

use super::session::SessionSide;
use super::{MiniLmEmbedder, MINILM_DIM};
use crate::embed::{l2_normalize, EmbedError, InferenceTotals, VectorMatrix};

/// [`InferenceTotals`], kept with relaxed atomics (each run adds its own figures once).
#[derive(Debug, Default)]
pub(super) struct InferenceClock {
    runs: AtomicU64,
    sequences: AtomicU64,
    padded_tokens: AtomicU64,
    nanos: AtomicU64,
}

impl InferenceClock {
    pub(super) fn record(
        &self,
        sequences: usize,
        padded_tokens: usize,
        elapsed: std::time::Duration,
    ) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        self.sequences
            .fetch_add(sequences as u64, Ordering::Relaxed);
        self.padded_tokens
            .fetch_add(padded_tokens as u64, Ordering::Relaxed);
        self.nanos.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(super) fn totals(&self) -> InferenceTotals {
        InferenceTotals {
            runs: self.runs.load(Ordering::Relaxed),
            sequences: self.sequences.load(Ordering::Relaxed),
            padded_tokens: self.padded_tokens.load(Ordering::Relaxed),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// One model input: content token ids without [CLS]/[SEP].
pub(super) struct Sequence<'a> {
    pub(super) content_ids: &'a [u32],
}

impl MiniLmEmbedder {
    /// Runs `sequences` through the model in length-sorted batches and hands each sequence's token
    /// states to `sink(sequence_index, states)`, where `states` holds `content_len + 2` rows of
    /// [`MINILM_DIM`] floats: [CLS], the content tokens, [SEP].
    pub(super) fn run_sequences(
        &self,
        sequences: &[Sequence<'_>],
        side: SessionSide,
        mut sink: impl FnMut(usize, &[f32]),
    ) -> Result<(), EmbedError> {
        let mut order: Vec<usize> = (0..sequences.len()).collect();
        order.sort_by_key(|&index| sequences[index].content_ids.len());

        let mut input_ids: Vec<i64> = Vec::new();
        let mut attention_mask: Vec<i64> = Vec::new();
        let mut token_type_ids: Vec<i64> = Vec::new();
        let mut batch_start = 0;
        while batch_start < order.len() {
            // A run takes tens to hundreds of milliseconds and a section's batches can take
            // seconds: stop between runs once the result has no taker (see `cpu_pool`).
            if crate::cpu_pool::current_job_abandoned() {
                return Err(EmbedError::Abandoned);
            }
            let batch_end = self.batch_end(sequences, &order, batch_start);
            let batch = &order[batch_start..batch_end];
            // Sorted ascending, so the last sequence taken sets the padded length.
            let padded_len = sequences[order[batch_end - 1]].content_ids.len() + 2;
            self.fill_batch_inputs(
                sequences,
                batch,
                padded_len,
                &mut input_ids,
                &mut attention_mask,
            );
            token_type_ids.resize(batch.len() * padded_len, 0);

            let shape = [batch.len(), padded_len];
            let inputs = ort::inputs![
                "input_ids" => TensorRef::from_array_view((shape, input_ids.as_slice())).map_err(EmbedError::inference)?,
                "attention_mask" => TensorRef::from_array_view((shape, attention_mask.as_slice())).map_err(EmbedError::inference)?,
                "token_type_ids" => TensorRef::from_array_view((shape, &token_type_ids[..batch.len() * padded_len])).map_err(EmbedError::inference)?,
            ];
            let mut session = self.acquire_session(side);
            let started = Instant::now();
            // The last run of an ingest call hands the arena's free memory back (see
            // `shrink_arena`), so a server between writes holds what it did before them.
            let last_of_ingest = side == SessionSide::Ingest && batch_end == order.len();
            let outputs = match self.shrink_arena.as_ref().filter(|_| last_of_ingest) {
                Some(options) => session.run_with_options(inputs, options),
                None => session.run(inputs),
            }
            .map_err(EmbedError::inference)?;
            self.clock
                .record(batch.len(), batch.len() * padded_len, started.elapsed());
            let hidden = outputs
                .get("last_hidden_state")
                .ok_or_else(|| EmbedError::inference("model has no output `last_hidden_state`"))?;
            let (output_shape, states) = hidden
                .try_extract_tensor::<f32>()
                .map_err(EmbedError::inference)?;
            let expected_shape = [batch.len() as i64, padded_len as i64, MINILM_DIM as i64];
            if output_shape[..] != expected_shape[..]
                || states.len() != batch.len() * padded_len * MINILM_DIM
            {
                return Err(EmbedError::inference(format!(
                    "last_hidden_state has shape {output_shape:?}, expected {expected_shape:?}"
                )));
            }
            for (row, &sequence_index) in batch.iter().enumerate() {
                let real_len = sequences[sequence_index].content_ids.len() + 2;
                let row_start = row * padded_len * MINILM_DIM;
                sink(
                    sequence_index,
                    &states[row_start..row_start + real_len * MINILM_DIM],
                );
            }
            batch_start = batch_end;
        }
        Ok(())
    }

    /// End (exclusive, into `order`) of the batch starting at `batch_start`: at most
    /// `max_batch_sequences` sequences whose padded size stays within `max_batch_tokens` (one
    /// sequence always goes, whatever its length). `order` sorts the sequences by length, so the
    /// last one taken sets the padded length.
    fn batch_end(&self, sequences: &[Sequence<'_>], order: &[usize], batch_start: usize) -> usize {
        let mut batch_end = batch_start;
        while batch_end < order.len() && batch_end - batch_start < self.config.max_batch_sequences {
            let padded_len = sequences[order[batch_end]].content_ids.len() + 2;
            if batch_end > batch_start
                && (batch_end - batch_start + 1) * padded_len > self.config.max_batch_tokens
            {
                break;
            }
            batch_end += 1;
        }
        batch_end
    }

    /// Writes the model inputs of `batch` (indexes into `sequences`) as rows of `padded_len`:
    /// `[CLS] content [SEP]` then padding, with an attention mask of 1 over the real tokens.
    fn fill_batch_inputs(
        &self,
        sequences: &[Sequence<'_>],
        batch: &[usize],
        padded_len: usize,
        input_ids: &mut Vec<i64>,
        attention_mask: &mut Vec<i64>,
    ) {
        input_ids.clear();
        attention_mask.clear();
        input_ids.resize(batch.len() * padded_len, 0);
        attention_mask.resize(batch.len() * padded_len, 0);
        for (row, &sequence_index) in batch.iter().enumerate() {
            let content = sequences[sequence_index].content_ids;
            let ids_row = &mut input_ids[row * padded_len..(row + 1) * padded_len];
            ids_row[0] = self.cls_token_id;
            for (slot, &id) in ids_row[1..].iter_mut().zip(content) {
                *slot = i64::from(id);
            }
            ids_row[content.len() + 1] = self.sep_token_id;
            attention_mask[row * padded_len..row * padded_len + content.len() + 2].fill(1);
        }
    }

    /// Embeds texts given as token id lists (already truncated), mean-pooling every row of the
    /// model input ([CLS] and [SEP] included, as sentence-transformers does); list `i` goes to
    /// row `targets[i].1` of `matrices[targets[i].0]`.
    pub(super) fn embed_token_lists(
        &self,
        token_lists: &[&[u32]],
        targets: &[(usize, usize)],
        matrices: &mut [VectorMatrix],
        side: SessionSide,
    ) -> Result<(), EmbedError> {
        let sequences: Vec<Sequence<'_>> = token_lists
            .iter()
            .map(|&content_ids| Sequence { content_ids })
            .collect();
        self.run_sequences(&sequences, side, |sequence_index, states| {
            let (matrix_index, row_index) = targets[sequence_index];
            let row = matrices[matrix_index].row_mut(row_index);
            row.fill(0.0);
            for token_state in states.chunks_exact(MINILM_DIM) {
                row.iter_mut()
                    .zip(token_state)
                    .for_each(|(sum, x)| *sum += x);
            }
            // Scaling by 1 / token count would not change the direction.
            l2_normalize(row);
        })
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use super::*;
    use crate::embed::minilm::two_session_embedder;
    use crate::embed::{Embedder, FineMode};

    #[test]
    fn every_model_run_is_counted_with_its_sequences_tokens_and_time() {
        let embedder = two_session_embedder();
        assert_eq!(
            embedder.inference_totals(),
            Some(InferenceTotals::default())
        );
        let text = "Lathe cuts chunks at query time. Each caller gets its own sizes.";
        let sentences = [0..32, 33..text.len()];
        let sections: Vec<(&str, &[Range<usize>])> = vec![(text, &sentences); 3];
        embedder
            .sentence_vectors_of_sections(&sections, FineMode::LateChunking)
            .expect("embeds");
        let after_ingest = embedder.inference_totals().expect("MiniLM keeps totals");
        // The ingest call's last run shrank the arena (it is on in this embedder).
        assert!(embedder.shrink_arena.is_some());
        // Three short sections are one window each, filling one batch.
        assert_eq!((after_ingest.runs, after_ingest.sequences), (1, 3));
        let content = embedder
            .tokenize(text, usize::MAX)
            .expect("tokenizes")
            .ids
            .len();
        assert_eq!(after_ingest.padded_tokens as usize, 3 * (content + 2));
        assert!(after_ingest.seconds > 0.0, "{after_ingest:?}");
        embedder
            .embed_query("where are chunks cut")
            .expect("embeds");
        let after_query = embedder.inference_totals().expect("MiniLM keeps totals");
        assert_eq!((after_query.runs, after_query.sequences), (2, 4));
        assert!(after_query.seconds > after_ingest.seconds);
    }
}
