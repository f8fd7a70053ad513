//! Pure decisions: functions from a request and the state they need to a verdict or a patch.
//! No I/O, no clocks, no caches; the edge (`crate::webhook`) gathers what they read.

pub mod identity;
pub mod move_window;
pub mod selector;
pub mod sync_finalizer;

/// Messages quote annotation values, names and usernames, which may hold control characters
/// (annotation values are free text). kubectl prints a denial on one line: escape them.
pub(crate) fn one_line(message: String) -> String {
    if !message.chars().any(char::is_control) {
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
    }
}
