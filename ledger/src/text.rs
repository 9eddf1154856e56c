//! Values wider than their columns are cut, never turned into database errors (CONTRACT §3.3).

/// The first `max` Unicode characters of `s`.
pub fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_string(),
        None => s.to_string(),
    }
}

/// `error_message` / `message`: cut to 2000 characters, an empty string stored as NULL.
pub fn message(s: &str) -> Option<String> {
    if s.is_empty() {
        None
    } else {
        Some(cut(s, 2000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_by_characters_not_bytes() {
        assert_eq!(cut("ééé", 2), "éé");
        assert_eq!(cut("ab", 5), "ab");
        assert_eq!(message(""), None);
        assert_eq!(message(&"x".repeat(2500)).unwrap().len(), 2000);
    }
}
