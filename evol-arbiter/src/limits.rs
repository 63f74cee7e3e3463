//! The budgets every peer-chosen length and count is checked against.
//! A request over one is refused with a message naming the limit; none
//! of these is a tuning knob, they bound what one client can make the
//! arbiter allocate or hold.

/// Largest gRPC message decoded (tonic's `max_decoding_message_size`):
/// a full ReportIo batch is about 4096 × 40 bytes, far below.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Longest name (eVol, namespace, target, client): names are etcd key
/// components and metric labels.
pub const MAX_NAME_LEN: usize = 64;

/// Longest address or NQN (NVMe's NQN limit is 223 bytes).
pub const MAX_ADDRESS_LEN: usize = 223;

/// Most I/O vectors in one ReportIo (the view controller's default
/// `max_batch`; the configured one may be smaller).
pub const MAX_REPORT_BATCH: usize = 4096;

/// Most namespaces in one RequestSlices or ReleaseSlices.
pub const MAX_SLICE_NAMESPACES: usize = 64;

/// Longest RequestSlices wait, milliseconds.
pub const MAX_SLICE_WAIT_MS: u32 = 1000;

/// Most subscriptions in one Subscribe.
pub const MAX_SUBSCRIPTIONS: usize = 16;

/// Most Subscribe streams open at once.
pub const MAX_SUBSCRIBERS: usize = 256;

/// Most sessions (client, eVol, target port) the view and the auction
/// track.
pub const MAX_SESSIONS: usize = 16_384;

/// Most copies per extent.
pub const MAX_COPIES: u32 = 8;

/// Undelivered grants kept per flow (a client that asks and never
/// collects does not grow the arbiter's memory).
pub const MAX_PENDING_GRANTS: usize = 16;

/// Most I/Os one aggregated `IoVector` may sum (a client reports per
/// size class per interval; 2^24 is ~16 M I/Os, far above a second of
/// any drive's IOPS). Only sums, never allocations, depend on it.
pub const MAX_VECTOR_COUNT: u64 = 1 << 24;

/// Most slices one RequestSlices asks per namespace (a flow's grant
/// mailbox holds [`MAX_PENDING_GRANTS`]).
pub const MAX_SLICES_PER_REQUEST: u32 = MAX_PENDING_GRANTS as u32;

/// Whether `name` is a valid name (eVol, namespace, target, client):
/// 1 to [`MAX_NAME_LEN`] characters of `[A-Za-z0-9_.-]`, so that it is one
/// etcd key component. `Err` says why not.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what}: empty name"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{what}: name of {} bytes is over the limit of {MAX_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "{what}: `{name}` has {c:?}; names are [A-Za-z0-9_.-]"
        ));
    }
    Ok(())
}

/// Whether `s` (an address or NQN) is within [`MAX_ADDRESS_LEN`] and not
/// empty.
pub fn check_text(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("{what}: empty"));
    }
    if s.len() > MAX_ADDRESS_LEN {
        return Err(format!(
            "{what}: {} bytes is over the limit of {MAX_ADDRESS_LEN}",
            s.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_key_components() {
        assert!(check_name("evol", "vol-1.a_b").is_ok());
        assert!(check_name("evol", "").is_err());
        assert!(check_name("evol", "a/b").unwrap_err().contains("'/'"));
        assert!(check_name("evol", &"x".repeat(65))
            .unwrap_err()
            .contains("limit of 64"));
    }
}
