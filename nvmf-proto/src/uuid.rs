//! UUIDs as NVMe over Fabrics uses them: the 16-byte host identifier of
//! Connect (and `/etc/nvme/hostid`), and the tail of a
//! `nqn.2014-08.org.nvmexpress:uuid:...` host NQN.

/// Formats 16 bytes as a lowercase UUID with dashes
/// (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`), bytes in order.
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Parses a UUID: 32 hex digits in either case, dashes anywhere or
/// nowhere, surrounding blanks ignored (a file's trailing newline).
/// `None` for anything else.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, out) in bytes.iter_mut().enumerate() {
        *out = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 16] = [
        0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0x4d, 0xef, 0x80, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06,
        0xff,
    ];

    #[test]
    fn formats_with_dashes_in_lowercase() {
        assert_eq!(format_uuid(&BYTES), "12345678-9abc-4def-8001-0203040506ff");
        assert_eq!(
            format_uuid(&[0; 16]),
            "00000000-0000-0000-0000-000000000000"
        );
    }

    #[test]
    fn parses_what_it_formats_and_other_spellings() {
        assert_eq!(parse_uuid(&format_uuid(&BYTES)), Some(BYTES));
        assert_eq!(
            parse_uuid("123456789ABC4DEF80010203040506FF\n"),
            Some(BYTES)
        );
        assert_eq!(
            parse_uuid(" 12345678-9abc-4def-8001-0203040506ff "),
            Some(BYTES)
        );
    }

    #[test]
    fn rejects_what_is_not_a_uuid() {
        for text in [
            "",
            "12345678-9abc-4def-8001-0203040506f",
            "12345678-9abc-4def-8001-0203040506fff",
            "12345678-9abc-4def-8001-0203040506fg",
            "é2345678-9abc-4def-8001-0203040506f",
        ] {
            assert_eq!(parse_uuid(text), None, "{text:?}");
        }
    }
}
