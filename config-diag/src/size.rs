//! Sizes in bytes, as people write them.

/// A size that [`parse_size`] rejects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No number where the size should start (`"x"`, `""`, `"k"`).
    #[error("`{text}` is not a size (use e.g. 4096, \"512KiB\", \"1GiB\")")]
    NotANumber {
        /// The text given.
        text: String,
    },
    /// A number followed by something that is not a unit.
    #[error("unknown size unit `{unit}` (use B, KiB, MiB, GiB or TiB)")]
    UnknownUnit {
        /// What followed the number.
        unit: String,
    },
    /// More bytes than 64 bits hold.
    #[error("size `{text}` overflows")]
    Overflow {
        /// The text given.
        text: String,
    },
}

/// Parses a size in bytes.
///
/// Grammar: optional blanks, decimal digits, optional blanks, an optional
/// unit, optional blanks. The unit is `B` (bytes) or one of `K`, `M`, `G`,
/// `T` (2^10, 2^20, 2^30, 2^40 bytes) optionally followed by `iB` or `B`,
/// all in any case: `4096`, `4k`, `128K`, `"512KiB"`, `"4 KiB"`, `1m`,
/// `"1MiB"`, `2G`, `"1gb"`, `1TiB`. Every unit is binary, `KB` included.
/// A size that does not fit in a `u64` is an error, not a wrapped value.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    if number.is_empty() {
        return Err(SizeError::NotANumber {
            text: text.to_owned(),
        });
    }
    let unit = unit.trim_start();
    let shift = unit_shift(unit).ok_or_else(|| SizeError::UnknownUnit {
        unit: unit.to_owned(),
    })?;
    let overflow = || SizeError::Overflow {
        text: text.to_owned(),
    };
    // Digits only, so the one error left is a number beyond u64.
    let n: u64 = number.parse().map_err(|_| overflow())?;
    n.checked_mul(1u64 << shift).ok_or_else(overflow)
}

/// Binary exponent of a unit (case-insensitive), `None` if it is none.
fn unit_shift(unit: &str) -> Option<u32> {
    let lower = unit.to_ascii_lowercase();
    if lower.is_empty() || lower == "b" {
        return Some(0);
    }
    let mut chars = lower.chars();
    let prefix = chars.next()?;
    if !matches!(chars.as_str(), "" | "b" | "ib") {
        return None;
    }
    match prefix {
        'k' => Some(10),
        'm' => Some(20),
        'g' => Some(30),
        't' => Some(40),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_binary_units_in_any_case() {
        for (text, bytes) in [
            // gimbal-target's config sizes.
            ("4096", 4096),
            ("512KiB", 512 << 10),
            ("1G", 1 << 30),
            ("256MiB", 256 << 20),
            ("1GiB", 1 << 30),
            ("2G", 2 << 30),
            // ublk-nvmf bench's --bs and --size.
            ("4k", 4096),
            ("128K", 131072),
            ("1MiB", 1 << 20),
            ("512", 512),
            // Bytes, blanks, and every spelling of a unit.
            ("0", 0),
            ("7B", 7),
            ("7 b", 7),
            (" 4 KiB ", 4096),
            ("4kb", 4096),
            ("4KB", 4096),
            ("4kib", 4096),
            ("4KIB", 4096),
            ("3m", 3 << 20),
            ("3g", 3 << 30),
            ("1t", 1 << 40),
            ("1TiB", 1 << 40),
            ("1tb", 1 << 40),
            ("16777215TiB", 16777215 << 40),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text:?}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_size() {
        for text in ["x", "", " ", "k", "KiB", "-1", "+1", "1.5G", "0x10"] {
            assert!(
                matches!(
                    parse_size(text),
                    Err(SizeError::NotANumber { .. } | SizeError::UnknownUnit { .. })
                ),
                "{text:?}: {:?}",
                parse_size(text)
            );
        }
        assert_eq!(
            parse_size("12 parsecs"),
            Err(SizeError::UnknownUnit {
                unit: "parsecs".into()
            })
        );
        for text in ["4iB", "4kk", "4kbit", "4 K i B", "4P"] {
            assert!(
                matches!(parse_size(text), Err(SizeError::UnknownUnit { .. })),
                "{text:?}"
            );
        }
    }

    #[test]
    fn overflow_is_an_error() {
        for text in [
            "99999999999TiB",
            "16777216TiB",
            "18446744073709551616",
            "99999999999999999999999",
        ] {
            assert!(
                matches!(parse_size(text), Err(SizeError::Overflow { .. })),
                "{text:?}"
            );
        }
        assert_eq!(
            parse_size("99999999999TiB").unwrap_err().to_string(),
            "size `99999999999TiB` overflows"
        );
    }

    #[test]
    fn messages_say_what_would_be_right() {
        let e = parse_size("x").unwrap_err().to_string();
        assert!(e.contains("is not a size"), "{e}");
        let e = parse_size("12 parsecs").unwrap_err().to_string();
        assert!(e.starts_with("unknown size unit `parsecs`"), "{e}");
    }
}
