//! Finite field Diffie-Hellman over the RFC 7919 groups (ffdhe2048 …
//! ffdhe8192, generator 2), as DH-HMAC-CHAP uses them.
//!
//! Arithmetic is `crypto-bigint`'s boxed Montgomery form: the
//! exponentiation is constant-time in the exponent (a fixed 4-bit window
//! over every bit of the exponent's fixed width), which matters because
//! the exponent is the private key. The peer's public value is validated
//! (1 < y < p − 1) with ordinary comparisons: it is public.
//!
//! Private keys are N random bits, N being what Linux's
//! `dh_safe_prime_gen_privkey` uses: the next power of two at or above
//! twice the group's security strength — 256 bits for ffdhe2048 (strength
//! 112) and ffdhe3072 (128), 512 bits for ffdhe4096 (152), ffdhe6144 (176)
//! and ffdhe8192 (200). Linux reduces N + 64 random bits modulo 2^N − 1
//! and adds one; drawing N bits and rejecting zero gives the same range
//! [1, 2^N − 1] uniformly.
//!
//! Public values and the shared value are written big-endian, padded to the
//! prime's size, as Linux's `mpi_write_to_sgl` pads them; the padded
//! shared value is what gets hashed into the augmented challenge.

use std::sync::OnceLock;

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use zeroize::{Zeroize, Zeroizing};

use crate::auth::{DhGroup, RandomError, RandomSource, SessionKey};

/// Why a Diffie-Hellman value or key is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    /// The null group has no Diffie-Hellman values.
    #[error("the null DH group has no DH values")]
    NullGroup,
    /// The value is empty.
    #[error("empty DH value")]
    Empty,
    /// The value is longer than the group's prime.
    #[error("DH value longer than the group's prime")]
    TooLong,
    /// The value is not in 2 ..= p − 2 (or a private key is zero).
    #[error("DH value out of range (must be 1 < y < p - 1)")]
    OutOfRange,
}

/// Private key length in bits for `group` (see the module documentation);
/// 0 for the null group.
pub const fn private_key_bits(group: DhGroup) -> usize {
    match group {
        DhGroup::Null => 0,
        DhGroup::Ffdhe2048 | DhGroup::Ffdhe3072 => 256,
        DhGroup::Ffdhe4096 | DhGroup::Ffdhe6144 | DhGroup::Ffdhe8192 => 512,
    }
}

/// A group's prime and precomputed Montgomery parameters.
struct Group {
    p_bytes: Vec<u8>,
    p_minus_1: BoxedUint,
    bits: u32,
    params: BoxedMontyParams,
}

fn group(g: DhGroup) -> Result<&'static Group, DhError> {
    static GROUPS: [OnceLock<Group>; 5] = [const { OnceLock::new() }; 5];
    let (slot, hex) = match g {
        DhGroup::Null => return Err(DhError::NullGroup),
        DhGroup::Ffdhe2048 => (&GROUPS[0], FFDHE2048_P),
        DhGroup::Ffdhe3072 => (&GROUPS[1], FFDHE3072_P),
        DhGroup::Ffdhe4096 => (&GROUPS[2], FFDHE4096_P),
        DhGroup::Ffdhe6144 => (&GROUPS[3], FFDHE6144_P),
        DhGroup::Ffdhe8192 => (&GROUPS[4], FFDHE8192_P),
    };
    Ok(slot.get_or_init(|| {
        let p_bytes = hex_to_bytes(hex);
        assert_eq!(p_bytes.len(), g.value_len(), "prime constant size");
        let bits = (p_bytes.len() * 8) as u32;
        let p = BoxedUint::from_be_slice(&p_bytes, bits).expect("prime fits its size");
        let p_minus_1 = p.wrapping_sub(&BoxedUint::one_with_precision(bits));
        let odd = Odd::new(p).expect("safe primes are odd");
        // The modulus is public: the variable-time setup is fine.
        let params = BoxedMontyParams::new_vartime(odd);
        Group {
            p_bytes,
            p_minus_1,
            bits,
            params,
        }
    }))
}

/// The group's prime p, big-endian (`None` for the null group).
pub fn prime(g: DhGroup) -> Option<&'static [u8]> {
    group(g).ok().map(|g| g.p_bytes.as_slice())
}

