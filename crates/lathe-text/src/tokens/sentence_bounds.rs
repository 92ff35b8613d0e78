//! UAX #29 sentence boundaries, with a fast path for ASCII text.
//!
//! `unicode-segmentation` is the reference: [`sentence_bound_indices`] gives exactly what its
//! `split_sentence_bound_indices` gives, for any text. Its iterator looks up every char's
//! sentence-break class by a table search and was a sixth of a lexical ingest's CPU (sentence
//! ranges are stored with every section). Text that is all ASCII, most of a technical corpus,
//! goes through [`AsciiSentenceBreaks`] instead: the same state machine over the ASCII classes
//! (a 128-entry table), rules SB1–SB11 as the crate applies them. Property tests compare the two
//! on random ASCII text weighted towards the characters the rules look at.

use unicode_segmentation::UnicodeSegmentation;

/// The (byte offset, segment) pairs of `text` split at its UAX #29 sentence boundaries: what
/// `unicode_segmentation`'s `split_sentence_bound_indices` returns, computed without its class
/// lookups when `text` is ASCII.
pub fn sentence_bound_indices(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let (ascii, any) = if text.is_ascii() {
        (Some(AsciiSentenceBounds::new(text)), None)
    } else {
        (None, Some(text.split_sentence_bound_indices()))
    };
    ascii.into_iter().flatten().chain(any.into_iter().flatten())
}

/// The sentence-break classes that occur in ASCII (UAX #29, table 4): no `Sep`, `OLetter`,
/// `Extend` or `Format` char is ASCII.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Cr,
    Lf,
    Sp,
    Lower,
    Upper,
    Numeric,
    ATerm,
    STerm,
    Close,
    SContinue,
    Other,
}

/// The class of each ASCII byte.
const CLASSES: [Class; 128] = {
    let mut classes = [Class::Other; 128];
    let mut byte = 0;
    while byte < 128 {
        classes[byte] = match byte as u8 {
            b'\r' => Class::Cr,
            b'\n' => Class::Lf,
            b'\t' | 0x0b | 0x0c | b' ' => Class::Sp,
            b'a'..=b'z' => Class::Lower,
            b'A'..=b'Z' => Class::Upper,
            b'0'..=b'9' => Class::Numeric,
            b'.' => Class::ATerm,
            b'!' | b'?' => Class::STerm,
            b'"' | b'\'' | b'(' | b')' | b'[' | b']' | b'{' | b'}' => Class::Close,
            b',' | b'-' | b':' | b';' => Class::SContinue,
            _ => Class::Other,
        };
        byte += 1;
    }
    classes
};

/// What the rules remember of the text before a position: runs of `Close` and of `Sp` collapse
/// into one part each, letters of either case are one part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Sot,
    Eot,
    Other,
    Cr,
    Lf,
    ATerm,
    UpperLower,
    ClosePlus,
    SpPlus,
    STerm,
}

/// The last four parts, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State([Part; 4]);

impl State {
    const START: State = State([Part::Sot; 4]);

    fn next(self, class: Class) -> State {
        let parts = self.0;
        match (parts[3], class) {
            (Part::ClosePlus, Class::Close) | (Part::SpPlus, Class::Sp) => self,
            _ => State([
                parts[1],
                parts[2],
                parts[3],
                match class {
                    Class::Cr => Part::Cr,
                    Class::Lf => Part::Lf,
                    Class::ATerm => Part::ATerm,
                    Class::Upper | Class::Lower => Part::UpperLower,
                    Class::Close => Part::ClosePlus,
                    Class::Sp => Part::SpPlus,
                    Class::STerm => Part::STerm,
                    Class::Numeric | Class::SContinue | Class::Other => Part::Other,
                },
            ]),
        }
    }

    fn end(self) -> State {
        let parts = self.0;
        State([parts[1], parts[2], parts[3], Part::Eot])
    }

    fn last(self) -> Part {
        self.0[3]
    }

