//! What never reaches a log (CONTRACT §9.2): tokens, the signing secret and database passwords.
//!
//! Two rules, because the two kinds of secret are known differently:
//! * **Token fields**: claim and publish tokens are chosen by NiFi and travel in request and
//!   response bodies (and in event details). Their values are not known in advance, so every
//!   member whose name ends in `token` (any case: `claimToken`, `publish_token`, `Token`) has its
//!   value replaced by `"***"` wherever a body is logged. The scanner reads JSON text that may be
//!   cut short or malformed (access-log bodies are clipped, refused bodies are logged as sent), and
//!   form-encoded text (`claimToken=…`) the same way.
//! * **Known secrets**: the signing secret(s), database passwords and the raw tokens of `monitor.*`
//!   are in the configuration. Every log line is scrubbed of them as it is written, whatever wrote
//!   it (an error's text, a URL, a third-party crate), in its raw and JSON-escaped forms.
use std::borrow::Cow;
use std::io;
use std::sync::Arc;

/// What a masked value is shown as.
pub const MASK: &str = "***";

/// Secrets shorter than this are not scrubbed from log lines: masking every occurrence of a
/// two-letter password would mangle the log without protecting anything (such a password is
/// guessed faster than it is read).
pub const MIN_SCRUBBED_LEN: usize = 6;

fn is_token_name(name: &str) -> bool {
    // Compared as bytes: the name may end in any character, and slicing a `str` there could split
    // one.
    let name = name.as_bytes();
    name.len() >= 5 && name[name.len() - 5..].eq_ignore_ascii_case(b"token")
}

/// The end (exclusive) of the JSON string starting at `start` (a `"`), and its decoded content;
/// `None` for the end when the text stops inside the string.
fn json_string(bytes: &[u8], start: usize) -> (Option<usize>, String) {
    let mut out = Vec::new();
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return (Some(i + 1), String::from_utf8_lossy(&out).into_owned()),
            b'\\' if i + 1 < bytes.len() => {
                match bytes[i + 1] {
                    b'u' if i + 6 <= bytes.len() => {
                        let hex = std::str::from_utf8(&bytes[i + 2..i + 6]).unwrap_or("");
                        match u32::from_str_radix(hex, 16).ok().and_then(char::from_u32) {
                            Some(c) => {
                                let mut buf = [0u8; 4];
                                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                            }
                            None => out.push(b'?'),
                        }
                        i += 6;
                        continue;
                    }
                    other => out.push(match other {
                        b'n' => b'\n',
                        b't' => b'\t',
                        b'r' => b'\r',
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        c => c,
                    }),
                }
                i += 2;
            }
            b'\\' => i += 1,
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    (None, String::from_utf8_lossy(&out).into_owned())
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && bytes[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The end (exclusive) of the JSON value starting at `start`: a string, a balanced object or
/// array, or a bare scalar; the text's end when it stops first.
fn json_value_end(bytes: &[u8], start: usize) -> usize {
    match bytes.get(start) {
        Some(b'"') => json_string(bytes, start).0.unwrap_or(bytes.len()),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = start;
            while i < bytes.len() {
                match bytes[i] {
                    b'"' => {
                        i = json_string(bytes, i).0.unwrap_or(bytes.len());
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            bytes.len()
        }
        _ => {
            let mut i = start;
            while i < bytes.len()
                && !matches!(bytes[i], b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
            {
                i += 1;
            }
            i
        }
    }
}

/// `text` (JSON, possibly cut short or malformed) with the value of every `*token` member
/// replaced by `"***"`.
fn mask_json_token_members(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut spans: Vec<(usize, usize)> = vec![];
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        let (end, name) = json_string(bytes, i);
        let Some(end) = end else { break };
        let colon = skip_ws(bytes, end);
        if bytes.get(colon) == Some(&b':') && is_token_name(&name) {
            let value = skip_ws(bytes, colon + 1);
            if value < bytes.len() {
                let value_end = json_value_end(bytes, value);
                spans.push((value, value_end));
                i = value_end;
                continue;
            }
        }
        i = end;
    }
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (from, to) in spans {
        out.push_str(&text[at..from]);
        out.push('"');
        out.push_str(MASK);
        out.push('"');
        at = to;
    }
    out.push_str(&text[at..]);
    Cow::Owned(out)
}

/// `text` with the value of every `*token=` pair of form-encoded text (a query string, or a body
/// sent as a form) replaced by `***`.
fn mask_form_token_pairs(text: &str) -> Cow<'_, str> {
    if !text.contains('=') {
        return Cow::Borrowed(text);
    }
    let mut changed = false;
    let pairs: Vec<Cow<'_, str>> = text
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) if is_token_name(name.trim()) && value != MASK => {
                changed = true;
                Cow::Owned(format!("{name}={MASK}"))
            }
            _ => Cow::Borrowed(pair),
        })
        .collect();
    if changed {
        Cow::Owned(pairs.join("&"))
    } else {
        Cow::Borrowed(text)
    }
}

