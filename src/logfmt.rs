//! The log line formats of `handoff` (`--log-format text|json`).
//!
//! Every admission decision is one event, so formatting it is paid on every request: with
//! tracing-subscriber's own formatters it was the largest cost of the handler after decoding
//! (BENCHMARKS.md). These write the same lines, with the same fields and escaping guarantees,
//! without the generic machinery: no ANSI styling, a hand-rolled timestamp, and strings that
//! need no escaping (nearly all of them) copied in one piece.
//!
//! Text: `2026-11-30T04:27:38.205180Z  INFO handoff::decision: decision webhook="sync-finalizer" …`,
//! strings quoted and escaped as Rust's `Debug` does, `%`-fields as their `Display` with control
//! characters and Unicode line separators escaped; spans (kube's client opens some at debug level)
//! before the target as `name{fields}:`.
//! JSON: one object a line, `timestamp`, `level`, `target`, then every field at the top level.

use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::policy::{any_byte, write_one_line};

/// The event formatter for `tracing_subscriber::fmt().event_format(...)`.
#[derive(Debug, Clone, Copy)]
pub struct LogLine {
    json: bool,
}

impl LogLine {
    pub fn text() -> Self {
        LogLine { json: false }
    }
    pub fn json() -> Self {
        LogLine { json: true }
    }
}

impl<S, N> FormatEvent<S, N> for LogLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut ts = [0u8; 27];
        let ts = timestamp(SystemTime::now(), &mut ts);
        if self.json {
            w.write_str("{\"timestamp\":\"")?;
            w.write_str(ts)?;
            w.write_str("\",\"level\":\"")?;
            w.write_str(meta.level().as_str())?;
            w.write_str("\",\"target\":")?;
            json_str(&mut w, meta.target())?;
            if ctx.event_scope().is_some() {
                let mut spans = String::new();
                write_spans(ctx, &mut spans)?;
                w.write_str(",\"spans\":")?;
                json_str(&mut w, spans.trim_end())?;
            }
            let mut v = JsonFields {
                w: &mut w,
                res: Ok(()),
            };
            event.record(&mut v);
            v.res?;
            w.write_str("}\n")
        } else {
            w.write_str(ts)?;
            w.write_str(match *meta.level() {
                Level::ERROR => " ERROR ",
                Level::WARN => "  WARN ",
                Level::INFO => "  INFO ",
                Level::DEBUG => " DEBUG ",
                Level::TRACE => " TRACE ",
            })?;
            write_spans(ctx, &mut w)?;
            w.write_str(meta.target())?;
            w.write_char(':')?;
            let mut v = TextFields {
                w: &mut w,
                res: Ok(()),
            };
            event.record(&mut v);
            v.res?;
            w.write_char('\n')
        }
    }
}

/// The spans an event happened in, root first, as tracing-subscriber's Full format writes them:
/// `name{fields}:` each, then a space. Nothing when there are none (handoff opens none; kube's
/// client does at debug level, with the request's method and URL).
fn write_spans<S, N>(ctx: &FmtContext<'_, S, N>, w: &mut impl fmt::Write) -> fmt::Result
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let Some(scope) = ctx.event_scope() else {
        return Ok(());
    };
    for span in scope.from_root() {
        w.write_str(span.name())?;
        let ext = span.extensions();
        if let Some(fields) = ext.get::<FormattedFields<N>>()
            && !fields.is_empty()
        {
            write!(TextEscape(w), "{{{fields}}}")?;
        }
        w.write_char(':')?;
    }
    w.write_char(' ')
}

struct TextFields<'a, 'w> {
    w: &'a mut Writer<'w>,
    res: fmt::Result,
}

impl TextFields<'_, '_> {
    fn key(&mut self, field: &Field) -> fmt::Result {
        self.w.write_char(' ')?;
        if field.name() != "message" {
            self.w.write_str(field.name())?;
            self.w.write_char('=')?;
        }
        Ok(())
    }
}

impl Visit for TextFields<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.res.is_err() {
            return;
        }
        self.res = self.key(field).and_then(|()| {
            // What `{:?}` would write, without its per-character escape checks when none
            // is needed: printable ASCII other than `"` and `\`.
            if value
                .bytes()
                .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
            {
                self.w.write_char('"')?;
                self.w.write_str(value)?;
                self.w.write_char('"')
            } else {
                write!(self.w, "{value:?}")
            }
        });
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.res.is_err() {
            return;
        }
        // `%`-fields (usernames, messages) are written as their `Display`, unquoted; control
        // characters in them are escaped so that no value can start a forged log line.
        self.res = self
            .key(field)
            .and_then(|()| write!(TextEscape(self.w), "{value:?}"));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.record_debug(field, &format_args!("{value}"));
        if self.res.is_ok()
            && let Some(chain) = sources(value)
        {
            self.res = write!(self.w, " {}.sources=", field.name())
                .and_then(|()| TextEscape(self.w).write_str(&chain));
        }
    }
}

