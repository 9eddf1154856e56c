//! Lenient-in-type, strict-in-shape request input (CONTRACT §3.2): numbers keep their literal text
//! (a 38-digit SCN sent as a JSON number is preserved), every field is accepted under its camelCase
//! and snake_case names, unknown fields are refused, and every problem is collected so that one
//! 422 lists them all (§3.7).
use jiter::{Jiter, Peek};
use regex::Regex;
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

/// A parsed JSON value whose numbers are kept as written and whose objects keep key order and
/// duplicates (so "the same field twice" can be told).
#[derive(Debug, Clone, PartialEq)]
pub enum JVal {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<JVal>),
    Obj(Vec<(String, JVal)>),
}

const MAX_DEPTH: usize = 64;

/// The most JSON values one body may hold. The largest request the contract allows, a manifest
/// of 10,001 partitions, holds under 100,000; without a bound a 16 MiB body of `[0,0,…]` would
/// become millions of parsed values (hundreds of MB) before any shape check could refuse it.
pub const MAX_VALUES: usize = 250_000;

pub fn parse_json(bytes: &[u8]) -> Result<JVal, String> {
    let mut j = Jiter::new(bytes);
    let peek = j.peek().map_err(|e| e.description(&j))?;
    let mut budget = MAX_VALUES;
    let v = value(&mut j, peek, 0, &mut budget)?;
    j.finish().map_err(|e| e.description(&j))?;
    Ok(v)
}

fn value(j: &mut Jiter, peek: Peek, depth: usize, budget: &mut usize) -> Result<JVal, String> {
    if depth > MAX_DEPTH {
        return Err(format!("nesting deeper than {MAX_DEPTH}"));
    }
    *budget = budget
        .checked_sub(1)
        .ok_or_else(|| format!("more than {MAX_VALUES} JSON values"))?;
    let err = |e: jiter::JiterError| e.to_string();
    Ok(match peek {
        Peek::Null => {
            j.known_null().map_err(err)?;
            JVal::Null
        }
        Peek::True | Peek::False => JVal::Bool(j.known_bool(peek).map_err(err)?),
        Peek::String => JVal::Str(j.known_str().map_err(err)?.to_string()),
        Peek::Array => {
            let mut items = Vec::new();
            let mut next = j.known_array().map_err(err)?;
            while let Some(p) = next {
                items.push(value(j, p, depth + 1, budget)?);
                next = j.array_step().map_err(err)?;
            }
            JVal::Arr(items)
        }
        Peek::Object => {
            let mut fields = Vec::new();
            let mut key = j.known_object().map_err(err)?.map(str::to_string);
            while let Some(k) = key {
                let p = j.peek().map_err(err)?;
                fields.push((k, value(j, p, depth + 1, budget)?));
                key = j.next_key().map_err(err)?.map(str::to_string);
            }
            JVal::Obj(fields)
        }
        p if p.is_num() => {
            let bytes = j.known_number_bytes(p).map_err(err)?;
            JVal::Num(String::from_utf8_lossy(bytes).into_owned())
        }
        _ => return Err("expected a JSON value".into()),
    })
}

impl JVal {
    /// As a serde_json value, for free-form objects stored as sent. Numbers become JSON numbers
    /// (integers exactly; other literals through f64, or kept as text when they do not fit).
    pub fn to_json(&self) -> Value {
        match self {
            JVal::Null => Value::Null,
            JVal::Bool(b) => Value::Bool(*b),
            JVal::Num(n) => serde_json::from_str::<Value>(n)
                .ok()
                .filter(|v| v.is_number())
                .unwrap_or_else(|| Value::String(n.clone())),
            JVal::Str(s) => Value::String(s.clone()),
            JVal::Arr(a) => Value::Array(a.iter().map(JVal::to_json).collect()),
            // Last duplicate wins, as JSON parsers usually do.
            JVal::Obj(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

/// Every request-validation problem of one request (path, query and body together).
#[derive(Debug, Default)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            field: field.into(),
            message: message.into(),
        });
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A field's conversion: the value, or why it is refused.
pub type Conv<T> = Result<T, String>;

pub fn camel_to_snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads the declared fields of one JSON object and reports what is left over.
pub struct ObjReader<'a> {
    path: String,
    fields: &'a [(String, JVal)],
    used: Vec<bool>,
}

impl<'a> ObjReader<'a> {
    /// `None` (with a problem) when `v` is not an object.
    pub fn new(v: &'a JVal, path: &str, p: &mut Problems) -> Option<Self> {
        match v {
            JVal::Obj(fields) => Some(ObjReader {
                path: path.to_string(),
                fields,
                used: vec![false; fields.len()],
            }),
            _ => {
                p.push(path, "must be a JSON object");
                None
            }
        }
    }

