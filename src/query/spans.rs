//! What the stages after score share about spans: when two spans of a section are one (pack and
//! expand merge them), and the text of a passage (join counts it, assemble returns it).

use super::PackedSpan;
use crate::index::SectionHit;

/// True when two byte ranges of `text` overlap or only whitespace lies between them.
pub(super) fn overlaps_or_touches(text: &str, a: (u32, u32), b: (u32, u32)) -> bool {
    let (first, second) = if a.0 <= b.0 { (a, b) } else { (b, a) };
    if second.0 <= first.1 {
        return true;
    }
    text.get(first.1 as usize..second.0 as usize)
        .is_some_and(|gap| gap.chars().all(char::is_whitespace))
}

/// Appends the text of the passage made of `parts` (spans of consecutive sections that
/// [`super::join::join`] joined): each part's text, and the gap of its section between it and
/// the next.
pub(super) fn push_text(out: &mut String, parts: &[PackedSpan], hits: &[SectionHit]) {
    for (i, part) in parts.iter().enumerate() {
        let hit = &hits[part.hit_index as usize];
        out.push_str(&hit.text[part.start as usize..part.end as usize]);
        if i + 1 < parts.len() {
            out.push_str(&hit.gap_after);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_means_only_whitespace_between() {
        let text = "one two  three";
        assert!(overlaps_or_touches(text, (0, 3), (4, 7)));
        assert!(overlaps_or_touches(text, (4, 7), (0, 3)));
        assert!(overlaps_or_touches(text, (0, 5), (4, 7)));
        assert!(!overlaps_or_touches(text, (0, 3), (9, 14)));
    }
}
