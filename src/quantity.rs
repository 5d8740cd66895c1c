//! Parsing of Kubernetes resource quantities ("1Gi", "500M", "1.5Gi", "2e10") into bytes, so that
//! storage sizes can be compared without floating point surprises.
//!
//! The grammar is Kubernetes' own (k8s.io/apimachinery/pkg/api/resource):
//!
//! ```text
//! quantity        ::= signedNumber suffix
//! signedNumber    ::= number | sign number          sign ::= "+" | "-"
//! number          ::= digits | digits "." digits | digits "." | "." digits
//! suffix          ::= binarySI | decimalExponent | decimalSI
//! binarySI        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! decimalSI       ::= n | u | m | "" | k | M | G | T | P | E
//! decimalExponent ::= "e" signedInteger | "E" signedInteger
//! ```
//!
//! No whitespace anywhere. Values above [`MAX_BYTES`] are refused with their own message.

use thiserror::Error;

/// Largest byte count accepted: what Kubernetes' `Quantity.Value()` (an int64) can hold, 8 EiB.
pub const MAX_BYTES: u128 = i64::MAX as u128;
/// Most significant digits accepted (a u128 holds 38).
const MAX_SIGNIFICANT_DIGITS: usize = 38;

/// A quantity that could not be turned into a byte count.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ParseQuantityError {
    /// Not a quantity at all.
    #[error("{0:?} is not a valid quantity (expected a number with an optional suffix such as Mi, Gi, M, G or an exponent such as e9)")]
    Malformed(String),
    /// A quantity, but negative.
    #[error("{0:?} is negative")]
    Negative(String),
    /// A quantity, but larger than [`MAX_BYTES`] or written with more digits than can be exact.
    #[error(
        "{0:?} is too large: at most 8Ei ({MAX_BYTES} bytes) with at most {MAX_SIGNIFICANT_DIGITS} significant digits"
    )]
    TooLarge(String),
}

/// Decimal and binary exponents of a suffix, or None when it is not one.
fn suffix_exponents(suffix: &str) -> Option<(i64, u32)> {
    let decimal = |exponent: i64| Some((exponent, 0));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => Some((0, 10)),
        "Mi" => Some((0, 20)),
        "Gi" => Some((0, 30)),
        "Ti" => Some((0, 40)),
        "Pi" => Some((0, 50)),
        "Ei" => Some((0, 60)),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
                return None;
            }
            // A huge exponent is still a quantity; saturate and let the bounds below decide.
            let magnitude: i64 = digits.parse().unwrap_or(i64::MAX / 2).min(i64::MAX / 2);
            decimal(if exponent.starts_with('-') { -magnitude } else { magnitude })
        }
    }
}

