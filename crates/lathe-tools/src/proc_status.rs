//! What Linux's `/proc` tells about a process: its resident memory and the CPU time it has used,
//! as the benchmark programs sample the servers they start (or themselves).

use anyhow::Context;

/// Resident memory of a process, in MiB (from /proc/<pid>/status).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Resident {
    /// VmRSS.
    pub total: f64,
    /// RssAnon: heaps, stacks, anonymous maps.
    pub anon: f64,
    /// RssFile: pages of mapped files (index files, the binary, libraries).
    pub file: f64,
}

/// Resident memory of process `pid` (this one when `None`).
pub fn resident(pid: Option<u32>) -> anyhow::Result<Resident> {
    let path = pid.map_or("/proc/self/status".to_string(), |pid| {
        format!("/proc/{pid}/status")
    });
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_resident(&status).with_context(|| format!("no VmRSS, RssAnon or RssFile in {path}"))
}

/// CPU seconds (user + system) `pid` has used so far.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let ticks = parse_cpu_ticks(&stat).with_context(|| format!("no utime/stime in {path}"))?;
    Ok(ticks as f64 / ticks_per_second)
}

/// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line; the command name (field 2) may
/// hold spaces, so fields are counted after its closing parenthesis.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

fn parse_resident(status: &str) -> Option<Resident> {
    let mib = |field: &str| -> Option<f64> {
        let line = status.lines().find(|line| line.starts_with(field))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    };
    Some(Resident {
        total: mib("VmRSS:")?,
        anon: mib("RssAnon:")?,
        file: mib("RssFile:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_and_cpu_ticks_parse() {
        let status = "Name:\tlathe\nVmPeak:\t  900 kB\nVmRSS:\t  204800 kB\nRssAnon:\t  153600 kB\nRssFile:\t   51200 kB\nRssShmem:\t       0 kB\n";
        assert_eq!(
            parse_resident(status),
            Some(Resident {
                total: 200.0,
                anon: 150.0,
                file: 50.0
            })
        );
        assert_eq!(parse_resident("Name:\tlathe\nVmRSS:\t  204800 kB\n"), None);
        let stat = "4242 (lathe (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 11 0";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
    }
}
