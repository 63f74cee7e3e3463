//! `DHHC-1` secret representation and key transformation.
//!
//! Vectors marked "nvme-cli" were printed by Debian's nvme-cli 2.3
//! (libnvme 1.3), `nvme gen-dhchap-key`, with the command line in the
//! comment; NQN below is the `--nqn` given. The tests do not need nvme-cli.
//! Vectors from `auth_kat_data.rs` come from `tests/auth_vectors.py`
//! (Python's base64/zlib/hmac), and were accepted by
//! `nvme check-dhchap-key`.

use nvmf_proto::auth::secret::SecretError;
use nvmf_proto::auth::{DhchapSecret, HashId, RandomError, RandomSource};
use proptest::prelude::*;

use crate::auth_kat_data as kat;
use crate::common::unhex;

const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";

/// `--secret=404142…5f` (32 bytes), `--secret=4041…6f` (48), `4041…7f` (64).
fn nvme_cli_secret(len: usize) -> Vec<u8> {
    (0..len).map(|i| 0x40 + i as u8).collect()
}

#[test]
fn nvme_cli_untransformed_keys() {
    // nvme gen-dhchap-key --secret=<32 bytes> --key-length=32 --hmac=0 --nqn=NQN
    let s =
        DhchapSecret::parse("DHHC-1:00:QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9YjiZe:").unwrap();
    assert_eq!(s.key(), nvme_cli_secret(32));
    assert_eq!(s.transform_hash(), None);
    // nvme gen-dhchap-key --secret=<64 bytes> --key-length=64 --hmac=0 --nqn=NQN
    let text = "DHHC-1:00:QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9gYWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+fx/Gj1o=:";
    let s = DhchapSecret::parse(text).unwrap();
    assert_eq!(s.key(), nvme_cli_secret(64));
    // The generator writes exactly what nvme-cli wrote.
    assert_eq!(&*s.to_representation(), text);
}

#[test]
fn nvme_cli_transformed_keys() {
    // With --hmac ≠ 0, nvme-cli prints HMAC(secret, NQN || "NVMe-over-Fabrics"),
    // i.e. the secret already transformed once; our transform reproduces it.
    for (hash, len, text) in [
        // nvme gen-dhchap-key --secret=<32 bytes> --key-length=32 --hmac=1 --nqn=NQN
        (HashId::Sha256, 32, "DHHC-1:01:0GUMxintlD+1ntU08h7zQX+9eM5PTH0Hf6y+psRsmsIZCqCa:"),
        // nvme gen-dhchap-key --secret=<48 bytes> --key-length=48 --hmac=2 --nqn=NQN
        (HashId::Sha384, 48, "DHHC-1:02:Ycyi6NFMdr7npRY/2yykR3R/KhI9ULQBfGnlfomr+vFYtK33xBjqCJHQautzrwpD6optSw==:"),
        // nvme gen-dhchap-key --secret=<64 bytes> --key-length=64 --hmac=3 --nqn=NQN
        (HashId::Sha512, 64, "DHHC-1:03:Qoq6/drUYfLy3/2xu6qlajZwNAtsqMvntNmp9QbyZIUQzELIaYuKn8p8aTgU821geq6vv75wSgLSqMZgn4n925MuYvo=:"),
    ] {
        let printed = DhchapSecret::parse(text).unwrap();
        assert_eq!(printed.transform_hash(), Some(hash));
        let raw = DhchapSecret::new(&nvme_cli_secret(len), Some(hash)).unwrap();
        let pre = raw.transform(NQN);
        assert_eq!(printed.key(), pre.as_bytes(), "{hash}");
        let rebuilt = DhchapSecret::new(pre.as_bytes(), Some(hash)).unwrap();
        assert_eq!(&*rebuilt.to_representation(), text);
    }
}

#[test]
fn nvme_cli_random_keys_parse() {
    for text in [
        // nvme gen-dhchap-key --hmac=1 --nqn=NQN (random)
        "DHHC-1:01:5NmdC6ei6ufThKzxcNLrVwG7B51dcFJp4loC4hNpFH00R4sa:",
        // nvme gen-dhchap-key --hmac=2 --nqn=NQN
        "DHHC-1:02:tGg4ICib06wXO06GouV3F8FBDjT/Dzsk4bEkXkhWG/mIfaRmtgoMusZbBarGLtNSjypqCw==:",
        // nvme gen-dhchap-key --hmac=3 --nqn=NQN
        "DHHC-1:03:bXryTEvIF/XvxEBJhLh+VoH1pupQhX+48mXlji1EwbnqPi2rk4WKkIhIhgYg3iGsZBU9EWhOrGwgQeshpfNDhJz6QVY=:",
        // nvme gen-dhchap-key --key-length=48 --nqn=NQN (hmac 0)
        "DHHC-1:00:WMVl8aE1YuyPG3ADGXaMMEV74lT3lXcJz+JaG79uhmmVcIIUUzc4/5ya8Z1NDx18J2AE5g==:",
    ] {
        let s = DhchapSecret::parse(text).unwrap();
        assert_eq!(&*s.to_representation(), text);
    }
}

