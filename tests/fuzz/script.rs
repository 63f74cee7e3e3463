//! What both fuzz drivers (gimbal-target's whole connection, the
//! initiator's queue core) read a script with, their step tracing, and
//! how their `cargo test` twins make seeded scripts.
//! Included by path (`#[path]`) from each crate's `fuzz/fuzz_support.rs`:
//! each fuzz crate is a workspace of its own, so a shared crate would need
//! a path dependency from both for these few lines.

// ---- tracing ----------------------------------------------------------------

/// `FUZZ_TRACE=1`: print every step of a script (to see what a failing
/// script does).
pub fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FUZZ_TRACE").is_some_and(|v| v == "1"))
}

/// `eprintln!` when [`tracing`] is on.
macro_rules! trace {
    ($($arg:tt)*) => {
        if tracing() {
            eprintln!($($arg)*);
        }
    };
}

// ---- reading the script ---------------------------------------------------

/// The script's bytes, read front to back; past the end every read is 0.
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    /// A script over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | u32::from(self.u16()) << 16
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }

    /// 0..n (n ≥ 1).
    pub fn below(&mut self, n: u64) -> u64 {
        if n <= 256 {
            u64::from(self.u8()) % n
        } else {
            u64::from(self.u32()) % n
        }
    }

    /// True with probability `n`/256.
    pub fn chance(&mut self, n: u8) -> bool {
        self.u8() < n
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }

    /// `n` bytes: from the script as far as it goes, then a pattern seeded
    /// by the script (cheap filler for long payloads).
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let direct = n.min(64);
        let mut v: Vec<u8> = (0..direct).map(|_| self.u8()).collect();
        let mut x = self.u32() | 1;
        v.extend((direct..n).map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        }));
        v
    }
}

// ---- seeded scripts (the cargo-test twins) --------------------------------

/// splitmix64: one seed, one stream of script bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The script for `seed`: `min` to `min + spread - 1` bytes, all from the
/// seed, so a failing seed replays exactly.
pub fn seeded_script(seed: u64, min: usize, spread: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let len = min + (rng.next() % spread) as usize;
    (0..len).map(|_| rng.next() as u8).collect()
}

/// An environment variable as a number, decimal or `0x` hex.
pub fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}
