//! `Semantic`: LangChain `SemanticChunker` breakpoints over stored sentence similarities, with a
//! hard token limit (groups over it are cut at sentences, then clauses and tokens) and
//! `min_tokens` (a smaller group joins a neighbour when the union fits).

use std::ops::Range;

use super::budget::Cutter;
use super::sentence::sentence_units;
use super::{ChunkSpan, SemanticInput, SemanticThreshold, Strategy};

/// Cuts by semantic breakpoints. Returns false, emitting nothing, when the input does not match
/// the text (sentences out of range, out of order, or a similarity count that is not one less
/// than the sentence count); the caller then falls back to `Sentence`.
pub(super) fn chunk(cutter: &Cutter, input: &SemanticInput, out: &mut Vec<ChunkSpan>) -> bool {
    let text = cutter.text;
    let sentence_count = input.sentences.len();
    if sentence_count == 0 || input.similarities.len() + 1 != sentence_count {
        return false;
    }
    let mut previous_end = 0usize;
    for sentence in input.sentences {
        let (start, end) = (sentence.start as usize, sentence.end as usize);
        if start < previous_end
            || end < start
            || end > text.len()
            || !text.is_char_boundary(start)
            || !text.is_char_boundary(end)
        {
            return false;
        }
        previous_end = end;
    }
    // Group g spans from the start of its first sentence to the start of the next group, so that
    // text between or around the given sentences is never lost.
    let mut cuts: Vec<usize> = Vec::new();
    breakpoints(input.similarities, input.threshold, &mut cuts);
    let mut group_starts: Vec<usize> = Vec::with_capacity(cuts.len() + 2);
    group_starts.push(0);
    group_starts.extend(
        cuts.iter()
            .map(|&after| input.sentences[after + 1].start as usize),
    );
    group_starts.push(text.len());
    let mut groups: Vec<(usize, usize)> = group_starts
        .windows(2)
        .filter_map(|pair| cutter.trimmed(pair[0], pair[1]))
        .collect();
    merge_small_groups(cutter, input.min_tokens as usize, &mut groups);
    let mut units: Vec<Range<u32>> = Vec::new();
    let mut sentence_index = 0;
    for &(start, end) in &groups {
        let first_sentence = sentence_index;
        while sentence_index < sentence_count
            && (input.sentences[sentence_index].start as usize) < end
        {
            sentence_index += 1;
        }
        if cutter.count(start, end) <= cutter.max_tokens {
            cutter.push(out, start, end, Strategy::Semantic, None, None);
            continue;
        }
        // The group's own sentences (clipped to it) as units, packed without overlap.
        units.clear();
        let mut clipped: Vec<Range<u32>> = Vec::new();
        let mut unit_start = start;
        for sentence in &input.sentences[first_sentence..sentence_index] {
            let sentence_end = (sentence.end as usize).clamp(unit_start, end);
            if let Some((a, b)) = cutter.trimmed(unit_start, sentence_end) {
                clipped.push(a as u32..b as u32);
            }
            unit_start = sentence_end;
        }
        if let Some((a, b)) = cutter.trimmed(unit_start, end) {
            clipped.push(a as u32..b as u32);
        }
        sentence_units(cutter, &clipped, cutter.max_tokens, &mut units);
        cutter.pack(&units, cutter.max_tokens, 0, |a, b| {
            cutter.push(out, a, b, Strategy::Semantic, None, None)
        });
    }
    true
}

