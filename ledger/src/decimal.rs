//! Exact 38-digit decimals (SCNs, split bounds). Every value `^-?[0-9]{1,38}$` fits an i128
//! (|x| < 10^38 < 2^127), so comparisons and the canonical form need no floating point.
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Decimal38(i128);

impl Decimal38 {
    /// Parses the DecimalStr pattern of CONTRACT §3.3; anything else is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        let digits = s.strip_prefix('-').unwrap_or(s);
        if digits.is_empty() || digits.len() > 38 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse::<i128>().ok().map(Decimal38)
    }

    pub fn value(self) -> i128 {
        self.0
    }
}

/// Canonical text: no leading zeros, no `-0` (how PostgreSQL prints numeric(38,0)).
impl fmt::Display for Decimal38 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thirty_eight_digits_are_exact() {
        let a = Decimal38::parse("99999999999999999999999999999999999999").unwrap();
        let b = Decimal38::parse("99999999999999999999999999999999999998").unwrap();
        assert!(b < a);
        assert_eq!(a.to_string(), "99999999999999999999999999999999999999");
        assert_eq!(Decimal38::parse("-0007").unwrap().to_string(), "-7");
        assert_eq!(Decimal38::parse("-0").unwrap().to_string(), "0");
    }

    #[test]
    fn rejects_what_the_pattern_rejects() {
        for bad in [
            "",
            "-",
            "1.5",
            "+1",
            "1e3",
            " 1",
            "999999999999999999999999999999999999999",
        ] {
            assert!(Decimal38::parse(bad).is_none(), "{bad:?} accepted");
        }
    }
}