/// Check a peer's public value: 1 ..= the prime's size bytes, and
/// 1 < y < p − 1 as an integer (leading zero bytes allowed).
pub fn validate_public_value(g: DhGroup, y: &[u8]) -> Result<(), DhError> {
    parse_public(group(g)?, y).map(|_| ())
}

fn parse_public(grp: &Group, y: &[u8]) -> Result<BoxedUint, DhError> {
    if y.is_empty() {
        return Err(DhError::Empty);
    }
    if y.len() > grp.p_bytes.len() {
        return Err(DhError::TooLong);
    }
    let v = BoxedUint::from_be_slice(y, grp.bits).map_err(|_| DhError::TooLong)?;
    let one = BoxedUint::one_with_precision(grp.bits);
    // Public value: variable-time comparisons are fine.
    if v <= one || v >= grp.p_minus_1 {
        return Err(DhError::OutOfRange);
    }
    Ok(v)
}

/// `base^x mod p`, big-endian, padded to the prime's size.
fn modexp(grp: &Group, base: BoxedUint, x: &BoxedUint) -> Zeroizing<Vec<u8>> {
    let m = BoxedMontyForm::new(base, grp.params.clone());
    let mut r = m.pow(x).retrieve();
    let mut bytes = r.to_be_bytes();
    r.zeroize();
    // `to_be_bytes` writes whole limbs; every prime size is a multiple of
    // the limb size, so this is exactly the prime's size.
    let out = Zeroizing::new(bytes[bytes.len() - grp.p_bytes.len()..].to_vec());
    bytes.zeroize();
    out
}

/// An ephemeral Diffie-Hellman private key for one transaction. Zeroized
/// on drop; `Debug` does not print it.
pub struct DhPrivateKey {
    group: DhGroup,
    x: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for DhPrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhPrivateKey")
            .field("group", &self.group)
            .field("x", &"<redacted>")
            .finish()
    }
}

impl DhPrivateKey {
    /// A random key of [`private_key_bits`] bits, nonzero.
    pub fn generate(g: DhGroup, rng: &mut dyn RandomSource) -> Result<Self, DhKeyError> {
        group(g)?;
        let mut x = Zeroizing::new(vec![0u8; private_key_bits(g) / 8]);
        loop {
            rng.fill(&mut x)?;
            if x.iter().any(|&b| b != 0) {
                return Ok(Self { group: g, x });
            }
        }
    }

    /// A key from big-endian bytes (tests, known-answer vectors): nonzero,
    /// at most the prime's size.
    pub fn from_be_bytes(g: DhGroup, x: &[u8]) -> Result<Self, DhError> {
        let grp = group(g)?;
        if x.len() > grp.p_bytes.len() {
            return Err(DhError::TooLong);
        }
        if x.iter().all(|&b| b == 0) {
            return Err(DhError::OutOfRange);
        }
        Ok(Self {
            group: g,
            x: Zeroizing::new(x.to_vec()),
        })
    }

    /// The group.
    pub fn group(&self) -> DhGroup {
        self.group
    }

    fn exponent(&self) -> BoxedUint {
        // The width is fixed by the key's byte length, not its value, so
        // the exponentiation's time does not depend on the key.
        let bits = (self.x.len() * 8).next_multiple_of(64) as u32;
        BoxedUint::from_be_slice(&self.x, bits).expect("width covers the bytes")
    }

    /// The public value g^x mod p, big-endian, the prime's size.
    pub fn public_value(&self) -> Vec<u8> {
        let grp = group(self.group).expect("key has a real group");
        let mut x = self.exponent();
        let two = BoxedUint::from_be_slice(&[2], grp.bits).expect("2 fits");
        let mut out = modexp(grp, two, &x);
        x.zeroize();
        std::mem::take(&mut *out)
    }

    /// The shared value (peer)^x mod p, after validating the peer's value.
    pub fn shared_secret(&self, peer: &[u8]) -> Result<SessionKey, DhError> {
        let grp = group(self.group)?;
        let y = parse_public(grp, peer)?;
        let mut x = self.exponent();
        let out = modexp(grp, y, &x);
        x.zeroize();
        Ok(SessionKey::new(out))
    }
}

