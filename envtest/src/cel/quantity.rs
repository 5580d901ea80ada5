//! Kubernetes resource quantities (`resource.Quantity`) for the CEL `quantity` library: parsing,
//! comparison and arithmetic.
//!
//! k8s-openapi carries a `Quantity` as its string only, and no maintained crate parses
//! apimachinery's grammar, so it is parsed here (`<signedNumber><suffix>`, suffix one of the
//! binary `Ki`…`Ei`, the decimal `m`, ``, `k`, `M`…`E`, or an exponent `e<int>`/`E<int>`).
//! A value is held exactly as `mantissa × 10^scale` in an `i128`; a quantity too large for that
//! (more than ~38 significant digits) is refused as malformed, where apimachinery falls back to
//! arbitrary precision.

use std::cmp::Ordering;

/// apimachinery's `ErrFormatWrong`, the error of `quantity()` on a malformed string.
pub(crate) const FORMAT_WRONG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// An exact quantity: `mantissa × 10^scale`, normalized (no trailing zero in the mantissa, scale
/// 0 for zero) so that equal quantities have equal fields whatever their spelling (`1k` and
/// `1000`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Quantity {
    mantissa: i128,
    scale: i32,
}

impl Quantity {
    fn new(mantissa: i128, scale: i32) -> Quantity {
        let (mut m, mut s) = (mantissa, scale);
        if m == 0 {
            return Quantity { mantissa: 0, scale: 0 };
        }
        while m % 10 == 0 {
            m /= 10;
            s = s.saturating_add(1);
        }
        Quantity { mantissa: m, scale: s }
    }

    /// The quantity of an integer (`q.add(1)`).
    pub(crate) fn from_int(i: i64) -> Quantity {
        Quantity::new(i128::from(i), 0)
    }

