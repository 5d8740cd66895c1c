//! Parsing of Kubernetes resource quantities ("1Gi", "500M", "1.5Gi") into bytes, so that
//! storage sizes can be compared without floating point surprises.

use thiserror::Error;

/// A quantity that could not be parsed.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{0:?} is not a valid quantity (expected a number with an optional suffix such as Mi, Gi, M, G)")]
pub struct ParseQuantityError(pub String);

/// Converts a quantity to bytes, rounding a fractional byte count up.
pub fn parse_bytes(quantity: &str) -> Result<u128, ParseQuantityError> {
    let error = || ParseQuantityError(quantity.to_string());
    let trimmed = quantity.trim();
    let split =
        trimmed.find(|character: char| !(character.is_ascii_digit() || character == '.')).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    if number.is_empty() || number.matches('.').count() > 1 || number == "." {
        return Err(error());
    }
    // numerator / denominator keeps the decimal part exact.
    let (integer_part, fraction_part) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{integer_part}{fraction_part}");
    let numerator: u128 = digits.parse().map_err(|_| error())?;
    let denominator: u128 = 10u128.checked_pow(fraction_part.len() as u32).ok_or_else(error)?;
    let multiplier: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return Err(error()),
    };
    let scaled = numerator.checked_mul(multiplier).ok_or_else(error)?;
    Ok(scaled.div_ceil(denominator))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("100"), Ok(100));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "Gi", "1.2.3Gi", "1Gb", "-1Gi", "ten"] {
            assert!(parse_bytes(bad).is_err(), "{bad} should be rejected");
        }
    }
}
