//! Little-endian field access and string fields over fixed-size buffers.
//!
//! Callers check lengths once (usually by converting to `&[u8; N]`) and then
//! use constant offsets, so these helpers never see an out-of-range offset
//! coming from untrusted input.

use crate::error::ProtoError;

pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

pub(crate) fn get_u128(b: &[u8], off: usize) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    u128::from_le_bytes(a)
}

pub(crate) fn get_array<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[off..off + N]);
    a
}

pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u128(b: &mut [u8], off: usize, v: u128) {
    b[off..off + 16].copy_from_slice(&v.to_le_bytes());
}

/// Borrow the first `N` bytes of `b` as an array, or say the structure is truncated.
pub(crate) fn fixed<'a, const N: usize>(
    b: &'a [u8],
    structure: &'static str,
) -> Result<&'a [u8; N], ProtoError> {
    b.get(..N)
        .and_then(|s| s.try_into().ok())
        .ok_or(ProtoError::Truncated {
            structure,
            needed: N,
            actual: b.len(),
        })
}

/// Write an ASCII string field padded with spaces (SN, MN, FR, TRADDR, ...).
/// Longer input is cut at the field size: these are display strings.
pub(crate) fn put_space_padded(b: &mut [u8], off: usize, len: usize, s: &str) {
    let field = &mut b[off..off + len];
    field.fill(b' ');
    let n = s.len().min(len);
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Read a padded string field, dropping trailing spaces and NULs (peers differ:
/// the specification pads with spaces, Linux nvmet pads with NULs). Bytes that
/// are not UTF-8 are replaced rather than rejected: these fields are for
/// display and matching, and a bad byte must not make a whole page unreadable.
pub(crate) fn get_padded(b: &[u8], off: usize, len: usize) -> String {
    let field = &b[off..off + len];
    let end = field
        .iter()
        .rposition(|&c| c != b' ' && c != 0)
        .map_or(0, |p| p + 1);
    let field = &field[..end];
    // A NUL inside ends the string too (C peers write NUL-terminated strings).
    let field = match field.iter().position(|&c| c == 0) {
        Some(p) => &field[..p],
        None => field,
    };
    String::from_utf8_lossy(field).into_owned()
}

/// Write a NUL-terminated UTF-8 string field (NQNs), zero-filling the rest.
pub(crate) fn put_nul_terminated(
    b: &mut [u8],
    off: usize,
    len: usize,
    s: &str,
    what: &'static str,
) -> Result<(), ProtoError> {
    if s.len() >= len {
        return Err(ProtoError::Unencodable {
            what,
            reason: "string does not fit its field with the terminating NUL",
        });
    }
    if s.as_bytes().contains(&0) {
        return Err(ProtoError::Unencodable {
            what,
            reason: "string contains a NUL byte",
        });
    }
    let field = &mut b[off..off + len];
    field.fill(0);
    field[..s.len()].copy_from_slice(s.as_bytes());
    Ok(())
}

/// Read a NUL-terminated UTF-8 string field; a field without a NUL is invalid.
pub(crate) fn get_nul_terminated(
    b: &[u8],
    off: usize,
    len: usize,
    structure: &'static str,
    field: &'static str,
) -> Result<String, ProtoError> {
    let bytes = &b[off..off + len];
    let end = bytes
        .iter()
        .position(|&c| c == 0)
        .ok_or(ProtoError::InvalidField {
            structure,
            field,
            offset: off,
            reason: "no terminating NUL",
        })?;
    String::from_utf8(bytes[..end].to_vec()).map_err(|_| ProtoError::InvalidField {
        structure,
        field,
        offset: off,
        reason: "not UTF-8",
    })
}
