//! The one 64-bit content hash: the first 8 bytes (little endian) of the blake3 hash of the
//! parts, fed in order. Its values are stored (dense-index section keys, document versions), so
//! the byte stream for a given input must never change.

/// blake3 of `parts` concatenated, cut to a u64.
pub fn content_hash<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut hasher = blake3::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_hash_as_their_concatenation_and_match_blake3() {
        let whole = blake3::hash(b"section one");
        let expected = u64::from_le_bytes(whole.as_bytes()[..8].try_into().unwrap());
        assert_eq!(content_hash([b"section one".as_slice()]), expected);
        assert_eq!(
            content_hash([b"section".as_slice(), b" one".as_slice()]),
            expected
        );
        assert_ne!(content_hash([b"section two".as_slice()]), expected);
    }
}