#[test]
fn python_vectors_and_transforms() {
    for (text, key, transformed, hash) in [
        (
            kat::SECRET_0_32,
            kat::SECRET_0_32_KEY,
            kat::SECRET_0_32_TRANSFORMED,
            None,
        ),
        (
            kat::SECRET_0_48,
            kat::SECRET_0_48_KEY,
            kat::SECRET_0_48_TRANSFORMED,
            None,
        ),
        (
            kat::SECRET_0_64,
            kat::SECRET_0_64_KEY,
            kat::SECRET_0_64_TRANSFORMED,
            None,
        ),
        (
            kat::SECRET_1_32,
            kat::SECRET_1_32_KEY,
            kat::SECRET_1_32_TRANSFORMED,
            Some(HashId::Sha256),
        ),
        (
            kat::SECRET_2_48,
            kat::SECRET_2_48_KEY,
            kat::SECRET_2_48_TRANSFORMED,
            Some(HashId::Sha384),
        ),
        (
            kat::SECRET_3_64,
            kat::SECRET_3_64_KEY,
            kat::SECRET_3_64_TRANSFORMED,
            Some(HashId::Sha512),
        ),
    ] {
        let s = DhchapSecret::parse(text).unwrap();
        assert_eq!(s.key(), unhex(key));
        assert_eq!(s.transform_hash(), hash);
        assert_eq!(s.transform(kat::HOSTNQN).as_bytes(), unhex(transformed));
        assert_eq!(&*s.to_representation(), text);
    }
}

#[test]
fn lenient_where_linux_is() {
    let good = kat::SECRET_1_32;
    // Surrounding whitespace (configfs writes end in a newline), no final ':'.
    assert!(DhchapSecret::parse(&format!("  {good}\n")).is_ok());
    assert!(DhchapSecret::parse(good.strip_suffix(':').unwrap()).is_ok());
    // Padding may be omitted on input.
    let padded = kat::SECRET_0_48;
    assert!(padded.contains('='));
    assert!(DhchapSecret::parse(&padded.replace('=', "")).is_ok());
    // A key length that does not match its transform hash (Linux accepts it).
    let odd = DhchapSecret::new(&[7; 64], Some(HashId::Sha256)).unwrap();
    let again = DhchapSecret::parse(&odd.to_representation()).unwrap();
    assert_eq!(again.transform(NQN).as_bytes().len(), 32);
}

#[test]
fn rejections() {
    let good = kat::SECRET_1_32;
    let body = &good["DHHC-1:01:".len()..];
    let cases: Vec<(String, SecretError)> = vec![
        (String::new(), SecretError::Prefix),
        (good.replace("DHHC-1", "DHHC-2"), SecretError::Prefix),
        (good.to_lowercase(), SecretError::Prefix),
        (format!("DHHC-1:04:{body}"), SecretError::TransformHash),
        (format!("DHHC-1:1:{body}"), SecretError::TransformHash),
        (format!("DHHC-1:x1:{body}"), SecretError::TransformHash),
        (format!("DHHC-1:01{body}"), SecretError::TransformHash),
        (
            format!("DHHC-1:01:{}", body.replacen('A', "*", 1)),
            SecretError::Base64,
        ),
        (
            format!("DHHC-1:01:{}", body.replace(':', ":x")),
            SecretError::Base64,
        ),
        (
            format!("DHHC-1:01:{}", body.replacen('w', "=", 1)),
            SecretError::Base64,
        ),
        // 31-byte key + CRC = 35 bytes.
        (
            "DHHC-1:00:".to_string() + &b64(&[1; 35]) + ":",
            SecretError::Length(31),
        ),
        (
            "DHHC-1:00:".to_string() + &b64(&[1; 100]) + ":",
            SecretError::Length(98),
        ),
        (
            "DHHC-1:00:".to_string() + &b64(&[1; 4]) + ":",
            SecretError::Length(0),
        ),
        ("DHHC-1:00::".to_string(), SecretError::Length(0)),
    ];
    for (text, expected) in cases {
        assert_eq!(DhchapSecret::parse(&text).err(), Some(expected), "{text:?}");
    }
    // A flipped key bit breaks the CRC (`nvme check-dhchap-key` says "CRC
    // mismatch" for the same text).
    let mut key = unhex(kat::SECRET_1_32_KEY);
    let crc = crc32(&key);
    key[0] ^= 1;
    let mut raw = key.clone();
    raw.extend_from_slice(&crc.to_le_bytes());
    let text = format!("DHHC-1:01:{}:", b64(&raw));
    assert_eq!(DhchapSecret::parse(&text).err(), Some(SecretError::Crc));
}