    fn field_path(&self, name: &str) -> String {
        format!("{}.{name}", self.path)
    }

    /// The value under `name` or its snake_case alias; a field sent twice (under one name or both)
    /// is a problem.
    fn lookup(&mut self, name: &str, p: &mut Problems) -> Option<&'a JVal> {
        let snake = camel_to_snake(name);
        let mut found: Option<&'a JVal> = None;
        let mut count = 0;
        for (i, (k, v)) in self.fields.iter().enumerate() {
            if k == name || *k == snake {
                self.used[i] = true;
                count += 1;
                found = Some(v);
            }
        }
        if count > 1 {
            p.push(
                self.field_path(name),
                format!("given more than once (as {name} and/or {snake})"),
            );
            return None;
        }
        found
    }

    /// A required field; `null` is refused.
    pub fn required<T: Default>(
        &mut self,
        name: &str,
        p: &mut Problems,
        conv: impl Fn(&'a JVal) -> Conv<T>,
    ) -> T {
        match self.lookup(name, p) {
            None if !self
                .fields
                .iter()
                .any(|(k, _)| k == name || *k == camel_to_snake(name)) =>
            {
                p.push(self.field_path(name), "is required");
                T::default()
            }
            None => T::default(),
            Some(JVal::Null) => {
                p.push(self.field_path(name), "must not be null");
                T::default()
            }
            Some(v) => self.convert(name, v, p, conv),
        }
    }

    /// An optional field with a default; sent as `null` it is refused unless `conv` accepts null.
    pub fn optional<T: Default>(
        &mut self,
        name: &str,
        default: T,
        p: &mut Problems,
        conv: impl Fn(&'a JVal) -> Conv<T>,
    ) -> T {
        match self.lookup(name, p) {
            None => default,
            Some(v) => self.convert(name, v, p, conv),
        }
    }

    fn convert<T: Default>(
        &self,
        name: &str,
        v: &'a JVal,
        p: &mut Problems,
        conv: impl Fn(&'a JVal) -> Conv<T>,
    ) -> T {
        conv(v).unwrap_or_else(|m| {
            p.push(self.field_path(name), m);
            T::default()
        })
    }

    /// Fields nobody asked for are unknown (named as sent).
    pub fn finish(self, p: &mut Problems) {
        for (i, (k, _)) in self.fields.iter().enumerate() {
            if !self.used[i] {
                p.push(format!("{}.{k}", self.path), "unknown field");
            }
        }
    }
}

// ---- conversions (§3.2 table) ----

pub fn integer(v: &JVal) -> Conv<i64> {
    let text = match v {
        JVal::Num(n) => n.as_str(),
        JVal::Str(s) => {
            let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err("must be an integer".into());
            }
            s.as_str()
        }
        _ => return Err("must be an integer".into()),
    };
    if text.contains(['e', 'E']) {
        // Exactly, in decimal: through f64, 9007199254740993e0 would become …992.
        return exact_integer(text)
            .ok_or_else(|| "must be an integer in the signed 64-bit range".to_string());
    }
    let int_part = match text.split_once('.') {
        // 7.0 is an integer; 7.5 is not.
        Some((i, frac)) => {
            if !frac.bytes().all(|b| b == b'0') {
                return Err("must be an integer".into());
            }
            i
        }
        None => text,
    };
    int_part
        .parse::<i64>()
        .map_err(|_| "must be an integer in the signed 64-bit range".to_string())
}

/// The exact value of a decimal literal with an exponent (`15e-1` is not an integer, `1.5e1`
/// is 15), when it is an integer in the signed 64-bit range.
fn exact_integer(text: &str) -> Option<i64> {
    let (mantissa, exp) = text.split_once(['e', 'E'])?;
    let exp: i64 = exp.strip_prefix('+').unwrap_or(exp).parse().ok()?;
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa.strip_prefix('+').unwrap_or(mantissa)),
    };
    let (int_digits, frac_digits) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int_digits.is_empty() && frac_digits.is_empty()
        || !int_digits
            .bytes()
            .chain(frac_digits.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{int_digits}{frac_digits}");
    let digits = digits.trim_start_matches('0');
    let scale = exp.checked_sub(frac_digits.len() as i64)?;
    let digits: &str = if digits.is_empty() {
        "0"
    } else if scale < 0 {
        // The dropped digits must all be zeros, or it is not an integer.
        let keep = digits.len().checked_sub(scale.unsigned_abs() as usize);
        match keep {
            Some(k) if digits[k..].bytes().all(|b| b == b'0') => &digits[..k],
            None if digits.bytes().all(|b| b == b'0') => "0",
            _ => return None,
        }
    } else {
        digits
    };
    let zeros = if digits == "0" {
        0
    } else {
        scale.max(0) as usize
    };
    if digits.len() + zeros > 19 {
        return None;
    }
    let value: i128 = format!(
        "{}{}",
        if digits.is_empty() { "0" } else { digits },
        "0".repeat(zeros)
    )
    .parse()
    .ok()?;
    i64::try_from(if negative { -value } else { value }).ok()
}

pub fn boolean(v: &JVal) -> Conv<bool> {
    match v {
        JVal::Bool(b) => Ok(*b),
        JVal::Num(n) if n == "1" => Ok(true),
        JVal::Num(n) if n == "0" => Ok(false),
        JVal::Str(s) => match s.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" | "t" | "y" => Ok(true),
            "false" | "0" | "no" | "off" | "f" | "n" => Ok(false),
            _ => Err("must be a boolean".into()),
        },
        _ => Err("must be a boolean".into()),
    }
}