    /// The part before a trailing `Close*` (and, with `skip_spaces`, a `Sp*` after it).
    fn before_close_and_spaces(self, skip_spaces: bool) -> Part {
        let parts = self.0;
        let mut index = 3;
        if skip_spaces && parts[index] == Part::SpPlus {
            index -= 1;
        }
        if parts[index] == Part::ClosePlus {
            index -= 1;
        }
        parts[index]
    }

    /// SB8a's left side, `SATerm Close* Sp*`.
    fn after_terminator(self) -> bool {
        matches!(
            self.before_close_and_spaces(true),
            Part::ATerm | Part::STerm
        )
    }

    /// SB11's left side, `SATerm Close* Sp* ParaSep?`.
    fn after_terminator_and_break(self) -> bool {
        let parts = self.0;
        let mut index = if matches!(parts[3], Part::Cr | Part::Lf) {
            2
        } else {
            3
        };
        if parts[index] == Part::SpPlus {
            index -= 1;
        }
        if parts[index] == Part::ClosePlus {
            index -= 1;
        }
        matches!(parts[index], Part::ATerm | Part::STerm)
    }
}

/// SB8: `ATerm Close* Sp* × ( ¬(OLetter | Upper | Lower | ParaSep | SATerm) )* Lower`, with
/// `ahead` the text from the char being decided on.
fn no_break_before_lower(state: State, ahead: &[u8]) -> bool {
    if state.before_close_and_spaces(true) != Part::ATerm {
        return false;
    }
    for &byte in ahead {
        match CLASSES[usize::from(byte)] {
            Class::Lower => return true,
            Class::Upper | Class::Cr | Class::Lf | Class::STerm | Class::ATerm => return false,
            _ => {}
        }
    }
    false
}

/// The sentence break positions of an ASCII text, as `unicode-segmentation`'s forward iterator
/// yields them: 0 first (for a non-empty text), then each break, then the text's end.
struct AsciiSentenceBreaks<'t> {
    bytes: &'t [u8],
    position: usize,
    state: State,
}

impl Iterator for AsciiSentenceBreaks<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.position < self.bytes.len() {
            let before = self.position;
            let state_before = self.state;
            let class = CLASSES[usize::from(self.bytes[before] & 0x7f)];
            self.position += 1;
            self.state = state_before.next(class);
            let last = state_before.last();
            // Inside a run of words: after a letter, digit or other char, none of SB1–SB11 can
            // apply before a letter, digit, `SContinue` or other char (each needs a terminator,
            // a paragraph separator or the start before it, or a space, close or break here).
            if matches!(last, Part::UpperLower | Part::Other)
                && matches!(
                    class,
                    Class::Lower | Class::Upper | Class::Numeric | Class::SContinue | Class::Other
                )
            {
                continue;
            }
            // SB1: a break at the start of the text.
            if last == Part::Sot {
                return Some(before);
            }
            // SB3: CR × LF.
            if class == Class::Lf && last == Part::Cr {
                continue;
            }
            // SB4: ParaSep ÷.
            if matches!(last, Part::Cr | Part::Lf) {
                return Some(before);
            }
            // SB6: ATerm × Numeric.
            if class == Class::Numeric && last == Part::ATerm {
                continue;
            }
            // SB7: (Upper | Lower) ATerm × Upper.
            if class == Class::Upper && state_before.0[2] == Part::UpperLower && last == Part::ATerm
            {
                continue;
            }
            // SB8.
            if no_break_before_lower(state_before, &self.bytes[before..]) {
                continue;
            }
            // SB8a: SATerm Close* Sp* × (SContinue | SATerm).
            if matches!(class, Class::SContinue | Class::STerm | Class::ATerm)
                && state_before.after_terminator()
            {
                continue;
            }
            // SB9: SATerm Close* × (Close | Sp | ParaSep).
            if matches!(class, Class::Close | Class::Sp | Class::Cr | Class::Lf)
                && matches!(
                    state_before.before_close_and_spaces(false),
                    Part::ATerm | Part::STerm
                )
            {
                continue;
            }
            // SB10: SATerm Close* Sp* × (Sp | ParaSep).
            if matches!(class, Class::Sp | Class::Cr | Class::Lf) && state_before.after_terminator()
            {
                continue;
            }
            // SB11: SATerm Close* Sp* ParaSep? ÷.
            if state_before.after_terminator_and_break() {
                return Some(before);
            }
            // SB998: Any × Any.
        }
        // SB2: a break at the end of a non-empty text.
        if matches!(self.state.last(), Part::Sot | Part::Eot) {
            None
        } else {
            self.state = self.state.end();
            Some(self.position)
        }
    }
}