/// A body or query string as it may be logged: the value of every `*token` field masked, in JSON
/// (whole, cut short or malformed) and in form-encoded text.
pub fn mask_token_fields(text: &str) -> Cow<'_, str> {
    match mask_json_token_members(text) {
        Cow::Borrowed(t) => mask_form_token_pairs(t),
        Cow::Owned(t) => Cow::Owned(mask_form_token_pairs(&t).into_owned()),
    }
}

/// The known secrets a log line is scrubbed of, in every form a formatter may write them.
#[derive(Clone, Default)]
pub struct Secrets(Arc<Vec<String>>);

impl Secrets {
    /// The secrets among `values` that are long enough to scrub (see [`MIN_SCRUBBED_LEN`]), each
    /// also in its JSON-escaped and percent-decoded forms.
    pub fn new<I: IntoIterator<Item = String>>(values: I) -> Secrets {
        let mut all: Vec<String> = vec![];
        for v in values {
            if v.chars().count() < MIN_SCRUBBED_LEN {
                continue;
            }
            let escaped = serde_json::to_string(&v).unwrap_or_default();
            let escaped = escaped[1..escaped.len().saturating_sub(1).max(1)].to_string();
            // Formatters escape twice when a JSON line carries a JSON body as a string field.
            let twice = serde_json::to_string(&escaped).unwrap_or_default();
            let twice = twice[1..twice.len().saturating_sub(1).max(1)].to_string();
            for form in [v, escaped, twice] {
                if !form.is_empty() && !all.contains(&form) {
                    all.push(form);
                }
            }
        }
        // Longest first, so that a secret containing another is replaced whole.
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Secrets(Arc::new(all))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `line` without any of the secrets.
    pub fn scrub<'a>(&self, line: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(line);
        for s in self.0.iter() {
            if out.contains(s.as_str()) {
                out = Cow::Owned(out.replace(s.as_str(), MASK));
            }
        }
        out
    }
}

