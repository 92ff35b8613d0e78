//! tantivy's English stemmer with the stems of the words it has seen remembered, per thread.
//!
//! The Snowball stemmer was about a tenth of a lexical ingest's CPU, all of it on tantivy's
//! indexing threads, and most words of a corpus come back again and again. [`RememberingStemmer`]
//! gives every token the stem tantivy's `Stemmer::new(Language::English)` gives it (the same
//! `frostem` algorithm, so an index written before it has the same terms), looked up in a
//! per-thread memory of words seen before and computed only for new ones. A property test
//! compares the two analyzers token for token.

use std::cell::RefCell;

use rustc_hash::FxHashMap;
use tantivy::tokenizer::{Token, TokenFilter, TokenStream, Tokenizer};

/// Longest word whose stem is remembered; longer ones are stemmed every time.
const MAX_REMEMBERED_BYTES: usize = 32;
/// Words remembered per thread before the memory is cleared and starts again (a few MiB).
const REMEMBERED_WORDS: usize = 1 << 16;

/// The English stems of one thread's words.
struct StemMemory {
    stemmer: frostem::Stemmer,
    stems: FxHashMap<Box<str>, Box<str>>,
}

impl StemMemory {
    fn new() -> Self {
        Self {
            stemmer: frostem::Stemmer::new(frostem::Algorithm::English),
            stems: FxHashMap::default(),
        }
    }

    /// Replaces `word` by its stem.
    fn stem_in_place(&mut self, word: &mut String) {
        if word.len() > MAX_REMEMBERED_BYTES {
            let stem = self.stemmer.stem(word).into_owned();
            *word = stem;
            return;
        }
        if let Some(stem) = self.stems.get(word.as_str()) {
            word.clear();
            word.push_str(stem);
            return;
        }
        let stem: Box<str> = self.stemmer.stem(word).into();
        if self.stems.len() >= REMEMBERED_WORDS {
            self.stems.clear();
        }
        self.stems.insert(word.as_str().into(), stem.clone());
        word.clear();
        word.push_str(&stem);
    }
}

thread_local! {
    static STEMS: RefCell<StemMemory> = RefCell::new(StemMemory::new());
}

/// A token filter that stems English words as tantivy's `Stemmer::new(Language::English)` does.
#[derive(Clone, Copy, Debug, Default)]
pub struct RememberingStemmer;

impl TokenFilter for RememberingStemmer {
    type Tokenizer<T: Tokenizer> = RememberingStemmerFilter<T>;

    fn transform<T: Tokenizer>(self, tokenizer: T) -> RememberingStemmerFilter<T> {
        RememberingStemmerFilter { inner: tokenizer }
    }
}

#[derive(Clone)]
pub struct RememberingStemmerFilter<T> {
    inner: T,
}

impl<T: Tokenizer> Tokenizer for RememberingStemmerFilter<T> {
    type TokenStream<'a> = RememberingStemmerStream<T::TokenStream<'a>>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> Self::TokenStream<'a> {
        RememberingStemmerStream {
            tail: self.inner.token_stream(text),
        }
    }
}

pub struct RememberingStemmerStream<T> {
    tail: T,
}

impl<T: TokenStream> TokenStream for RememberingStemmerStream<T> {
    fn advance(&mut self) -> bool {
        if !self.tail.advance() {
            return false;
        }
        let token = self.tail.token_mut();
        STEMS.with(|memory| memory.borrow_mut().stem_in_place(&mut token.text));
        true
    }

    fn token(&self) -> &Token {
        self.tail.token()
    }

    fn token_mut(&mut self) -> &mut Token {
        self.tail.token_mut()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tantivy::tokenizer::{
        AsciiFoldingFilter, Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer,
        TextAnalyzer,
    };

    use super::*;

    /// The index's analyzer as it was, with tantivy's own stemmer.
    fn with_tantivy_stemmer() -> TextAnalyzer {
        TextAnalyzer::builder(SimpleTokenizer::default())
            .filter(RemoveLongFilter::limit(40))
            .filter(LowerCaser)
            .filter(AsciiFoldingFilter)
            .filter(Stemmer::new(Language::English))
            .build()
    }

    fn tokens(analyzer: &mut TextAnalyzer, text: &str) -> Vec<Token> {
        let mut stream = analyzer.token_stream(text);
        let mut tokens = Vec::new();
        stream.process(&mut |token| tokens.push(token.clone()));
        tokens
    }

    fn check(text: &str) {
        let expected = tokens(&mut with_tantivy_stemmer(), text);
        // Twice: the second pass takes every stem from the memory.
        let mut remembering = super::super::schema::analyzer();
        assert_eq!(tokens(&mut remembering, text), expected, "{text:?}");
        assert_eq!(tokens(&mut remembering, text), expected, "{text:?}");
    }

    #[test]
    fn stems_are_those_of_tantivys_stemmer() {
        check("Running runners ran; the generously generalized generalizations were running.");
        check(
            "Caresses ponies ties caress cats feed agreed plastered bled motoring sing conflated",
        );
        check("Ünïcödé naïve café résumé ÉCOLES straße");
        check(&"internationalizations".repeat(3));
        check("");
    }

    #[test]
    fn a_full_memory_starts_again_and_stems_the_same() {
        let mut memory = StemMemory::new();
        for i in 0..REMEMBERED_WORDS + 10 {
            let mut word = format!("walking{i}");
            memory.stem_in_place(&mut word);
        }
        assert!(memory.stems.len() <= REMEMBERED_WORDS);
        let mut word = String::from("connections");
        memory.stem_in_place(&mut word);
        assert_eq!(word, "connect");
    }

    proptest! {
        #[test]
        fn any_text_gets_tantivys_stems(text in "(\\PC{0,12}[ .,]{1,2}){0,30}") {
            check(&text);
        }

        #[test]
        fn english_words_get_tantivys_stems(
            words in proptest::collection::vec("[a-zA-Z]{1,14}(ing|ed|ies|ness|ational|ly|s)?", 0..40)
        ) {
            check(&words.join(" "));
        }
    }
}