/// Converts a quantity to bytes, rounding a fractional byte count up.
pub fn parse_bytes(quantity: &str) -> Result<u128, ParseQuantityError> {
    let malformed = || ParseQuantityError::Malformed(quantity.to_string());
    let too_large = || ParseQuantityError::TooLarge(quantity.to_string());
    let (negative, unsigned) = match quantity.as_bytes().first() {
        Some(b'-') => (true, &quantity[1..]),
        Some(b'+') => (false, &quantity[1..]),
        _ => (false, quantity),
    };
    let number_end = unsigned.find(|character: char| !(character.is_ascii_digit() || character == '.'));
    let (number, suffix) = unsigned.split_at(number_end.unwrap_or(unsigned.len()));
    let (integer_part, fraction_part) = number.split_once('.').unwrap_or((number, ""));
    if (integer_part.is_empty() && fraction_part.is_empty()) || fraction_part.contains('.') {
        return Err(malformed());
    }
    let (mut exponent10, exponent2) = suffix_exponents(suffix).ok_or_else(malformed)?;
    // digits × 10^exponent10 × 2^exponent2, with digits free of leading and trailing zeros.
    let all_digits = format!("{integer_part}{fraction_part}");
    exponent10 -= fraction_part.len() as i64;
    let significant = all_digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    exponent10 += (significant.len() - trimmed.len()) as i64;
    if trimmed.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(ParseQuantityError::Negative(quantity.to_string()));
    }
    if trimmed.len() > MAX_SIGNIFICANT_DIGITS {
        return Err(too_large());
    }
    // The value is at least 10^(digits-1+exponent10) × 2^exponent2; 10^19 > MAX_BYTES.
    let magnitude = trimmed.len() as i64 - 1 + exponent10 + (f64::from(exponent2) * std::f64::consts::LOG10_2) as i64;
    if magnitude > 19 {
        return Err(too_large());
    }
    let mantissa: u128 = trimmed.parse().map_err(|_| malformed())?;
    let scaled = mantissa.checked_mul(1u128 << exponent2).ok_or_else(too_large)?;
    let bytes = if exponent10 >= 0 {
        10u128.checked_pow(exponent10 as u32).and_then(|power| scaled.checked_mul(power)).ok_or_else(too_large)?
    } else if exponent10 < -38 {
        // Less than one byte (scaled < 10^38 · 2^60 is far below 10^-exponent10 here): rounds up to 1.
        1
    } else {
        scaled.div_ceil(10u128.pow((-exponent10) as u32))
    };
    if bytes > MAX_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, ParseQuantityError, MAX_BYTES};

    #[test]
    fn binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert_eq!(parse_bytes("1500m"), Ok(2));
        assert_eq!(parse_bytes("1E"), Ok(1_000_000_000_000_000_000));
    }

    #[test]
    fn every_number_form_and_sign() {
        assert_eq!(parse_bytes("5."), Ok(5));
        assert_eq!(parse_bytes(".5Ki"), Ok(512));
        assert_eq!(parse_bytes("+1Ki"), Ok(1024));
        assert_eq!(parse_bytes("0010Mi"), Ok(10 << 20));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("-0"), Ok(0));
    }

    #[test]
    fn exponents() {
        assert_eq!(parse_bytes("2e10"), Ok(20_000_000_000));
        assert_eq!(parse_bytes("1e10"), Ok(10_000_000_000));
        assert_eq!(parse_bytes("1E9"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("1.5e+3"), Ok(1500));
        assert_eq!(parse_bytes("15e-1"), Ok(2));
        assert_eq!(parse_bytes("1e-100"), Ok(1));
    }

    #[test]
    fn rejects_what_the_grammar_does_not_allow() {
        for bad in [
            "",
            "Gi",
            "1.2.3Gi",
            "1Gb",
            "ten",
            " 10Gi",
            "10Gi ",
            "1 Gi",
            ".",
            "+",
            "-",
            "1e",
            "1e+",
            "1e1.5",
            "1ki",
            "1KI",
            "1gi",
            "e10",
            "1Gi\n",
            "1\u{202e}Gi",
            "0x10",
            "1_000",
        ] {
            assert!(matches!(parse_bytes(bad), Err(ParseQuantityError::Malformed(_))), "{bad:?} should be malformed");
        }
    }

    #[test]
    fn negative_values_are_quantities_but_not_sizes() {
        assert_eq!(parse_bytes("-1Gi"), Err(ParseQuantityError::Negative("-1Gi".into())));
    }

    #[test]
    fn huge_values_are_refused_with_their_own_message() {
        assert_eq!(parse_bytes("8Ei"), Err(ParseQuantityError::TooLarge("8Ei".into())));
        assert_eq!(parse_bytes("9223372036854775807"), Ok(MAX_BYTES));
        for huge in ["99999999999999999999Ti", "9223372036854775808", "1e19", "1e999999999999999999999", "16Ei"] {
            let error = parse_bytes(huge).unwrap_err();
            assert!(matches!(error, ParseQuantityError::TooLarge(_)), "{huge}: {error:?}");
            assert!(error.to_string().contains("too large: at most 8Ei"), "{error}");
        }
    }
}
