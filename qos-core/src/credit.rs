//! End-to-end credits on the wire (Gimbal §3.6, Algorithm 3).
//!
//! A Gimbal target reports a tenant's credit total in completion dword 1
//! (reserved in the base NVMe specification) with bit 31 set as a validity
//! mark; DW1 = 0 (or bit 31 clear) carries no credit, which is what plain
//! NVMe targets send. A credit is a count of I/Os regardless of size that
//! the device can take for this tenant without hurting QoS: allotted virtual
//! slots × I/O count of the tenant's latest completed slot (computed by
//! [`crate::scheduler::VirtualSlotScheduler::credit`]).

/// Bit 31 of completion dword 1: set when the dword carries a credit.
pub const CREDIT_VALID_BIT: u32 = 1 << 31;

/// Largest credit that fits next to the validity bit.
pub const CREDIT_FIELD_MAX: u32 = CREDIT_VALID_BIT - 1;

/// Completion dword 1 carrying `credit` (clamped to 31 bits).
pub const fn encode_credit_dw1(credit: u32) -> u32 {
    let credit = if credit > CREDIT_FIELD_MAX {
        CREDIT_FIELD_MAX
    } else {
        credit
    };
    CREDIT_VALID_BIT | credit
}

/// The credit carried by completion dword 1, or `None` when bit 31 is
/// clear (a plain target, or a completion without a credit).
pub const fn decode_credit_dw1(dw1: u32) -> Option<u32> {
    if dw1 & CREDIT_VALID_BIT != 0 {
        Some(dw1 & CREDIT_FIELD_MAX)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_validity() {
        assert_eq!(decode_credit_dw1(encode_credit_dw1(0)), Some(0));
        assert_eq!(decode_credit_dw1(encode_credit_dw1(256)), Some(256));
        assert_eq!(
            decode_credit_dw1(encode_credit_dw1(u32::MAX)),
            Some(CREDIT_FIELD_MAX)
        );
        assert_eq!(decode_credit_dw1(0), None);
        assert_eq!(decode_credit_dw1(256), None);
        assert_eq!(encode_credit_dw1(8), 0x8000_0008);
    }
}
