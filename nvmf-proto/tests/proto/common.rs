//! Helpers shared by the test modules.

use nvmf_proto::{Decoded, DecoderConfig, Pdu, PduDecoder, ProtoError, Role};

/// Parse a commented hex listing: one or more bytes per line, `//` starts a
/// comment, `XX*N` repeats byte XX N times (N decimal).
pub fn hex(listing: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for line in listing.lines() {
        let code = line.split("//").next().unwrap_or("");
        for tok in code.split_whitespace() {
            let (byte, count) = match tok.split_once('*') {
                Some((b, n)) => (b, n.parse::<usize>().expect("repeat count")),
                None => (tok, 1),
            };
            let v = u8::from_str_radix(byte, 16).expect("hex byte");
            out.extend(std::iter::repeat_n(v, count));
        }
    }
    out
}

/// Bit-by-bit CRC32C (Castagnoli, reflected polynomial 82F63B78h), written
/// independently of the crate so digests in vectors are checked against a
/// second implementation.
pub fn reference_crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Decode exactly one PDU that must fill `bytes`.
pub fn decode_one(cfg: DecoderConfig, bytes: &[u8]) -> Result<Pdu<'_>, ProtoError> {
    match PduDecoder::new(cfg).decode(bytes)? {
        Decoded::Pdu { pdu, consumed } => {
            assert_eq!(consumed, bytes.len(), "PDU did not fill the input");
            Ok(pdu)
        }
        Decoded::NeedMore(n) => panic!("decoder wants {n} more bytes"),
    }
}

/// A decoder configuration for `role` with the given digests and PDA.
pub fn cfg(role: Role, header_digest: bool, data_digest: bool, rx_pda: u8) -> DecoderConfig {
    DecoderConfig {
        role,
        header_digest,
        data_digest,
        rx_pda,
        max_data_len: 1 << 20,
    }
}

#[test]
fn reference_crc_matches_the_standard_check_value() {
    assert_eq!(reference_crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(nvmf_proto::pdu::crc32c(b"123456789"), 0xE306_9283);
}

/// Parse contiguous hex (the generated known-answer constants).
pub fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex byte"))
        .collect()
}
