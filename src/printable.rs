//! Text that came from a model or a file, made safe to print: a node named with ESC, BEL,
//! a carriage return or a newline must not clear the screen, ring, overwrite a line or
//! forge an `error:` line of its own.

use std::borrow::Cow;

/// `text` with every control character written as a Rust escape (`\u{1b}`, `\n`).
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// A message for the terminal: control characters escaped except its own line breaks,
/// every line after the first indented by `indent`, so that nothing in it can pass for a
/// line of ralpc's own.
pub fn message(text: &str, indent: &str) -> String {
    let mut out = String::new();
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
            out.push_str(indent);
        }
        out.push_str(&printable(line));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("conv1"), "conv1");
        assert_eq!(printable("a\u{1b}[2Jb\u{7}c\rd"), "a\\u{1b}[2Jb\\u{7}c\\rd");
        assert_eq!(
            message("bad 'x\nerror: forged'", "  "),
            "bad 'x\n  error: forged'"
        );
    }
}