/// PostgreSQL stores no U+0000 in text or jsonb: such a value is the client's mistake (422),
/// never a database error (CONTRACT §3.3).
pub const NUL_REFUSED: &str = "must not contain the NUL character (U+0000)";

/// Whether a value holds U+0000 anywhere (strings, object keys, nested).
pub fn has_nul(v: &JVal) -> bool {
    match v {
        JVal::Str(s) => s.contains('\0'),
        JVal::Arr(items) => items.iter().any(has_nul),
        JVal::Obj(fields) => fields.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// A string; a JSON number becomes its literal text.
pub fn string(v: &JVal) -> Conv<String> {
    match v {
        JVal::Str(s) if s.contains('\0') => Err(NUL_REFUSED.into()),
        JVal::Str(s) => Ok(s.clone()),
        JVal::Num(n) => Ok(n.clone()),
        _ => Err("must be a string".into()),
    }
}

pub fn uuid(v: &JVal) -> Conv<Uuid> {
    let s = string(v).map_err(|_| "must be a UUID".to_string())?;
    parse_uuid(&s).ok_or_else(|| "must be a UUID".into())
}

/// Hyphenated, 32 hex digits, braced or `urn:uuid:` (any case).
pub fn parse_uuid(s: &str) -> Option<Uuid> {
    let lower = s.to_ascii_lowercase();
    let body = lower.strip_prefix("urn:uuid:").unwrap_or(&lower);
    let body = body
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .unwrap_or(body);
    let ok = match body.len() {
        32 => body.bytes().all(|b| b.is_ascii_hexdigit()),
        36 => body.bytes().enumerate().all(|(i, b)| {
            if [8, 13, 18, 23].contains(&i) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        }),
        _ => false,
    };
    if ok { Uuid::parse_str(body).ok() } else { None }
}

/// Accepts `null` as `None`, else converts.
pub fn nullable<T>(conv: impl Fn(&JVal) -> Conv<T>) -> impl Fn(&JVal) -> Conv<Option<T>> {
    move |v| {
        if matches!(v, JVal::Null) {
            Ok(None)
        } else {
            conv(v).map(Some)
        }
    }
}

pub fn min_int(min: i64) -> impl Fn(&JVal) -> Conv<i64> {
    move |v| {
        let n = integer(v)?;
        if n < min {
            Err(format!("must be >= {min}"))
        } else {
            Ok(n)
        }
    }
}

pub fn int_range(min: i64, max: i64) -> impl Fn(&JVal) -> Conv<i64> {
    move |v| {
        let n = integer(v)?;
        if n < min || n > max {
            Err(format!("must be between {min} and {max}"))
        } else {
            Ok(n)
        }
    }
}

/// A string of `min..=max` characters.
pub fn text(min: usize, max: usize) -> impl Fn(&JVal) -> Conv<String> {
    move |v| {
        let s = string(v)?;
        let n = s.chars().count();
        if n < min {
            Err(format!("must be at least {min} characters"))
        } else if n > max {
            Err(format!("must be at most {max} characters"))
        } else {
            Ok(s)
        }
    }
}

/// A string matching `re` (whose source is quoted in the message).
pub fn pattern(re: &'static Regex) -> impl Fn(&JVal) -> Conv<String> {
    move |v| {
        let s = string(v)?;
        if re.is_match(&s) {
            Ok(s)
        } else {
            Err(format!("does not match {}", re.as_str()))
        }
    }
}

/// The exact upper-case name of one of `parse`'s values.
pub fn enumeration<T>(
    parse: impl Fn(&str) -> Option<T>,
    allowed: &'static str,
) -> impl Fn(&JVal) -> Conv<Option<T>> {
    move |v| match v {
        JVal::Str(s) => parse(s)
            .map(Some)
            .ok_or_else(|| format!("must be one of {allowed}")),
        _ => Err(format!("must be one of {allowed}")),
    }
}

/// A free-form object, kept as sent.
pub fn object(v: &JVal) -> Conv<serde_json::Map<String, Value>> {
    if has_nul(v) {
        return Err(NUL_REFUSED.into());
    }
    match v.to_json() {
        Value::Object(m) if matches!(v, JVal::Obj(_)) => Ok(m),
        _ => Err("must be a JSON object".into()),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn integers_with_an_exponent_are_exact() {
        let n = |t: &str| integer(&JVal::Num(t.into()));
        assert_eq!(n("9007199254740993e0"), Ok(9007199254740993));
        assert_eq!(n("1.5e1"), Ok(15));
        assert!(n("15e-1").is_err());
        assert_eq!(n("1500e-2"), Ok(15));
        assert_eq!(n("-2E3"), Ok(-2000));
        assert_eq!(n("9223372036854775807e0"), Ok(i64::MAX));
        assert!(n("9223372036854775808e0").is_err());
        assert!(n("1e19").is_err());
        assert_eq!(n("0e99999"), Ok(0));
        assert!(n("1e99999999999999999999").is_err());
    }

    use super::*;

    fn j(s: &str) -> JVal {
        parse_json(s.as_bytes()).unwrap()
    }

    #[test]
    fn numbers_keep_their_literal_text() {
        assert_eq!(
            j("12345678901234567890123456789012345678"),
            JVal::Num("12345678901234567890123456789012345678".into())
        );
        assert_eq!(string(&j("1.50")).unwrap(), "1.50");
        assert!(parse_json(b"{\"a\":1,}").is_err());
        assert!(parse_json(b"{} x").is_err());
        assert!(parse_json(&[b'['; 200]).is_err());
    }

    #[test]
    fn a_body_of_too_many_values_is_refused_while_parsing() {
        let many = |n: usize| format!("[{}0]", "0,".repeat(n - 2));
        assert!(
            parse_json(many(MAX_VALUES).as_bytes()).is_ok(),
            "the array and its items"
        );
        let err = parse_json(many(MAX_VALUES + 1).as_bytes()).unwrap_err();
        assert!(err.contains("250000 JSON values"), "{err}");
    }

    #[test]
    fn integers_are_lenient_in_type_only() {
        assert_eq!(integer(&j("7")).unwrap(), 7);
        assert_eq!(integer(&j("7.0")).unwrap(), 7);
        assert_eq!(integer(&j("\"-3\"")).unwrap(), -3);
        assert_eq!(integer(&j("\"+3\"")).unwrap(), 3);
        for bad in [
            "7.5",
            "true",
            "\"\"",
            "\"7a\"",
            "\"7.0\"",
            "9223372036854775808",
            "null",
            "[]",
        ] {
            assert!(integer(&j(bad)).is_err(), "{bad} accepted");
        }
        assert_eq!(integer(&j("-9223372036854775808")).unwrap(), i64::MIN);
    }

    #[test]
    fn booleans_accept_the_contract_spellings() {
        for t in [
            "true", "\"TRUE\"", "\"yes\"", "\"On\"", "\"t\"", "\"Y\"", "1", "\"1\"",
        ] {
            assert!(boolean(&j(t)).unwrap(), "{t}");
        }
        for f in [
            "false",
            "\"False\"",
            "\"no\"",
            "\"off\"",
            "\"f\"",
            "\"n\"",
            "0",
            "\"0\"",
        ] {
            assert!(!boolean(&j(f)).unwrap(), "{f}");
        }
        for bad in ["2", "\"maybe\"", "null", "{}"] {
            assert!(boolean(&j(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn uuids_in_four_forms() {
        let want = Uuid::parse_str("0b6f8c1e-4d2a-4f7b-9a51-2c3d4e5f6a7b").unwrap();
        for form in [
            "0b6f8c1e-4d2a-4f7b-9a51-2c3d4e5f6a7b",
            "0B6F8C1E4D2A4F7B9A512C3D4E5F6A7B",
            "{0b6f8c1e-4d2a-4f7b-9a51-2c3d4e5f6a7b}",
            "urn:uuid:0b6f8c1e-4d2a-4f7b-9a51-2c3d4e5f6a7b",
        ] {
            assert_eq!(parse_uuid(form), Some(want), "{form}");
        }
        for bad in [
            "",
            "0b6f8c1e-4d2a-4f7b-9a51",
            "0b6f8c1e4d2a-4f7b-9a51-2c3d4e5f6a7b00",
            "zzzzzzzz-4d2a-4f7b-9a51-2c3d4e5f6a7b",
        ] {
            assert_eq!(parse_uuid(bad), None, "{bad}");
        }
    }

    #[test]
    fn aliases_duplicates_and_unknown_fields() {
        let v = j(r#"{"job_key":"A","jobKey":"B","color":"red","count":"3"}"#);
        let mut p = Problems::default();
        let mut o = ObjReader::new(&v, "$", &mut p).unwrap();
        let _ = o.required("jobKey", &mut p, string);
        let c = o.required("count", &mut p, integer);
        let _ = o.required("missing", &mut p, string);
        o.finish(&mut p);
        assert_eq!(c, 3);
        let fields: Vec<_> = p.0.iter().map(|x| x.field.as_str()).collect();
        assert_eq!(fields, vec!["$.jobKey", "$.missing", "$.color"]);
    }

    #[test]
    fn null_is_not_the_default() {
        let v = j(r#"{"a":null,"b":null}"#);
        let mut p = Problems::default();
        let mut o = ObjReader::new(&v, "$", &mut p).unwrap();
        assert!(!o.optional("a", false, &mut p, boolean));
        assert_eq!(o.optional("b", None, &mut p, nullable(integer)), None);
        o.finish(&mut p);
        assert_eq!(p.0.len(), 1);
        assert_eq!(p.0[0].field, "$.a");
    }
}