#[test]
fn errors_and_debug_never_show_the_key() {
    let s = DhchapSecret::parse(kat::SECRET_3_64).unwrap();
    let shown = format!("{s:?} {:?}", s.transform(NQN));
    let body = &kat::SECRET_3_64["DHHC-1:03:".len()..kat::SECRET_3_64.len() - 1];
    assert!(!shown.contains(&body[..8]), "{shown}");
    assert!(
        !shown.to_lowercase().contains(&kat::SECRET_3_64_KEY[..8]),
        "{shown}"
    );
    assert!(shown.contains("redacted"));
    let mut bad = kat::SECRET_3_64.to_string();
    bad.replace_range(20..21, "!");
    let e = DhchapSecret::parse(&bad).unwrap_err().to_string();
    assert!(!e.contains(&body[..8]) && !e.contains('!'), "{e}");
}

struct Counter(u8);

impl RandomSource for Counter {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), RandomError> {
        for b in buf {
            self.0 = self.0.wrapping_add(1);
            *b = self.0;
        }
        Ok(())
    }
}

#[test]
fn generator() {
    for (hash, len) in [
        (None, 32),
        (None, 48),
        (None, 64),
        (Some(HashId::Sha256), 32),
        (Some(HashId::Sha384), 48),
        (Some(HashId::Sha512), 64),
    ] {
        let s = DhchapSecret::generate_with(hash, len, &mut Counter(0)).unwrap();
        assert_eq!(s.key(), (1..=len as u8).collect::<Vec<_>>());
        let text = s.to_representation();
        assert_eq!(DhchapSecret::parse(&text).unwrap(), s);
        let os = DhchapSecret::generate(hash, len).unwrap();
        assert_eq!(DhchapSecret::parse(&os.to_representation()).unwrap(), os);
    }
    // As nvme-cli: "Invalid key length 32 for SHA(512)".
    assert_eq!(
        DhchapSecret::generate(Some(HashId::Sha512), 32).err(),
        Some(SecretError::LengthForHash {
            len: 32,
            hash: HashId::Sha512
        })
    );
    assert_eq!(
        DhchapSecret::generate(None, 40).err(),
        Some(SecretError::Length(40))
    );
}

proptest! {
    #[test]
    fn parse_never_panics(s in ".{0,120}") {
        let _ = DhchapSecret::parse(&s);
    }

    #[test]
    fn parse_never_panics_near_valid(
        hash in 0u8..5, body in "[A-Za-z0-9+/=:]{0,100}", trail in prop::option::of(":"),
    ) {
        let text = format!("DHHC-1:{hash:02}:{body}{}", trail.as_deref().unwrap_or(""));
        let _ = DhchapSecret::parse(&text);
    }

    #[test]
    fn representation_round_trips(key in prop::sample::select(vec![32usize, 48, 64])
        .prop_flat_map(|n| prop::collection::vec(any::<u8>(), n)), t in 0u8..4) {
        let s = DhchapSecret::new(&key, HashId::from_id(t)).unwrap();
        prop_assert_eq!(DhchapSecret::parse(&s.to_representation()).unwrap(), s);
    }
}

/// Independent CRC-32 (IEEE, reflected 0xEDB88320), bit by bit.
fn crc32(b: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &x in b {
        crc ^= x as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Independent standard base64 with padding.
fn b64(b: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = chunk.len();
        let v = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= n {
                out.push(A[(v >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn reference_helpers_agree_with_python() {
    // base64 and CRC of the Python vector, recomputed here.
    let key = unhex(kat::SECRET_0_32_KEY);
    let mut raw = key.clone();
    raw.extend_from_slice(&crc32(&key).to_le_bytes());
    assert_eq!(format!("DHHC-1:00:{}:", b64(&raw)), kat::SECRET_0_32);
}