/// An error's causes, `[a, b]`, as tracing-subscriber writes them under `<field>.sources`.
fn sources(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = e.source()?;
    let mut out = String::from("[");
    loop {
        let _ = write!(out, "{next}");
        match next.source() {
            Some(s) => {
                out.push_str(", ");
                next = s;
            }
            None => break,
        }
    }
    out.push(']');
    Some(out)
}

/// Writes what is written through it on one line (`policy::write_one_line`).
struct TextEscape<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for TextEscape<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_one_line(self.0, s)
    }
}

struct JsonFields<'a, 'w> {
    w: &'a mut Writer<'w>,
    res: fmt::Result,
}

impl JsonFields<'_, '_> {
    /// `,"key":` then the value, unless an earlier write failed.
    fn put(&mut self, key: &str, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.res.is_ok() {
            self.res = self
                .w
                .write_char(',')
                .and_then(|()| json_str(self.w, key))
                .and_then(|()| self.w.write_char(':'))
                .and_then(|()| value(self.w));
        }
    }
}

impl Visit for JsonFields<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field.name(), |w| json_str(w, value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field.name(), |w| {
            w.write_str(if value { "true" } else { "false" })
        });
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field.name(), |w| write!(w, "{value}"));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field.name(), |w| write!(w, "{value}"));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.put(field.name(), |w| write!(w, "{value}"));
        } else {
            // JSON has no NaN or infinity: those go as strings.
            self.record_debug(field, &value);
        }
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.record_debug(field, &format_args!("{value}"));
        if let Some(chain) = sources(value) {
            self.put(&format!("{}.sources", field.name()), |w| {
                json_str(w, &chain)
            });
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%`-fields arrive here wrapped so that `{:?}` writes their `Display`; the text is
        // escaped on its way through.
        self.put(field.name(), |w| {
            w.write_char('"')?;
            write!(JsonEscape(w), "{value:?}")?;
            w.write_char('"')
        });
    }
}

/// A JSON string literal: `"`, `\` and control characters escaped, the rest copied in runs.
fn json_str(w: &mut impl fmt::Write, s: &str) -> fmt::Result {
    w.write_char('"')?;
    JsonEscape(w).write_str(s)?;
    w.write_char('"')
}

/// Escapes what is written through it as the inside of a JSON string.
struct JsonEscape<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for JsonEscape<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if !any_byte(s, |b| b < 0x20 || b == 0x7f || b == b'"' || b == b'\\') {
            return self.0.write_str(s);
        }
        let bytes = s.as_bytes();
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let esc: &str = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..=0x1f | 0x7f => "",
                _ => continue,
            };
            // Splitting before an ASCII byte always lands on a char boundary.
            self.0.write_str(&s[start..i])?;
            if esc.is_empty() {
                write!(self.0, "\\u{:04x}", b)?;
            } else {
                self.0.write_str(esc)?;
            }
            start = i + 1;
        }
        self.0.write_str(&s[start..])
    }
}

