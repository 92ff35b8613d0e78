//! Sizes, rates and durations as the client subcommands print them: in the unit that reads well
//! at their size (`512 B`, `12.3 KB/s`, `1.24 MB/s`, `4 min 05 s`), never `0.00 MB/s`. Decimal
//! units (1 KB = 1,000 bytes), as the server's MB/s figures are.

use std::time::Duration;

/// `bytes` in B, KB, MB, GB or TB, with three significant digits (whole bytes below 1 KB).
pub fn bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = "B";
    for next in UNITS {
        if value < 999.5 {
            break;
        }
        value /= 1000.0;
        unit = next;
    }
    format!("{} {unit}", three_digits(value))
}

/// `bytes` per `elapsed` as `12.3 KB/s` (`0 B/s` when no time has passed).
pub fn rate(bytes: u64, elapsed: Duration) -> String {
    let seconds = elapsed.as_secs_f64();
    if seconds <= 0.0 {
        return "0 B/s".to_string();
    }
    per_second(bytes as f64 / seconds)
}

/// A rate of `bytes_per_second` as `12.3 KB/s`.
pub fn per_second(bytes_per_second: f64) -> String {
    let whole = if bytes_per_second.is_finite() && bytes_per_second > 0.0 {
        bytes_per_second.round() as u64
    } else {
        0
    };
    format!("{}/s", bytes(whole))
}

/// A count per second (`9.6`, `120`, `0.04`): as many decimals as make it readable.
pub fn count_rate(count: u64, elapsed: Duration) -> String {
    let seconds = elapsed.as_secs_f64();
    if seconds <= 0.0 {
        return "0".to_string();
    }
    let rate = count as f64 / seconds;
    if rate >= 100.0 {
        format!("{rate:.0}")
    } else if rate >= 1.0 {
        format!("{rate:.1}")
    } else {
        format!("{rate:.2}")
    }
}

/// `0.52 s`, `12.3 s`, `4 min 05 s`, `1 h 02 min`.
pub fn duration(elapsed: Duration) -> String {
    let seconds = elapsed.as_secs_f64();
    if seconds < 10.0 {
        return format!("{seconds:.2} s");
    }
    if seconds < 60.0 {
        return format!("{seconds:.1} s");
    }
    let whole = seconds.round() as u64;
    if whole < 3600 {
        format!("{} min {:02} s", whole / 60, whole % 60)
    } else {
        format!("{} h {:02} min", whole / 3600, whole % 3600 / 60)
    }
}

/// `value` (below 1000) with three significant digits: `1.24`, `12.3`, `123`.
fn three_digits(value: f64) -> String {
    if value < 9.995 {
        format!("{value:.2}")
    } else if value < 99.95 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_the_unit_that_fits() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1000), "1.00 KB");
        assert_eq!(bytes(12_345), "12.3 KB");
        assert_eq!(bytes(999_499), "999 KB");
        assert_eq!(bytes(999_500), "1.00 MB");
        assert_eq!(bytes(1_240_000), "1.24 MB");
        assert_eq!(bytes(268_000_000), "268 MB");
        assert_eq!(bytes(2_100_000_000), "2.10 GB");
    }

    #[test]
    fn rates_are_never_a_row_of_zeros() {
        let second = Duration::from_secs(1);
        assert_eq!(rate(40, second), "40 B/s");
        assert_eq!(rate(12_300, second), "12.3 KB/s");
        assert_eq!(rate(2_400_000, Duration::from_secs(2)), "1.20 MB/s");
        assert_eq!(rate(5, Duration::ZERO), "0 B/s");
        assert_eq!(per_second(f64::NAN), "0 B/s");
        assert_eq!(count_rate(5, Duration::from_millis(520)), "9.6");
        assert_eq!(count_rate(1, Duration::from_secs(50)), "0.02");
        assert_eq!(count_rate(5000, Duration::from_secs(2)), "2500");
    }

    #[test]
    fn durations_read_in_seconds_minutes_or_hours() {
        assert_eq!(duration(Duration::from_millis(520)), "0.52 s");
        assert_eq!(duration(Duration::from_millis(12_340)), "12.3 s");
        assert_eq!(duration(Duration::from_secs(245)), "4 min 05 s");
        assert_eq!(duration(Duration::from_secs(3720)), "1 h 02 min");
    }
}
