//! Durations as Go writes them (`10s`, `1m0s`, `500ms`): what the API server sends in
//! `?timeout=`, what every duration flag takes, and the defaults, each written once as the
//! text the command line shows and read by the library as a `Duration`.

use std::time::Duration;

/// The subset of Go's duration syntax the API server writes: `10s`, `1m0s`, `500ms`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total = total.checked_add(Duration::try_from_secs_f64(value * unit).ok()?)?;
    }
    Some(total)
}

/// A default duration, written once as its flag shows it; `get` reads it at compile time, so
/// the command line (`default_value = X.0`) and the library (`X.get()`) cannot disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub &'static str);

impl GoDuration {
    /// One whole number and a unit (`h`, `m`, `s`, `ms`); anything else fails the build.
    pub const fn get(self) -> Duration {
        let b = self.0.as_bytes();
        let mut i = 0;
        let mut n: u64 = 0;
        while i < b.len() && b[i].is_ascii_digit() {
            n = n * 10 + (b[i] - b'0') as u64;
            i += 1;
        }
        assert!(i > 0, "a default duration starts with a number");
        match b.len() - i {
            1 if b[i] == b'h' => Duration::from_secs(n * 3600),
            1 if b[i] == b'm' => Duration::from_secs(n * 60),
            1 if b[i] == b's' => Duration::from_secs(n),
            2 if b[i] == b'm' && b[i + 1] == b's' => Duration::from_millis(n),
            _ => panic!("a default duration ends with h, m, s or ms"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_reads_as_its_flag_parses_it() {
        for text in ["0s", "3s", "10s", "30s", "500ms", "1m", "5m", "2h"] {
            assert_eq!(
                Some(GoDuration(text).get()),
                parse_go_duration(text),
                "{text}"
            );
        }
    }
}
