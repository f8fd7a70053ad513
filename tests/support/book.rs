//! The book's pages as scripts: the tests that run a page read its ```` ```sh ```` blocks here.
// Shared by every test binary; only those that run a page use it.
#![allow(dead_code)]

/// Every ```` ```sh ```` block of `text` (the page `page`), in order: `(line of the opening
/// fence, body)`.
pub fn sh_blocks(page: &str, text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, bool)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        match &mut open {
            None if t.starts_with("```") => {
                open = Some((i + 1, String::new(), t == "```sh"));
            }
            None => {}
            Some(_) if t == "```" => {
                let (at, body, sh) = open.take().expect("open");
                if sh {
                    blocks.push((at, body));
                }
            }
            Some((_, body, _)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    assert!(open.is_none(), "{page}: a code block is never closed");
    blocks
}
