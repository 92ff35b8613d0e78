//! The chunking strategies and their units, as the service and the chunker both name them.

/// How a section is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Windows of `max_size` tokens, words or chars with `overlap`.
    Fixed,
    /// Whole sentences packed up to `max_size` tokens, overlapping by whole trailing sentences.
    Sentence,
    /// LangChain-style recursive separator splitting with token overlap.
    Recursive,
    /// Markdown aware: headings start chunks; code, tables and lists stay whole when they fit.
    Structure,
    /// Looks at the section and routes to `Csv`, `Code`, `Structure` or `Sentence`.
    Auto,
    /// Breakpoints between sentences from stored sentence similarities.
    Semantic,
    /// (Added) CSV/TSV: groups of whole rows, the header row reported in `ChunkSpan::header`.
    Csv,
    /// (Added) Source code: top-level blocks (functions, classes) found by indentation and braces.
    Code,
}

impl Strategy {
    /// Every strategy, in the order of the proto enum.
    pub const ALL: [Strategy; 8] = [
        Strategy::Fixed,
        Strategy::Sentence,
        Strategy::Recursive,
        Strategy::Structure,
        Strategy::Auto,
        Strategy::Semantic,
        Strategy::Csv,
        Strategy::Code,
    ];

    /// The lowercase name stored in a collection's settings and accepted on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Fixed => "fixed",
            Strategy::Sentence => "sentence",
            Strategy::Recursive => "recursive",
            Strategy::Structure => "structure",
            Strategy::Auto => "auto",
            Strategy::Semantic => "semantic",
            Strategy::Csv => "csv",
            Strategy::Code => "code",
        }
    }

    /// The strategy called `name` (see [`Strategy::name`]); `None` for any other text.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|strategy| strategy.name() == name)
    }
}

/// The unit of `max_size` and `overlap` for [`Strategy::Fixed`]; other strategies count tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Unit {
    #[default]
    Tokens,
    /// UAX #29 words (segments holding a letter or digit).
    Words,
    /// Unicode scalar values.
    Chars,
}

/// LangChain `SemanticChunker` breakpoint rules over distances `1 - similarity`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SemanticThreshold {
    /// Break where the distance exceeds this percentile of all distances (default 95).
    Percentile(f32),
    /// Break where the distance exceeds mean + amount × standard deviation (default 3).
    StdDev(f32),
    /// Break where the distance exceeds mean + amount × interquartile range (default 1.5).
    Interquartile(f32),
    /// Break where the distance gradient exceeds this percentile of the gradient (default 95).
    Gradient(f32),
}

impl Default for SemanticThreshold {
    fn default() -> Self {
        Self::Percentile(95.0)
    }
}