/// Indices `i` such that a group ends after sentence `i` (LangChain: distance above threshold).
fn breakpoints(similarities: &[f32], threshold: SemanticThreshold, out: &mut Vec<usize>) {
    out.clear();
    let distances: Vec<f64> = similarities.iter().map(|&s| 1.0 - f64::from(s)).collect();
    if distances.is_empty() {
        return;
    }
    let (limit, values): (f64, Vec<f64>) = match threshold {
        SemanticThreshold::Percentile(amount) => {
            (percentile(&distances, f64::from(amount)), distances)
        }
        SemanticThreshold::StdDev(amount) => {
            let (mean, deviation) = mean_and_std(&distances);
            (mean + f64::from(amount) * deviation, distances)
        }
        SemanticThreshold::Interquartile(amount) => {
            let (mean, _) = mean_and_std(&distances);
            let iqr = percentile(&distances, 75.0) - percentile(&distances, 25.0);
            (mean + f64::from(amount) * iqr, distances)
        }
        SemanticThreshold::Gradient(amount) => {
            // LangChain returns two sentences as two chunks here (np.gradient needs two points).
            if distances.len() < 2 {
                out.push(0);
                return;
            }
            let gradient = gradient(&distances);
            (percentile(&gradient, f64::from(amount)), gradient)
        }
    };
    out.extend(
        values
            .iter()
            .enumerate()
            .filter(|&(_, &value)| value > limit)
            .map(|(index, _)| index),
    );
}

/// numpy's default (linear) percentile; NaNs sort last, `amount` is clamped to 0..=100.
fn percentile(values: &[f64], amount: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let amount = if amount.is_nan() {
        100.0
    } else {
        amount.clamp(0.0, 100.0)
    };
    let rank = amount / 100.0 * (sorted.len() - 1) as f64;
    let low = rank.floor() as usize;
    let high = rank.ceil() as usize;
    sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64)
}

/// Mean and population standard deviation (numpy's `np.std`, ddof 0).
fn mean_and_std(values: &[f64]) -> (f64, f64) {
    let count = values.len() as f64;
    let mean = values.iter().sum::<f64>() / count;
    let variance = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / count;
    (mean, variance.sqrt())
}

/// `np.gradient` with unit spacing: one-sided at the ends, central inside.
fn gradient(values: &[f64]) -> Vec<f64> {
    let last = values.len() - 1;
    (0..values.len())
        .map(|i| match i {
            0 => values[1] - values[0],
            i if i == last => values[last] - values[last - 1],
            i => (values[i + 1] - values[i - 1]) / 2.0,
        })
        .collect()
}

/// Merges each group under `min_tokens` into its next neighbour (the previous one for the last
/// group) when the union fits the limit.
fn merge_small_groups(cutter: &Cutter, min_tokens: usize, groups: &mut Vec<(usize, usize)>) {
    if min_tokens == 0 {
        return;
    }
    let mut index = 0;
    while index < groups.len() {
        let (start, end) = groups[index];
        if groups.len() < 2 || cutter.count(start, end) >= min_tokens {
            index += 1;
            continue;
        }
        if index + 1 < groups.len() && cutter.count(start, groups[index + 1].1) <= cutter.max_tokens
        {
            groups[index + 1].0 = start;
            groups.remove(index);
            continue;
        }
        if index > 0 && cutter.count(groups[index - 1].0, end) <= cutter.max_tokens {
            groups[index - 1].1 = end;
            groups.remove(index);
            continue;
        }
        index += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_matches_numpy_linear() {
        // np.percentile([0.1, 0.4, 0.2, 0.9], 95) == 0.825
        assert!((percentile(&[0.1, 0.4, 0.2, 0.9], 95.0) - 0.825).abs() < 1e-12);
        assert!((percentile(&[0.5], 50.0) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn gradient_matches_numpy() {
        // np.gradient([1, 2, 4, 7]) == [1, 1.5, 2.5, 3]
        assert_eq!(gradient(&[1.0, 2.0, 4.0, 7.0]), vec![1.0, 1.5, 2.5, 3.0]);
    }

    #[test]
    fn percentile_rule_breaks_at_the_largest_distance() {
        let mut out = Vec::new();
        breakpoints(
            &[0.9, 0.8, 0.1, 0.85, 0.9],
            SemanticThreshold::Percentile(95.0),
            &mut out,
        );
        assert_eq!(out, [2]);
        breakpoints(
            &[0.9, 0.8, 0.1, 0.85, 0.9],
            SemanticThreshold::StdDev(1.0),
            &mut out,
        );
        assert_eq!(out, [2]);
        breakpoints(
            &[0.9, 0.8, 0.1, 0.85, 0.9],
            SemanticThreshold::Interquartile(1.5),
            &mut out,
        );
        assert_eq!(out, [2]);
    }
}