/// RFC 3339 in UTC with microseconds, `2026-11-30T04:27:38.205180Z`, as tracing-subscriber
/// writes it. Times before 1970 (a broken clock) print as the epoch.
pub fn timestamp(t: SystemTime, buf: &mut [u8; 27]) -> &str {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let sod = secs % 86_400;
    let fields: [(usize, u64, usize); 7] = [
        (0, y.clamp(0, 9999) as u64, 4),
        (5, m as u64, 2),
        (8, day as u64, 2),
        (11, sod / 3600, 2),
        (14, sod / 60 % 60, 2),
        (17, sod % 60, 2),
        (20, d.subsec_micros() as u64, 6),
    ];
    *buf = *b"0000-00-00T00:00:00.000000Z";
    for (at, mut v, width) in fields {
        for i in (at..at + width).rev() {
            buf[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    }
    std::str::from_utf8(buf).expect("ASCII digits and separators")
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc_micros() {
        let at = |secs: u64, micros: u32| {
            let mut buf = [0u8; 27];
            timestamp(UNIX_EPOCH + Duration::new(secs, micros * 1000), &mut buf).to_string()
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(at(951_955_199, 999_999), "2000-03-01T23:59:59.999999Z");
        assert_eq!(at(1_796_012_858, 205_180), "2026-11-30T04:27:38.205180Z");
        assert_eq!(at(4_107_542_399, 0), "2100-02-28T23:59:59.000000Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z");
        let mut buf = [0u8; 27];
        assert_eq!(
            timestamp(UNIX_EPOCH - Duration::from_secs(5), &mut buf),
            "1970-01-01T00:00:00.000000Z"
        );
        // Every day of four centuries against a day-by-day walk of the calendar.
        let (mut y, mut m, mut d) = (1970i64, 1u32, 1u32);
        for days in 0..146_097i64 {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let len = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            d += 1;
            if d > len[m as usize - 1] {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture(format: LogLine, emit: impl FnOnce()) -> String {
        let buf = Buf::default();
        let out = buf.clone();
        let sub = tracing_subscriber::fmt()
            .event_format(format)
            .with_writer(move || buf.clone())
            .finish();
        tracing::subscriber::with_default(sub, emit);
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    fn decision() {
        tracing::info!(
            target: "handoff::decision",
            webhook = "sync-finalizer",
            user = %"system:serviceaccount:kcp-syncer-x:kcp-syncer-x",
            namespace = "kcp-a",
            name = "we\"ird\nname",
            dry_run = false,
            detail = %"namespace \"kcp-a\" carries a hold \\ é",
            latency_us = 42u64,
            delta = -3i64,
            "decision"
        );
    }

    #[test]
    fn text_lines_read_as_before() {
        let line = capture(LogLine::text(), decision);
        let (ts, rest) = line.split_at(27);
        assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{line}");
        assert_eq!(
            rest,
            "  INFO handoff::decision: decision webhook=\"sync-finalizer\" \
             user=system:serviceaccount:kcp-syncer-x:kcp-syncer-x namespace=\"kcp-a\" \
             name=\"we\\\"ird\\nname\" dry_run=false \
             detail=namespace \"kcp-a\" carries a hold \\ é latency_us=42 delta=-3\n"
        );
        assert_eq!(line.lines().count(), 1, "a field cannot break the line");
        let forged = capture(
            LogLine::text(),
            || tracing::info!(user = %"alice\n2026-11-30T00:00:00.000000Z  INFO x\u{7f}", "decision"),
        );
        assert_eq!(forged.lines().count(), 1, "{forged}");
        assert!(
            forged.ends_with(" decision user=alice\\n2026-11-30T00:00:00.000000Z  INFO x\\u{7f}\n"),
            "{forged}"
        );
        let warn = capture(LogLine::text(), || tracing::warn!(code = 400u64, "bad"));
        assert!(
            warn.ends_with("  WARN handoff::logfmt::tests: bad code=400\n"),
            "{warn}"
        );
    }

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("list failed")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn in_span_with_error() {
        let span = tracing::info_span!("HTTP", method = "GET", url = "/api/v1/namespaces");
        let _g = span.enter();
        let e = Outer(std::io::Error::other("connection reset"));
        tracing::warn!(
            error = &e as &dyn std::error::Error,
            ratio = 0.5f64,
            "watch failed"
        );
    }

    #[test]
    fn spans_and_error_causes_are_kept() {
        let text = capture(LogLine::text(), in_span_with_error);
        assert!(
            text.ends_with(
                "  WARN HTTP{method=\"GET\" url=\"/api/v1/namespaces\"}: handoff::logfmt::tests: \
                 watch failed error=list failed error.sources=[connection reset] ratio=0.5\n"
            ),
            "{text}"
        );
        let json = capture(LogLine::json(), in_span_with_error);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            v["spans"],
            "HTTP{method=\"GET\" url=\"/api/v1/namespaces\"}:"
        );
        assert_eq!(v["error"], "list failed");
        assert_eq!(v["error.sources"], "[connection reset]");
        assert_eq!(v["ratio"], 0.5);
        let nan = capture(LogLine::json(), || tracing::info!(x = f64::NAN, "n"));
        let v: serde_json::Value = serde_json::from_str(&nan).unwrap();
        assert_eq!(v["x"], "NaN");
        // No span, no `spans` key and no stray space.
        assert!(capture(LogLine::text(), decision).contains("  INFO handoff::decision: decision "));
    }

    #[test]
    fn unicode_line_breaks_and_c1_controls_are_escaped_in_text() {
        let line = capture(
            LogLine::text(),
            || tracing::warn!(error = %"unknown variant `DELETE\u{85}x\u{2028}y\u{2029}z\u{9b}`, é ✓", "bad"),
        );
        assert!(
            line.ends_with(
                " bad error=unknown variant `DELETE\\u{85}x\\u{2028}y\\u{2029}z\\u{9b}`, é ✓\n"
            ),
            "{line}"
        );
    }

    #[test]
    fn json_lines_parse_with_every_field() {
        let line = capture(LogLine::json(), decision);
        assert_eq!(line.lines().count(), 1, "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "handoff::decision");
        assert_eq!(v["message"], "decision");
        assert_eq!(v["webhook"], "sync-finalizer");
        assert_eq!(v["namespace"], "kcp-a");
        assert_eq!(v["name"], "we\"ird\nname");
        assert_eq!(v["dry_run"], false);
        assert_eq!(v["detail"], "namespace \"kcp-a\" carries a hold \\ é");
        assert_eq!(v["latency_us"], 42);
        assert_eq!(v["delta"], -3);
        assert_eq!(v["timestamp"].as_str().unwrap().len(), 27);
        let ctl = capture(
            LogLine::json(),
            || tracing::error!(error = %"a\u{1}b\u{7f}\t", "x"),
        );
        let v: serde_json::Value = serde_json::from_str(&ctl).unwrap();
        assert_eq!(v["error"], "a\u{1}b\u{7f}\t");
        assert!(ctl.contains(r"a\u0001b\u007f\t"), "{ctl}");
    }
}
