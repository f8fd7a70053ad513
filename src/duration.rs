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

/// A default duration, written once as its flag shows it (`text`, clap's `default_value`) and
/// read from that text by `new` when the constant is compiled, so the command line and the
/// library (`get`) cannot disagree, and a text `new` cannot read fails the build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration {
    pub text: &'static str,
    value: Duration,
}

impl GoDuration {
    /// One whole number and a unit (`h`, `m`, `s`, `ms`).
    pub const fn new(text: &'static str) -> GoDuration {
        let b = text.as_bytes();
        let mut i = 0;
        let mut n: u64 = 0;
        while i < b.len() && b[i].is_ascii_digit() {
            n = n * 10 + (b[i] - b'0') as u64;
            i += 1;
        }
        assert!(i > 0, "a default duration starts with a number");
        let value = match b.len() - i {
            1 if b[i] == b'h' => Duration::from_secs(n * 3600),
            1 if b[i] == b'm' => Duration::from_secs(n * 60),
            1 if b[i] == b's' => Duration::from_secs(n),
            2 if b[i] == b'm' && b[i + 1] == b's' => Duration::from_millis(n),
            _ => panic!("a default duration ends with h, m, s or ms"),
        };
        GoDuration { text, value }
    }

    pub const fn get(self) -> Duration {
        self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_reads_as_its_flag_parses_it() {
        for text in ["0s", "3s", "10s", "30s", "500ms", "1m", "5m", "2h"] {
            assert_eq!(
                Some(GoDuration::new(text).get()),
                parse_go_duration(text),
                "{text}"
            );
        }
        // The defaults themselves, as the flags parse their text.
        for d in [
            crate::state::STALE_AFTER,
            crate::state::MAX_STALENESS,
            crate::state::API_TIMEOUT,
            crate::server::DEFAULT_TIMEOUT,
            crate::server::QUEUE_TIMEOUT,
        ] {
            assert_eq!(Some(d.get()), parse_go_duration(d.text), "{}", d.text);
        }
    }
}
