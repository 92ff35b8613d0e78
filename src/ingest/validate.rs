//! The validate stage: a batch's own limits, checked before any document is sectioned.

use std::collections::HashSet;

use crate::config::LimitsConfig;
use crate::error::{LatheError, Result};
use crate::sections;
use crate::types::{DocumentFormat, DocumentInput};

/// The batch size, and for each document a unique non-empty id, a text within the size limit and
/// HTML nested no deeper than allowed.
pub fn validate_batch(limits: &LimitsConfig, documents: &[DocumentInput]) -> Result<()> {
    if documents.len() > limits.max_batch_documents {
        return Err(LatheError::invalid(
            "documents",
            format!(
                "holds {} documents; the allowed range is 0..={}",
                documents.len(),
                limits.max_batch_documents
            ),
        ));
    }
    let mut seen = HashSet::with_capacity(documents.len());
    for (i, document) in documents.iter().enumerate() {
        if document.id.is_empty() {
            return Err(LatheError::invalid(
                format!("documents[{i}].id"),
                "must not be empty",
            ));
        }
        if !seen.insert(document.id.as_str()) {
            return Err(LatheError::invalid(
                format!("documents[{i}].id"),
                format!(
                    "`{}` appears more than once in the batch; each id may appear once",
                    document.id
                ),
            ));
        }
        validate_text(limits, i, document)?;
    }
    Ok(())
}

fn validate_text(limits: &LimitsConfig, i: usize, document: &DocumentInput) -> Result<()> {
    if document.text.len() > limits.max_document_bytes {
        return Err(LatheError::TooLarge {
            what: format!("documents[{i}].text"),
            size: document.text.len() as u64,
            limit: limits.max_document_bytes as u64,
        });
    }
    if document.format == DocumentFormat::Html && document.sections.is_none() {
        let depth = sections::html_nesting_depth(&document.text);
        if depth > limits.max_html_depth {
            return Err(LatheError::invalid(
                format!("documents[{i}].text"),
                format!(
                    "HTML nests {depth} elements deep; the allowed range is 0..={}",
                    limits.max_html_depth
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document(id: &str, text: &str) -> DocumentInput {
        DocumentInput {
            id: id.into(),
            title: String::new(),
            text: text.into(),
            format: DocumentFormat::Plain,
            metadata: Default::default(),
            sections: None,
        }
    }

    fn reason(result: Result<()>) -> String {
        match result {
            Err(error) => error.to_string(),
            Ok(()) => panic!("the batch was accepted"),
        }
    }

    #[test]
    fn a_batch_names_the_document_that_breaks_a_limit() {
        let limits = LimitsConfig::default();
        assert!(validate_batch(&limits, &[document("a", "x"), document("b", "y")]).is_ok());
        let repeated = reason(validate_batch(
            &limits,
            &[document("a", "x"), document("a", "y")],
        ));
        assert!(
            repeated.contains("documents[1].id") && repeated.contains("more than once"),
            "{repeated}"
        );
        let empty = reason(validate_batch(&limits, &[document("", "x")]));
        assert!(empty.contains("documents[0].id"), "{empty}");
        let small = LimitsConfig {
            max_document_bytes: 3,
            ..LimitsConfig::default()
        };
        let large = reason(validate_batch(&small, &[document("a", "four")]));
        assert!(large.contains("documents[0].text"), "{large}");
    }
}