/// The segments between consecutive breaks, with their byte offsets.
struct AsciiSentenceBounds<'t> {
    text: &'t str,
    breaks: AsciiSentenceBreaks<'t>,
    segment_start: Option<usize>,
}

impl<'t> AsciiSentenceBounds<'t> {
    fn new(text: &'t str) -> Self {
        debug_assert!(text.is_ascii());
        Self {
            text,
            breaks: AsciiSentenceBreaks {
                bytes: text.as_bytes(),
                position: 0,
                state: State::START,
            },
            segment_start: None,
        }
    }
}

impl<'t> Iterator for AsciiSentenceBounds<'t> {
    type Item = (usize, &'t str);

    fn next(&mut self) -> Option<(usize, &'t str)> {
        let start = match self.segment_start {
            Some(start) => start,
            None => self.breaks.next()?,
        };
        let end = self.breaks.next()?;
        self.segment_start = Some(end);
        Some((start, &self.text[start..end]))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn reference(text: &str) -> Vec<(usize, &str)> {
        text.split_sentence_bound_indices().collect()
    }

    fn fast(text: &str) -> Vec<(usize, &str)> {
        AsciiSentenceBounds::new(text).collect()
    }

    #[test]
    fn the_classes_are_those_of_uax_29() {
        // Each ASCII char alone, after a letter and a period, and before a lower-case word: the
        // places where its class decides a break.
        for byte in 0u8..128 {
            let c = char::from(byte);
            for text in [
                format!("{c}"),
                format!("Ab.{c}x y"),
                format!("Ab. {c}x"),
                format!("Ab.){c} y"),
                format!("Ab?{c}Cd"),
                format!("x{c}. y"),
                format!("A.{c}\nB"),
                format!("A.\r{c}B"),
            ] {
                assert_eq!(fast(&text), reference(&text), "{text:?}");
            }
        }
    }

    #[test]
    fn hand_picked_texts_break_as_the_crate_does() {
        for text in [
            "",
            " ",
            "One. Two! Three? Four",
            "Mr. Smith went to Washington. He said \"Hi.\" Then left.",
            "He said (this.) and that.  \n\nNext para.\r\nAnother.\rLast",
            "etc. and so on. Version 3.14 is out. U.S.A. Army",
            "Wait... what?! Really?? \"Yes.\" 'No.' (Maybe.) [Sure.] {Ok.}",
            "a.b.c. d, e; f: g- h.-i. j",
            ".\n.\r.\r\n. . .",
            "ABC. DEF. ghi. jkl.\tmno.\x0bpqr.\x0cstu.",
        ] {
            assert_eq!(fast(text), reference(text), "{text:?}");
            assert_eq!(
                sentence_bound_indices(text).collect::<Vec<_>>(),
                reference(text)
            );
        }
    }

    #[test]
    fn text_that_is_not_ascii_goes_to_the_crate() {
        let text = "Café. Naïve? 今天很好。你好吗？ Done.";
        assert_eq!(
            sentence_bound_indices(text).collect::<Vec<_>>(),
            reference(text)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn any_ascii_text_breaks_as_the_crate_does(text in "[ -~\t\n\r\x0b\x0c]{0,200}") {
            prop_assert_eq!(fast(&text), reference(&text));
        }

        /// The characters the rules look at, often and next to each other.
        #[test]
        fn terminator_heavy_text_breaks_as_the_crate_does(
            text in "[aZ9 .!?\"')(,;:\\-\r\n\t#]{0,80}"
        ) {
            prop_assert_eq!(fast(&text), reference(&text));
        }
    }
}