    /// Parses `s` as `resource.ParseQuantity` does; `None` when it is malformed.
    pub(crate) fn parse(s: &str) -> Option<Quantity> {
        let bytes = s.as_bytes();
        let mut i = 0;
        let negative = match bytes.first() {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let mut mantissa: i128 = 0;
        let mut scale: i32 = 0;
        let mut digits = 0;
        let mut seen_dot = false;
        while let Some(&b) = bytes.get(i) {
            match b {
                b'0'..=b'9' => {
                    mantissa = mantissa.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
                    digits += 1;
                    if seen_dot {
                        scale -= 1;
                    }
                }
                b'.' if !seen_dot => seen_dot = true,
                _ => break,
            }
            i += 1;
        }
        if digits == 0 {
            return None;
        }
        let suffix = &s[i..];
        let (binary_power, exp10): (u32, i32) = match suffix {
            "" => (0, 0),
            "Ki" => (1, 0),
            "Mi" => (2, 0),
            "Gi" => (3, 0),
            "Ti" => (4, 0),
            "Pi" => (5, 0),
            "Ei" => (6, 0),
            "m" => (0, -3),
            "k" => (0, 3),
            "M" => (0, 6),
            "G" => (0, 9),
            "T" => (0, 12),
            "P" => (0, 15),
            "E" => (0, 18),
            _ => {
                let rest = suffix.strip_prefix(['e', 'E'])?;
                let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                (0, rest.parse::<i32>().ok().filter(|e| e.abs() <= 1000)?)
            }
        };
        mantissa = mantissa.checked_mul(1024i128.checked_pow(binary_power)?)?;
        if negative {
            mantissa = -mantissa;
        }
        Some(Quantity::new(mantissa, scale.checked_add(exp10)?))
    }

    /// Both mantissas at the smaller scale, if they fit.
    fn aligned(self, other: Quantity) -> Option<(i128, i128, i32)> {
        let scale = self.scale.min(other.scale);
        let up = |q: Quantity| -> Option<i128> {
            let shift = u32::try_from(q.scale - scale).ok()?;
            q.mantissa.checked_mul(10i128.checked_pow(shift)?)
        };
        Some((up(self)?, up(other)?, scale))
    }

    /// `q.compareTo(other)`'s order.
    pub(crate) fn cmp(self, other: Quantity) -> Ordering {
        match self.aligned(other) {
            Some((a, b, _)) => a.cmp(&b),
            // Too far apart to align exactly: their magnitudes differ by far more than a float's
            // error.
            None => self
                .as_approximate_float()
                .partial_cmp(&other.as_approximate_float())
                .unwrap_or(Ordering::Equal),
        }
    }

    /// `q.add(other)`; `None` on overflow.
    pub(crate) fn add(self, other: Quantity) -> Option<Quantity> {
        let (a, b, scale) = self.aligned(other)?;
        Some(Quantity::new(a.checked_add(b)?, scale))
    }

    /// `q.sub(other)`; `None` on overflow.
    pub(crate) fn sub(self, other: Quantity) -> Option<Quantity> {
        let (a, b, scale) = self.aligned(other)?;
        Some(Quantity::new(a.checked_sub(b)?, scale))
    }

    /// `q.sign()`: -1, 0 or 1.
    pub(crate) fn sign(self) -> i64 {
        match self.mantissa.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    /// `q.asInteger()`: the value as an `int`, if it is integral and fits (`isInteger`).
    pub(crate) fn as_integer(self) -> Option<i64> {
        if self.scale < 0 {
            return None;
        }
        let factor = 10i128.checked_pow(u32::try_from(self.scale).ok()?)?;
        i64::try_from(self.mantissa.checked_mul(factor)?).ok()
    }

    /// `q.asApproximateFloat()`.
    pub(crate) fn as_approximate_float(self) -> f64 {
        // i128 → f64 rounds, as apimachinery's AsApproximateFloat64 does.
        #[allow(clippy::cast_precision_loss)]
        let m = self.mantissa as f64;
        m * 10f64.powi(self.scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|| panic!("{s} should parse"))
    }

    #[test]
    fn parses_every_suffix_as_apimachinery() {
        assert_eq!(q("1Ki").as_integer(), Some(1024));
        assert_eq!(q("1.5Gi").as_integer(), Some(1_610_612_736));
        assert_eq!(q("2Ei").as_integer(), Some(2 * (1i64 << 60)));
        assert_eq!(q("500m").as_approximate_float(), 0.5);
        assert_eq!(q("1k"), q("1000"));
        assert_eq!(q("1M").as_integer(), Some(1_000_000));
        assert_eq!(q("3G").as_integer(), Some(3_000_000_000));
        assert_eq!(q("1T").as_integer(), Some(1_000_000_000_000));
        assert_eq!(q("1P").as_integer(), Some(10i64.pow(15)));
        assert_eq!(q("1E").as_integer(), Some(10i64.pow(18)));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1E3"), q("1k"));
        assert_eq!(q("12e-3"), q("12m"));
        assert_eq!(q("+1"), q("1"));
        assert_eq!(q("-1.5").sign(), -1);
        assert_eq!(q(".5"), q("500m"));
        assert_eq!(q("5."), q("5"));
        assert_eq!(q("0").sign(), 0);
        assert_eq!(q("0.000"), q("0"));
    }

    #[test]
    fn refuses_what_apimachinery_refuses() {
        for bad in [
            "", "abc", "1.2.3", "1Kb", "1 Ki", "Ki", ".", "-", "1e", "1e+", "1ee3", "1KiB", "1m1",
        ] {
            assert_eq!(Quantity::parse(bad), None, "{bad:?} should not parse");
        }
    }

    #[test]
    fn compares_and_computes_exactly() {
        assert_eq!(q("1Gi").cmp(q("1G")), Ordering::Greater);
        assert_eq!(q("100m").cmp(q("0.1")), Ordering::Equal);
        assert_eq!(q("-1").cmp(q("1m")), Ordering::Less);
        assert_eq!(
            q("1e100").cmp(q("1")),
            Ordering::Greater,
            "unalignable falls back to floats"
        );
        assert_eq!(q("1Gi").add(q("512Mi")), Some(q("1.5Gi")));
        assert_eq!(q("1").sub(q("1500m")), Some(q("-0.5")));
        assert_eq!(q("1").add(Quantity::from_int(2)), Some(q("3")));
        assert_eq!(q("1.5").as_integer(), None);
        assert_eq!(
            q("1E").add(q("1E")).and_then(Quantity::as_integer),
            Some(2 * 10i64.pow(18))
        );
        assert_eq!(q("10E").as_integer(), None, "beyond int64");
    }
}
