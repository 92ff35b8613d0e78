//! The last word of a process killed by a mapped file. tantivy reads a collection's postings,
//! term dictionaries, fast fields and field norms through memory maps; when one of those files
//! shrinks under the server (a `cp` over a live data dir, a truncating tool, a failing disk), the
//! next read of a page past its new end raises SIGBUS. The bytes are gone and the read cannot be
//! retried or turned into an error (the access is an ordinary load deep inside tantivy), so the
//! process ends, as it would have; what this module adds is the reason. Its SIGBUS handler finds
//! the file the faulting address maps in `/proc/self/maps`, writes one ERROR line (JSON or text,
//! as the server logs) naming the file and its collection, then restores the default action, so
//! that the load faults again and the process dies by SIGBUS (exit status 135 in a shell, a
//! container restart under Kubernetes). The restarted server verifies every index file as it
//! opens it (`index::collection::integrity`): the changed collection is listed DAMAGED naming the
//! file, and every other collection serves (tests/faults_mapped.rs; docs/faults.md row 43).
//!
//! Everything the handler does is async-signal-safe: `open`, `read`, `write`, `close`,
//! `clock_gettime` and `sigaction`, with buffers on the faulting thread's stack (the handler does
//! not run on the small alternate signal stack), no allocation and no lock.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the line is JSON (`log.format = "json"`), else text.
static JSON: AtomicBool = AtomicBool::new(false);

/// Installs the SIGBUS handler, writing its line in `json` or text.
pub fn install(json: bool) -> io::Result<()> {
    JSON.store(json, Ordering::Relaxed);
    // SAFETY: a zeroed `sigaction` is a valid value to fill; the handler is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as Handler as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

extern "C" fn on_sigbus(_signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid `siginfo_t` to an SA_SIGINFO handler.
    let address = unsafe { (*info).si_addr() } as usize;
    let mut path = [0u8; 4096];
    let path_len = mapped_file(address, &mut path).unwrap_or(0);
    let mut line = Line::new();
    write_line(
        &mut line,
        address,
        &path[..path_len],
        JSON.load(Ordering::Relaxed),
    );
    // SAFETY: plain syscalls on a buffer we own; a zeroed `sigaction` with SIG_DFL resets it.
    unsafe {
        libc::write(2, line.bytes.as_ptr().cast(), line.len);
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
        // Pending until the handler returns (SIGBUS is blocked while it runs): a SIGBUS sent
        // with `kill` ends the process as it always did, not only a faulting load, which
        // returning runs again.
        libc::raise(libc::SIGBUS);
    }
}

/// The one line: what happened, the file, its collection, and what the restart does.
fn write_line(line: &mut Line, address: usize, path: &[u8], json: bool) {
    let collection = collection_of(path);
    let message: &[&[u8]] = if path.is_empty() {
        &[b"SIGBUS at an address no file maps: the process ends"]
    } else {
        &[
            b"a memory-mapped file changed under the server (SIGBUS reading it): the process ends; ",
            b"at the restart its collection is verified and listed DAMAGED naming the file, and ",
            b"the other collections serve; restore that collection from a backup or delete it",
        ]
    };
    let mut timestamp = [0u8; 27];
    let timestamp = now_utc(&mut timestamp);
    let fields = [
        (&b"file"[..], Some(path).filter(|path| !path.is_empty())),
        (&b"collection"[..], collection),
    ];
    if json {
        line.push(b"{\"timestamp\":\"");
        line.push(timestamp);
        line.push(b"\",\"level\":\"ERROR\",\"fields\":{\"message\":\"");
        message.iter().for_each(|part| line.push_escaped(part));
        for (name, value) in fields.iter().filter_map(|(n, v)| Some((n, (*v)?))) {
            line.push(b"\",\"");
            line.push(name);
            line.push(b"\":\"");
            line.push_escaped(value);
        }
        line.push(b"\",\"address\":\"");
        line.push_hex(address);
        line.push(b"\"},\"target\":\"lathe::mapped_fault\"}\n");
    } else {
        line.push(timestamp);
        line.push(b" ERROR lathe::mapped_fault: ");
        message.iter().for_each(|part| line.push(part));
        for (name, value) in fields.iter().filter_map(|(n, v)| Some((n, (*v)?))) {
            line.push(b" ");
            line.push(name);
            line.push(b"=");
            line.push(value);
        }
        line.push(b" address=");
        line.push_hex(address);
        line.push(b"\n");
    }
}

/// The collection a data-dir path belongs to: the folder after `/collections/`.
fn collection_of(path: &[u8]) -> Option<&[u8]> {
    const MARKER: &[u8] = b"/collections/";
    let at = path.windows(MARKER.len()).position(|w| w == MARKER)?;
    let rest = &path[at + MARKER.len()..];
    let end = rest.iter().position(|&b| b == b'/')?;
    (end > 0).then(|| &rest[..end])
}

/// The path of the file mapped at `address`, copied into `out` (cut to its length), from
/// `/proc/self/maps`; `None` when no file maps it or the table cannot be read.
fn mapped_file(address: usize, out: &mut [u8]) -> Option<usize> {
    // SAFETY: a NUL-terminated path, a buffer we own, and the descriptor closed on every path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut chunk = [0u8; 2048];
    let mut line = [0u8; 4352];
    let mut line_len = 0usize;
    let mut found = None;
    'read: loop {
        let read = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if read <= 0 {
            break;
        }
        for &byte in &chunk[..read as usize] {
            if byte != b'\n' {
                // A line longer than the buffer keeps its start: the range and most of the path.
                if line_len < line.len() {
                    line[line_len] = byte;
                    line_len += 1;
                }
                continue;
            }
            if let Some(path) = path_if_maps(&line[..line_len], address) {
                let len = path.len().min(out.len());
                out[..len].copy_from_slice(&path[..len]);
                found = Some(len);
                break 'read;
            }
            line_len = 0;
        }
    }
    unsafe { libc::close(fd) };
    found
}

