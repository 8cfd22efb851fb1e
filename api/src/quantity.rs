//! Kubernetes resource quantities (`16Gi`, `500m`, `1e9`) as whole numbers, and back.
//!
//! The grammar is `resource.Quantity`'s (k8s.io/apimachinery `pkg/api/resource/quantity.go`):
//! `<signedNumber><suffix>`, suffix one of the binary SI `Ki Mi Gi Ti Pi Ei`, the decimal SI
//! `m "" k M G T P E`, or a decimal exponent `e<n>`/`E<n>`. Like `Quantity.Value()`, a
//! fractional result is rounded up.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The value of `q` as a whole number, rounded up (`1.5` → 2, `100m` → 1); memory quantities
/// give bytes.
///
/// # Errors
/// A message naming the value when it is not a quantity, is negative, or exceeds `i64`.
pub fn value(q: &Quantity) -> Result<i64, String> {
    let text = q.0.trim();
    let bad = |why: &str| {
        format!(
            "{text:?} is not a Kubernetes quantity ({why}); expected e.g. \"16Gi\", \"8G\", \"17179869184\""
        )
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.starts_with('-') {
        return Err(bad("negative"));
    }
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad("no number"));
    }
    // Base and decimal exponent of the suffix: the value is number × base × 10^exp.
    let (base, exp): (u128, i32) = match suffix {
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "m" => (1, -3),
        "" => (1, 0),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        s if s.starts_with(['e', 'E']) => {
            (1, s[1..].parse::<i32>().map_err(|_| bad("bad exponent"))?)
        }
        _ => return Err(bad("unknown suffix")),
    };
    // number = digits / 10^frac.len(); exact arithmetic in u128, rounding up at the end.
    let digits: u128 = format!("{int}{frac}")
        .parse()
        .map_err(|_| bad("too large"))?;
    let scale = exp - i32::try_from(frac.len()).map_err(|_| bad("too long"))?;
    let too_large = || bad("too large");
    let mut numerator = digits.checked_mul(base).ok_or_else(too_large)?;
    let mut denominator: u128 = 1;
    if scale >= 0 {
        numerator = numerator
            .checked_mul(
                10u128
                    .checked_pow(scale.unsigned_abs())
                    .ok_or_else(too_large)?,
            )
            .ok_or_else(too_large)?;
    } else {
        denominator = 10u128
            .checked_pow(scale.unsigned_abs())
            .ok_or_else(|| bad("too precise"))?;
    }
    let whole = numerator.div_ceil(denominator);
    i64::try_from(whole).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Result<i64, String> {
        value(&Quantity(s.into()))
    }

    #[test]
    fn quantities_as_kubernetes_reads_them() {
        for (text, want) in [
            ("16Gi", 16 << 30),
            ("1Ki", 1024),
            ("1.5Gi", 3 << 29),
            ("8G", 8_000_000_000),
            ("1k", 1000),
            ("17179869184", 17_179_869_184),
            ("1e9", 1_000_000_000),
            ("1E3", 1000),
            ("2.5e3", 2500),
            ("100m", 1),
            ("1500m", 2),
            ("0", 0),
            ("+4", 4),
            (".5Ki", 512),
            ("1Ei", 1 << 60),
        ] {
            assert_eq!(v(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn non_quantities_are_refused_with_the_value() {
        for text in [
            "",
            "Gi",
            "16GB",
            "16 Gi",
            "-1Gi",
            "1.2.3",
            "16gi",
            "1e",
            "9Ei",
            "99999999999999999999999999999999999999999",
        ] {
            let e = v(text).unwrap_err();
            assert!(
                e.contains(&format!("{text:?}")) && e.contains("16Gi"),
                "{text}: {e}"
            );
        }
    }
}
