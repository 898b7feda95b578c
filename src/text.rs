//! Free text from elsewhere (Kairon's status messages, which cloud-init errors can fill with
//! quotes of the user-data) made fit for where we write it: conditions, events, logs.

/// `text` with control characters (newlines, terminal escapes) turned into spaces and at most
/// `max` bytes kept, cut at a character boundary and marked with `…` when cut.
pub(crate) fn bounded(text: &str, max: usize) -> String {
    const MARK: &str = "…";
    let clean: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if clean.len() <= max {
        return clean;
    }
    let mut end = max.saturating_sub(MARK.len());
    while end > 0 && !clean.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &clean[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_go_and_length_is_bounded_at_a_character_boundary() {
        assert_eq!(bounded("plain", 10), "plain");
        assert_eq!(bounded("a\nb\u{1b}[31mc\td", 64), "a b [31mc d");
        let cut = bounded(&"x".repeat(5000), 1024);
        assert_eq!(cut.len(), 1024);
        assert!(cut.ends_with('…'));
        // Multi-byte characters are never split.
        let cut = bounded(&"é".repeat(600), 101);
        assert!(cut.len() <= 101, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }
}
