//! `seg-<id>.flat`: a [`FlatGraph`] as written by a seal or a merge and read at open, so that an
//! open reads each segment's arrays as they are searched instead of rebuilding hnsw_rs's graph
//! (about 3.5 s for 320,000 vectors) and flattening it (another 2.7 s with its drop).
//!
//! Little-endian throughout:
//!
//! ```text
//! magic "LATHEFG1" · dim u32 · slots u32 · upper layers u32 · entry u32 (u32::MAX: none)
//! present: slots × u8 (0 or 1) · codes: slots × dim × i8
//! layer 0: targets n u64 · spans: slots × (start u32, length u32) · targets: n × u32
//! each upper layer, the lowest first: members m u32 · members: m × u32 (ascending)
//!     · spans: m × (u32, u32) · targets n u64 · targets: n × u32
//! ```
//!
//! The file's CRC32 is in the manifest and checked before it is read; the reader still checks
//! every length, slot and span against the header, so a file that lies is an error, never a
//! panic or a walk out of bounds.

use std::io::Write;

use super::flat::{Adjacency, FlatGraph, UpperLayer};
use super::StoredElement;

const MAGIC: &[u8; 8] = b"LATHEFG1";
const NO_ENTRY: u32 = u32::MAX;

/// Writes `graph` to `out` in the format above.
pub fn write(graph: &FlatGraph, out: &mut impl Write) -> std::io::Result<()> {
    let slots = graph.present.len();
    out.write_all(MAGIC)?;
    for value in [
        graph.dim as u32,
        slots as u32,
        graph.upper.len() as u32,
        graph.entry.unwrap_or(NO_ENTRY),
    ] {
        out.write_all(&value.to_le_bytes())?;
    }
    let present: Vec<u8> = graph.present.iter().map(|&p| u8::from(p)).collect();
    out.write_all(&present)?;
    out.write_all(bytemuck::cast_slice::<StoredElement, u8>(&graph.codes))?;
    write_adjacency(&graph.layer0, out)?;
    for layer in &graph.upper {
        out.write_all(&(layer.members.len() as u32).to_le_bytes())?;
        write_u32s(&layer.members, out)?;
        write_adjacency(&layer.adjacency, out)?;
    }
    Ok(())
}

fn write_adjacency(adjacency: &Adjacency, out: &mut impl Write) -> std::io::Result<()> {
    out.write_all(&(adjacency.targets.len() as u64).to_le_bytes())?;
    let spans: Vec<u32> = adjacency
        .spans
        .iter()
        .flat_map(|&(start, length)| [start, length])
        .collect();
    write_u32s(&spans, out)?;
    write_u32s(&adjacency.targets, out)
}

fn write_u32s(values: &[u32], out: &mut impl Write) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(values.len() * 4);
    for value in values {
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    out.write_all(&bytes)
}

/// A reader of the file's bytes that names what is missing.
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, count: usize, what: &str) -> Result<&'a [u8], String> {
        if self.bytes.len() < count {
            return Err(format!("ends inside its {what}"));
        }
        let (taken, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(taken)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let bytes = self.take(4, what)?;
        Ok(u32::from_le_bytes(bytes.try_into().unwrap_or_default()))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let bytes = self.take(8, what)?;
        Ok(u64::from_le_bytes(bytes.try_into().unwrap_or_default()))
    }

    fn u32s(&mut self, count: usize, what: &str) -> Result<Box<[u32]>, String> {
        let bytes = self.take(count.checked_mul(4).ok_or("too long")?, what)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
            .collect())
    }

    /// An adjacency of `members` lists whose targets are slots below `slots`.
    fn adjacency(&mut self, members: usize, slots: usize, what: &str) -> Result<Adjacency, String> {
        let targets_len = usize::try_from(self.u64(what)?).map_err(|_| "too long")?;
        let spans = self.u32s(members.checked_mul(2).ok_or("too long")?, what)?;
        let spans: Box<[(u32, u32)]> = spans.chunks_exact(2).map(|s| (s[0], s[1])).collect();
        let targets = self.u32s(targets_len, what)?;
        for &(start, length) in &spans {
            if start as u64 + length as u64 > targets_len as u64 {
                return Err(format!("a list of its {what} runs past its targets"));
            }
        }
        if targets.iter().any(|&target| target as usize >= slots) {
            return Err(format!("its {what} links to a slot past its {slots}"));
        }
        Ok(Adjacency { spans, targets })
    }
}

