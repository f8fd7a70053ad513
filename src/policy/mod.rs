//! Pure decisions: functions from a request and the state they need to a verdict or a patch.
//! No I/O, no clocks, no caches; the edge (`crate::webhook`) gathers what they read.

pub mod identity;
pub mod move_window;
pub mod selector;
pub mod sync_finalizer;

/// Messages quote annotation values, names and usernames, which may hold control characters
/// (annotation values are free text). kubectl prints a denial on one line: escape them.
pub(crate) fn one_line(message: String) -> String {
    // C0 controls and DEL are single bytes; C1 controls (U+0080..U+009F) start with 0xC2.
    // Most messages have neither, and this byte scan is what every denial pays.
    // Checked 16 bytes at a time without an early exit inside a chunk, which the compiler
    // turns into vector compares.
    let suspect = message.as_bytes().chunks(16).any(|c| {
        c.iter().fold(false, |hit, &b| {
            hit | (b < 0x20) | (b == 0x7f) | (b == 0xc2)
        })
    });
    if !suspect {
        return message;
    }
    let mut out = String::with_capacity(message.len() + 8);
    for c in message.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
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
    }
}