/// The path of a `/proc/self/maps` line (`start-end perms offset dev inode path`) whose range
/// holds `address` and which maps a file.
fn path_if_maps(line: &[u8], address: usize) -> Option<&[u8]> {
    let dash = line.iter().position(|&b| b == b'-')?;
    let space = line.iter().position(|&b| b == b' ')?;
    let start = parse_hex(&line[..dash])?;
    let end = parse_hex(line.get(dash + 1..space)?)?;
    if address < start || address >= end {
        return None;
    }
    // Skip five fields, then the padding before the path.
    let mut rest = line;
    for _ in 0..5 {
        let at = rest.iter().position(|&b| b == b' ')?;
        rest = &rest[at + 1..];
    }
    let first = rest.iter().position(|&b| b != b' ')?;
    let path = &rest[first..];
    path.starts_with(b"/").then_some(path)
}

fn parse_hex(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    digits.iter().try_fold(0usize, |value, &digit| {
        let nibble = (digit as char).to_digit(16)?;
        Some(value << 4 | nibble as usize)
    })
}

/// Now as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (the log's own format), written into `out`.
fn now_utc(out: &mut [u8; 27]) -> &[u8] {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) };
    format_utc(now.tv_sec.max(0) as u64, now.tv_nsec.max(0) as u32, out)
}

