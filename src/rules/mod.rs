//! Pure decisions: functions from a request and the state they need to a verdict or a patch.
//! No I/O, no clocks, no caches; the edge (`crate::webhook`) gathers what they read.

pub mod identity;
pub mod lease_hold;
pub mod move_window;
pub mod rollout;
pub mod selector;
pub mod sync_finalizer;

/// Messages quote annotation values, names and usernames, which may hold control characters
/// (annotation values are free text). kubectl prints a denial on one line: escape them.
pub(crate) fn one_line(message: String) -> String {
    if !needs_one_line_escape(&message) {
        return message;
    }
    let mut out = String::with_capacity(message.len() + 8);
    write_one_line(&mut out, &message).expect("writing to a String cannot fail");
    out
}

/// `s` escaped as [`one_line`] escapes it, borrowed when there is nothing to escape (nearly
/// always): the decision log passes every request-supplied value through it.
pub(crate) fn one_line_str(s: &str) -> std::borrow::Cow<'_, str> {
    if !needs_one_line_escape(s) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    write_one_line(&mut out, s).expect("writing to a String cannot fail");
    std::borrow::Cow::Owned(out)
}

/// Whether `s` holds a character `write_one_line` escapes. C0 controls and DEL are single
/// bytes; C1 controls start with 0xC2, U+2028 and U+2029 with 0xE2. Most text has none, and
/// this scan is what every denial and every log value pays.
pub(crate) fn needs_one_line_escape(s: &str) -> bool {
    any_byte(s, |b| b < 0x20 || b == 0x7f || b == 0xc2 || b == 0xe2)
}

/// `s` with control characters and the Unicode line and paragraph separators (which some
/// tools split lines on) escaped as `{:?}` writes them (`\n`, `\u{85}`): one line, whatever
/// the input. Shared by denial messages and the decision log.
pub(crate) fn write_one_line(out: &mut impl std::fmt::Write, s: &str) -> std::fmt::Result {
    if !needs_one_line_escape(s) {
        return out.write_str(s);
    }
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
            out.write_str(&s[start..i])?;
            write!(out, "{}", c.escape_debug())?;
            start = i + c.len_utf8();
        }
    }
    out.write_str(&s[start..])
}

/// Whether any byte of `s` matches, 16 bytes at a time without an early exit inside a chunk,
/// which the compiler turns into vector compares.
pub(crate) fn any_byte(s: &str, hit: impl Fn(u8) -> bool) -> bool {
    s.as_bytes()
        .chunks(16)
        .any(|c| c.iter().fold(false, |acc, &b| acc | hit(b)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_line_escapes_control_characters_only() {
        assert_eq!(super::one_line("a \"b\" é".into()), "a \"b\" é");
        assert_eq!(super::one_line("x\ny\r\tz".into()), "x\\ny\\r\\tz");
        assert_eq!(
            super::one_line("a\u{7f}b\u{85}c ¢".into()),
            "a\\u{7f}b\\u{85}c ¢"
        );
        assert_eq!(
            super::one_line("p\u{2028}q\u{2029}r ✓".into()),
            "p\\u{2028}q\\u{2029}r ✓"
        );
    }
}
