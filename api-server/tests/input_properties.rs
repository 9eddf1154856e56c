//! Property tests of the lenient JSON decoding (CONTRACT §3.2): any body either parses or is
//! refused without a panic; what parses keeps every number as written; integers are read exactly
//! in every spelling NiFi uses (number, string, `7.0`, exponent) and nothing else passes as one.
use load_control_api::input::{
    JVal, MAX_VALUES, boolean, integer, parse_json, parse_uuid, string, uuid,
};
use proptest::prelude::*;
use serde_json::Value;

/// Arbitrary JSON documents (integers, floats, unicode strings, nesting).
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        ".*".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(".*", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    #[test]
    fn every_json_document_round_trips(v in json_value()) {
        let text = serde_json::to_vec(&v).expect("serializable");
        let parsed = parse_json(&text).expect("valid JSON parses");
        prop_assert_eq!(parsed.to_json(), v);
    }

    #[test]
    fn any_bytes_parse_or_are_refused_without_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_json(&bytes);
    }

    #[test]
    fn json_like_text_parses_or_is_refused_without_a_panic(text in r#"[\[\]{}",:0-9eE.+\-a-z \\]{0,200}"#) {
        if let Ok(v) = parse_json(text.as_bytes()) {
            // What parses is what serde_json accepts too.
            prop_assert!(serde_json::from_str::<Value>(&text).is_ok(), "{text:?} -> {v:?}");
        }
    }

    #[test]
    fn numbers_keep_their_literal_text(n in any::<i128>(), frac in prop::option::of("[0-9]{1,30}")) {
        let literal = match &frac { Some(f) => format!("{n}.{f}"), None => n.to_string() };
        let parsed = parse_json(literal.as_bytes());
        prop_assert_eq!(parsed, Ok(JVal::Num(literal.clone())));
    }

    #[test]
    fn an_integer_reads_exactly_in_every_spelling(n in any::<i64>(), zeros in 0usize..6, exp in 0u32..5) {
        prop_assert_eq!(integer(&JVal::Num(n.to_string())), Ok(n));
        prop_assert_eq!(integer(&JVal::Str(n.to_string())), Ok(n));
        let point_zero = format!("{n}.{}", "0".repeat(zeros.max(1)));
        prop_assert_eq!(integer(&JVal::Num(point_zero)), Ok(n));
        let exponent_zero = format!("{n}e0");
        prop_assert_eq!(integer(&JVal::Num(exponent_zero)), Ok(n));
        // n·10^exp written as n followed by exp zeros, then shifted back by a negative exponent.
        let shifted = format!("{n}{}e-{exp}", "0".repeat(exp as usize));
        prop_assert_eq!(integer(&JVal::Num(shifted)), Ok(n));
        // n/10^exp written with a positive exponent, when n has that many trailing digits.
        let digits = n.unsigned_abs().to_string();
        if digits.len() > exp as usize {
            let (head, tail) = digits.split_at(digits.len() - exp as usize);
            let sign = if n < 0 { "-" } else { "" };
            let spelled = format!("{sign}{head}.{tail}e{exp}");
            prop_assert_eq!(integer(&JVal::Num(spelled.clone())), Ok(n), "{}", spelled);
        }
    }

    #[test]
    fn a_fraction_or_an_out_of_range_value_is_never_an_integer(n in any::<i64>(), frac in "[0-9]{0,5}[1-9]", big in (i64::MAX as i128 + 1)..i128::MAX) {
        let fraction = format!("{n}.{frac}");
        let shifted = format!("{n}{frac}e-{}", frac.len());
        let too_big = big.to_string();
        let too_small = format!("-{big}0");
        for refused in [&fraction, &shifted, &too_big, &too_small] {
            let read = integer(&JVal::Num(refused.clone()));
            prop_assert!(read.is_err(), "{} read as {:?}", refused, read);
        }
        let read = integer(&JVal::Str(fraction.clone()));
        prop_assert!(read.is_err(), "{:?} read as {:?}", fraction, read);
    }

    #[test]
    fn conversions_never_panic_on_any_text(s in ".*") {
        let _ = integer(&JVal::Num(s.clone()));
        let _ = integer(&JVal::Str(s.clone()));
        let _ = boolean(&JVal::Str(s.clone()));
        let _ = string(&JVal::Str(s.clone()));
        let _ = uuid(&JVal::Str(s.clone()));
        let _ = parse_uuid(&s);
    }

    #[test]
    fn a_uuid_reads_in_each_accepted_spelling(bytes in any::<[u8; 16]>()) {
        let id = uuid::Uuid::from_bytes(bytes);
        for spelled in [
            id.hyphenated().to_string(),
            id.simple().to_string(),
            id.braced().to_string().to_uppercase(),
            id.urn().to_string(),
        ] {
            prop_assert_eq!(parse_uuid(&spelled), Some(id), "{}", spelled);
        }
    }
}

#[test]
fn the_value_budget_refuses_a_flood_of_tiny_values() {
    let flood = format!("[{}0]", "0,".repeat(MAX_VALUES));
    let refused = parse_json(flood.as_bytes()).expect_err("over the budget");
    assert!(refused.contains("JSON values"), "{refused}");
    let within = format!("[{}0]", "0,".repeat(MAX_VALUES - 2));
    assert!(parse_json(within.as_bytes()).is_ok());
}