/// Why a private key could not be generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DhKeyError {
    /// The group has no keys (null).
    #[error(transparent)]
    Group(#[from] DhError),
    /// The random source failed.
    #[error(transparent)]
    Random(#[from] RandomError),
}

fn hex_to_bytes(hex: &str) -> Vec<u8> {
    let nibble = |c: u8| match c {
        b'0'..=b'9' => c - b'0',
        b'A'..=b'F' => c - b'A' + 10,
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("prime constants are hex"),
    };
    hex.as_bytes()
        .chunks_exact(2)
        .map(|p| nibble(p[0]) << 4 | nibble(p[1]))
        .collect()
}

// The primes, p = 2^b − 2^(b−64) + (⌊2^(b−130) e⌋ + X) · 2^64 − 1 (RFC 7919,
// appendix A), computed from that formula by `tests/auth_vectors.py`; the
// tests check each constant's SHA-256 against the script's output, its
// fixed top and bottom 64 bits, p ≡ 7 (mod 8), and 2^((p−1)/2) ≡ 1 (mod p).
/// RFC 7919 ffdhe2048 prime, big-endian hex.
const FFDHE2048_P: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B423861285C97FFFFFFFFFFFFFFFF",
);

/// RFC 7919 ffdhe3072 prime, big-endian hex.
const FFDHE3072_P: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B66C62E37FFFFFFFFFFFFFFFF",
);

/// RFC 7919 ffdhe4096 prime, big-endian hex.
const FFDHE4096_P: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E655F6AFFFFFFFFFFFFFFFF",
);

/// RFC 7919 ffdhe6144 prime, big-endian hex.
const FFDHE6144_P: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E0DD9020BFD64B645036C7A",
    "4E677D2C38532A3A23BA4442CAF53EA63BB454329B7624C8917BDD64B1C0FD4C",
    "B38E8C334C701C3ACDAD0657FCCFEC719B1F5C3E4E46041F388147FB4CFDB477",
    "A52471F7A9A96910B855322EDB6340D8A00EF092350511E30ABEC1FFF9E3A26E",
    "7FB29F8C183023C3587E38DA0077D9B4763E4E4B94B2BBC194C6651E77CAF992",
    "EEAAC0232A281BF6B3A739C1226116820AE8DB5847A67CBEF9C9091B462D538C",
    "D72B03746AE77F5E62292C311562A846505DC82DB854338AE49F5235C95B9117",
    "8CCF2DD5CACEF403EC9D1810C6272B045B3B71F9DC6B80D63FDD4A8E9ADB1E69",
    "62A69526D43161C1A41D570D7938DAD4A40E329CD0E40E65FFFFFFFFFFFFFFFF",
);

/// RFC 7919 ffdhe8192 prime, big-endian hex.
const FFDHE8192_P: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E0DD9020BFD64B645036C7A",
    "4E677D2C38532A3A23BA4442CAF53EA63BB454329B7624C8917BDD64B1C0FD4C",
    "B38E8C334C701C3ACDAD0657FCCFEC719B1F5C3E4E46041F388147FB4CFDB477",
    "A52471F7A9A96910B855322EDB6340D8A00EF092350511E30ABEC1FFF9E3A26E",
    "7FB29F8C183023C3587E38DA0077D9B4763E4E4B94B2BBC194C6651E77CAF992",
    "EEAAC0232A281BF6B3A739C1226116820AE8DB5847A67CBEF9C9091B462D538C",
    "D72B03746AE77F5E62292C311562A846505DC82DB854338AE49F5235C95B9117",
    "8CCF2DD5CACEF403EC9D1810C6272B045B3B71F9DC6B80D63FDD4A8E9ADB1E69",
    "62A69526D43161C1A41D570D7938DAD4A40E329CCFF46AAA36AD004CF600C838",
    "1E425A31D951AE64FDB23FCEC9509D43687FEB69EDD1CC5E0B8CC3BDF64B10EF",
    "86B63142A3AB8829555B2F747C932665CB2C0F1CC01BD70229388839D2AF05E4",
    "54504AC78B7582822846C0BA35C35F5C59160CC046FD8251541FC68C9C86B022",
    "BB7099876A460E7451A8A93109703FEE1C217E6C3826E52C51AA691E0E423CFC",
    "99E9E31650C1217B624816CDAD9A95F9D5B8019488D9C0A0A1FE3075A577E231",
    "83F81D4A3F2FA4571EFC8CE0BA8A4FE8B6855DFE72B0A66EDED2FBABFBE58A30",
    "FAFABE1C5D71A87E2F741EF8C1FE86FEA6BBFDE530677F0D97D11D49F7A8443D",
    "0822E506A9F4614E011E2A94838FF88CD68C8BB7C5C6424CFFFFFFFFFFFFFFFF",
);