fn format_utc(seconds: u64, nanos: u32, out: &mut [u8; 27]) -> &[u8] {
    let (days, of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    let fields: [(u64, usize); 7] = [
        (year as u64, 4),
        (month as u64, 2),
        (day as u64, 2),
        (of_day / 3600, 2),
        (of_day / 60 % 60, 2),
        (of_day % 60, 2),
        (u64::from(nanos / 1000), 6),
    ];
    let separators = [b'-', b'-', b'T', b':', b':', b'.', b'Z'];
    let mut at = 0;
    for ((value, width), separator) in fields.into_iter().zip(separators) {
        let mut value = value;
        for i in (0..width).rev() {
            out[at + i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
        at += width;
        out[at] = separator;
        at += 1;
    }
    &out[..at]
}

/// The proleptic Gregorian (year, month, day) of a count of days since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A fixed buffer a line is written into; what does not fit is cut.
struct Line {
    bytes: [u8; 6144],
    len: usize,
}

impl Line {
    fn new() -> Self {
        Self {
            bytes: [0; 6144],
            len: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        // Keep room for the line's end.
        let room = self.bytes.len().saturating_sub(self.len + 1);
        let n = bytes.len().min(room);
        self.bytes[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    /// `bytes` inside a JSON string: quotes, backslashes and control bytes escaped.
    fn push_escaped(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            match byte {
                b'"' => self.push(b"\\\""),
                b'\\' => self.push(b"\\\\"),
                0..=0x1f => {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    self.push(b"\\u00");
                    self.push(&[HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]]);
                }
                _ => self.push(&[byte]),
            }
        }
    }

    fn push_hex(&mut self, value: usize) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0u8; 18];
        digits[..2].copy_from_slice(b"0x");
        for (i, digit) in digits[2..].iter_mut().enumerate() {
            *digit = HEX[(value >> (60 - 4 * i)) & 15];
        }
        self.push(&digits);
    }

    #[cfg(test)]
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_of_a_mapped_address_is_found_in_proc_self_maps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("collections/notes/index/abc.idx");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, vec![7u8; 3 * 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let inside = map.as_ptr() as usize + 5000;
        let mut out = [0u8; 4096];
        let len = mapped_file(inside, &mut out).expect("the map is listed");
        assert_eq!(&out[..len], path.to_str().unwrap().as_bytes());
        assert_eq!(collection_of(&out[..len]), Some(&b"notes"[..]));
        // The heap is not a file.
        let heap = Box::new([0u8; 64]);
        assert_eq!(mapped_file(heap.as_ptr() as usize, &mut out), None);
    }

    #[test]
    fn the_json_line_is_one_json_object_naming_the_file_and_the_collection() {
        let mut line = Line::new();
        let path = b"/data/collections/we\"ird/index/0f.idx";
        write_line(&mut line, 0xdead_beef, path, true);
        let text = line.as_str();
        assert!(
            text.ends_with('\n') && text.matches('\n').count() == 1,
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(json["level"], "ERROR");
        assert_eq!(
            json["fields"]["file"],
            "/data/collections/we\"ird/index/0f.idx"
        );
        assert_eq!(json["fields"]["collection"], "we\"ird");
        assert_eq!(json["fields"]["address"], "0x00000000deadbeef");
        let message = json["fields"]["message"].as_str().unwrap();
        assert!(
            message.contains("SIGBUS") && message.contains("DAMAGED"),
            "{message}"
        );
        let timestamp = json["timestamp"].as_str().unwrap();
        assert!(
            timestamp.starts_with("20") && timestamp.ends_with('Z'),
            "{timestamp}"
        );

        let mut text_line = Line::new();
        write_line(&mut text_line, 16, b"", false);
        let text = text_line.as_str();
        assert!(text.contains(" ERROR lathe::mapped_fault: SIGBUS at an address no file maps"));
        assert!(!text.contains("collection="), "{text}");
    }

    #[test]
    fn timestamps_are_the_calendar_dates_of_their_seconds() {
        let mut out = [0u8; 27];
        assert_eq!(format_utc(0, 0, &mut out), b"1970-01-01T00:00:00.000000Z");
        // 2024-02-29 (a leap day) 13:45:07.123456 UTC.
        assert_eq!(
            format_utc(1_709_214_307, 123_456_789, &mut out),
            b"2024-02-29T13:45:07.123456Z"
        );
        assert_eq!(
            format_utc(4_102_444_799, 999_999_999, &mut out),
            b"2099-12-31T23:59:59.999999Z"
        );
    }

    #[test]
    fn maps_lines_give_their_path_only_inside_their_range() {
        let line = b"7f00a000-7f00c000 r--s 00000000 fd:01 1234                       /d/collections/c/index/x.fast";
        assert_eq!(
            path_if_maps(line, 0x7f00_b000),
            Some(&b"/d/collections/c/index/x.fast"[..])
        );
        assert_eq!(path_if_maps(line, 0x7f00_c000), None);
        assert_eq!(path_if_maps(line, 0x7f00_9fff), None);
        let anonymous = b"7f00a000-7f00c000 rw-p 00000000 00:00 0 ";
        assert_eq!(path_if_maps(anonymous, 0x7f00_b000), None);
        let heap = b"55d0c000-55d2d000 rw-p 00000000 00:00 0                          [heap]";
        assert_eq!(path_if_maps(heap, 0x55d0_c100), None);
        assert_eq!(collection_of(b"/models/minilm/model.onnx"), None);
    }
}