/// The graph in `bytes`, every length and link checked, or what is wrong with it.
pub fn read(bytes: &[u8]) -> Result<FlatGraph, String> {
    let mut cursor = Cursor { bytes };
    if cursor.take(MAGIC.len(), "magic")? != MAGIC {
        return Err("is not a flat graph (its magic differs)".into());
    }
    let dim = cursor.u32("header")? as usize;
    let slots = cursor.u32("header")? as usize;
    let layers = cursor.u32("header")? as usize;
    let entry = match cursor.u32("header")? {
        NO_ENTRY => None,
        slot if (slot as usize) < slots => Some(slot),
        slot => return Err(format!("its entry {slot} is past its {slots} slots")),
    };
    let present: Box<[bool]> = cursor
        .take(slots, "presence")?
        .iter()
        .map(|&b| b != 0)
        .collect();
    let codes_len = slots.checked_mul(dim).ok_or("too long")?;
    let codes: Box<[StoredElement]> =
        bytemuck::cast_slice::<u8, StoredElement>(cursor.take(codes_len, "codes")?).into();
    let layer0 = cursor.adjacency(slots, slots, "layer 0")?;
    let mut upper = Vec::with_capacity(layers.min(64));
    for _ in 0..layers {
        let count = cursor.u32("upper layer")? as usize;
        let members = cursor.u32s(count, "upper layer")?;
        if members.windows(2).any(|w| w[0] >= w[1]) || members.iter().any(|&m| m as usize >= slots)
        {
            return Err("an upper layer's members are not ascending slots".into());
        }
        let adjacency = cursor.adjacency(count, slots, "upper layer")?;
        upper.push(UpperLayer { members, adjacency });
    }
    if !cursor.bytes.is_empty() {
        return Err(format!(
            "has {} bytes past its last layer",
            cursor.bytes.len()
        ));
    }
    Ok(FlatGraph {
        dim,
        codes,
        present,
        layer0,
        upper,
        entry,
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{hnsw_graph, random_vectors};
    use super::*;

    fn flat_of(count: usize, dim: usize, seed: u64) -> FlatGraph {
        FlatGraph::from_graph(&hnsw_graph(&random_vectors(count, dim, seed)), count, dim)
    }

    fn bytes_of(graph: &FlatGraph) -> Vec<u8> {
        let mut bytes = Vec::new();
        write(graph, &mut bytes).expect("writes to memory");
        bytes
    }

    #[test]
    fn a_graph_reads_back_as_written_and_walks_the_same() {
        for (count, dim) in [(0, 8), (1, 8), (700, 24)] {
            let graph = flat_of(count, dim, 5);
            let bytes = bytes_of(&graph);
            let read = read(&bytes).expect("reads back");
            assert_eq!(bytes_of(&read), bytes, "{count} vectors");
            assert_eq!((read.slots(), read.entry), (graph.slots(), graph.entry));
            for query in random_vectors(5, dim, 9) {
                assert_eq!(read.search(&query, 20), graph.search(&query, 20));
            }
        }
    }

    #[test]
    fn a_file_that_is_cut_or_lies_is_an_error_naming_what_is_wrong() {
        let bytes = bytes_of(&flat_of(300, 16, 3));
        assert!(read(&bytes[..bytes.len() - 1]).is_err(), "cut");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(read(&longer).unwrap_err().contains("past its last layer"));
        let mut magic = bytes.clone();
        magic[0] = b'X';
        assert!(read(&magic).unwrap_err().contains("magic"));
        // The header's slot count larger than the file: ends inside what follows.
        let mut slots = bytes.clone();
        slots[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read(&slots).is_err());
        // A layer-0 link past the slots: the last four bytes of layer 0 or of the top layer.
        let mut link = bytes.clone();
        let end = link.len();
        link[end - 4..].copy_from_slice(&300u32.to_le_bytes());
        let error = read(&link).unwrap_err();
        assert!(error.contains("links to a slot past"), "{error}");
        // Every truncation fails cleanly, never panics.
        for cut in (0..bytes.len()).step_by(97) {
            assert!(read(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