/// The password of a `postgres://user:password@host/db` URL (or key=value DSN), if it has one,
/// raw and percent-decoded.
pub fn database_passwords(url: &str) -> Vec<String> {
    let mut found = vec![];
    if let Some(rest) = url.split_once("://").map(|(_, r)| r) {
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@')
            && let Some((_, password)) = userinfo.split_once(':')
            && !password.is_empty()
        {
            found.push(password.to_string());
            let decoded = percent_decode(password);
            if decoded != password {
                found.push(decoded);
            }
        }
        // `?password=…` in the query string.
        if let Some((_, query)) = rest.split_once('?') {
            for pair in query.split('&') {
                if let Some(("password", v)) = pair.split_once('=')
                    && !v.is_empty()
                {
                    found.push(v.to_string());
                    found.push(percent_decode(v));
                }
            }
        }
    } else {
        for pair in url.split_whitespace() {
            if let Some(("password", v)) = pair.split_once('=') {
                found.push(v.trim_matches('\'').to_string());
            }
        }
    }
    found
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(
                std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                16,
            )
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A `MakeWriter` whose writers scrub every write of the [`Secrets`]. tracing-subscriber's
/// formatters write each event with one `write_all` of the whole formatted line, so a secret is
/// never split between two writes.
pub struct Scrubbing<M> {
    inner: M,
    secrets: Secrets,
}

impl<M> Scrubbing<M> {
    pub fn new(inner: M, secrets: Secrets) -> Self {
        Scrubbing { inner, secrets }
    }
}

pub struct ScrubbingWriter<W> {
    inner: W,
    secrets: Secrets,
}

impl<W: io::Write> io::Write for ScrubbingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.secrets.is_empty() {
            return self.inner.write(buf);
        }
        match std::str::from_utf8(buf) {
            Ok(text) => match self.secrets.scrub(text) {
                Cow::Borrowed(_) => self.inner.write_all(buf),
                Cow::Owned(clean) => self.inner.write_all(clean.as_bytes()),
            },
            Err(_) => {
                let text = String::from_utf8_lossy(buf);
                self.inner.write_all(self.secrets.scrub(&text).as_bytes())
            }
        }
        .map(|()| buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<'a, M> tracing_subscriber::fmt::MakeWriter<'a> for Scrubbing<M>
where
    M: tracing_subscriber::fmt::MakeWriter<'a>,
{
    type Writer = ScrubbingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        ScrubbingWriter {
            inner: self.inner.make_writer(),
            secrets: self.secrets.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "3f2a9c1e-0b6f-4d2a-9a51-2c3d4e5f6a7b";

    #[test]
    fn every_token_member_is_masked_whatever_its_case_or_form() {
        for body in [
            format!(r#"{{"claimToken":"{T}","chunkIndex":0}}"#),
            format!(r#"{{"claim_token" : "{T}"}}"#),
            format!(r#"{{"publishToken":"{T}"}}"#),
            format!(r#"{{"details":{{"publishToken":"{T}","from":"X"}}}}"#),
            format!(r#"{{"claim\u0054oken":"{T}"}}"#),
            format!(r#"{{"TOKEN":["{T}"]}}"#),
            format!(r#"{{"claimToken":{{"v":"{T}"}}}}"#),
            // Cut short inside the value, or malformed after it.
            format!(r#"{{"claimToken":"{}"#, &T[..20]),
            format!(r#"{{"claimToken":"{T}", oops"#),
            format!(r#"{{"claimToken":{T}}}"#),
            format!("claimToken={T}&workerNode=n1"),
            format!("workerNode=n1&publish_token={T}"),
        ] {
            let shown = mask_token_fields(&body);
            assert!(!shown.contains(&T[..8]), "{body} -> {shown}");
            assert!(shown.contains(MASK), "{body} -> {shown}");
        }
    }

    proptest::proptest! {
        /// Whatever a client sends (any text, cut anywhere), masking neither panics (it runs in
        /// the access-log middleware, outside the handler's panic guard) nor shows a token value
        /// that a `*token` member carried.
        #[test]
        fn masking_never_panics_and_never_shows_a_token(
            before in ".{0,40}", after in ".{0,40}", name in "[a-zA-Zé_]{0,8}(token|Token|TOKEN)",
            cut in 0usize..200, form in proptest::bool::ANY,
        ) {
            let _ = mask_token_fields(&before);
            let _ = mask_token_fields(&format!("{before}=x&é{after}token=y"));
            let body = if form {
                format!("{after}&{name}={T}&x=1")
            } else {
                format!("{{\"{name}\":\"{T}\",{before}")
            };
            let shown = mask_token_fields(&body);
            proptest::prop_assert!(!shown.contains(&T[..8]), "{} -> {}", body, shown);
            let cut: String = body.chars().take(cut).collect();
            let shown = mask_token_fields(&cut);
            proptest::prop_assert!(!shown.contains(&T[..8]), "{} -> {}", cut, shown);
        }
    }

    #[test]
    fn other_members_and_strings_are_kept() {
        let body = format!(
            r#"{{"runId":"{T}","message":"claimToken is missing","tokens":1,"note":"a \"claimToken\" text"}}"#
        );
        assert_eq!(mask_token_fields(&body), body);
        let masked = mask_token_fields(r#"{"claimToken":"x","workerNode":"n1"}"#);
        assert_eq!(masked, r#"{"claimToken":"***","workerNode":"n1"}"#);
        assert_eq!(mask_token_fields("limit=5&jobKey=A"), "limit=5&jobKey=A");
    }

    #[test]
    fn known_secrets_are_scrubbed_in_raw_and_escaped_forms() {
        let s = Secrets::new(["pa\"ss/word".to_string(), "abc".to_string()]);
        assert_eq!(s.scrub(r#"url=x pa"ss/word y"#), "url=x *** y");
        assert_eq!(s.scrub(r#"{"m":"pa\"ss/word"}"#), r#"{"m":"***"}"#);
        assert_eq!(
            s.scrub(r#"{"m":"{\"k\":\"pa\\\"ss/word\"}"}"#),
            r#"{"m":"{\"k\":\"***\"}"}"#
        );
        // Too short to scrub without mangling the line.
        assert_eq!(s.scrub("abc"), "abc");
    }

    #[test]
    fn database_passwords_are_found_in_urls_and_dsns() {
        assert_eq!(
            database_passwords("postgres://u:s%40cret@h:5432/db?sslmode=require"),
            vec!["s%40cret".to_string(), "s@cret".to_string()]
        );
        assert!(database_passwords("postgres://u@h/db").is_empty());
        assert_eq!(
            database_passwords("postgresql://h/db?user=u&password=pw123456"),
            vec!["pw123456".to_string(), "pw123456".to_string()]
        );
        assert_eq!(
            database_passwords("host=h user=u password=topsecret"),
            vec!["topsecret".to_string()]
        );
    }
}
