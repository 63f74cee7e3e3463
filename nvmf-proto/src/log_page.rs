//! Log pages: Error Information (01h), SMART / Health (02h), the discovery
//! log (70h) and an opaque vendor page hook (C0h..FFh).
//!
//! A Get Log Page reads a window (offset, length) of a page. Targets build
//! the whole page and copy the requested window with [`copy_window`], which
//! writes into a caller-sized buffer so an untrusted NUMD never sizes an
//! allocation here.

use crate::error::ProtoError;
use crate::status::Status;
use crate::wire::{
    fixed, get_nul_terminated, get_padded, get_u128, get_u16, get_u32, get_u64, put_nul_terminated,
    put_space_padded, put_u128, put_u16, put_u32, put_u64,
};

/// Copy bytes `offset..offset + out.len()` of `page` into `out`, zero-filling
/// past the end of the page (reads beyond a log page return zeroes).
pub fn copy_window(page: &[u8], offset: u64, out: &mut [u8]) {
    out.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if let Some(src) = page.get(start..) {
        let n = src.len().min(out.len());
        out[..n].copy_from_slice(&src[..n]);
    }
}

/// Size of one Error Information log entry.
pub const ERROR_LOG_ENTRY_LEN: usize = 64;

/// One Error Information log entry (LID 01h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ErrorLogEntry {
    /// Error Count: unique, increasing; 0 marks an invalid entry (0..8).
    pub error_count: u64,
    /// Submission Queue ID (8..10).
    pub sqid: u16,
    /// Command ID (10..12).
    pub cid: u16,
    /// Status of the failed command (12..14; bit 0 is the phase tag, 0 here).
    pub status: Status,
    /// Parameter Error Location: byte in bits 7:0, bit in bits 10:8
    /// (14..16); FFFFh if not applicable.
    pub parameter_error_location: u16,
    /// First LBA that had the error (16..24).
    pub lba: u64,
    /// Namespace (24..28).
    pub nsid: u32,
    /// Vendor Specific Information Available: log page holding it (28).
    pub vendor_specific_log: u8,
    /// Transport Type (29), see [`trtype`].
    pub trtype: u8,
    /// Command Specific Information (32..40).
    pub command_specific: u64,
    /// Transport Type Specific Information (40..42).
    pub transport_specific: u16,
}

impl ErrorLogEntry {
    /// Encode to 64 bytes.
    pub fn to_bytes(&self) -> [u8; ERROR_LOG_ENTRY_LEN] {
        let mut b = [0u8; ERROR_LOG_ENTRY_LEN];
        put_u64(&mut b, 0, self.error_count);
        put_u16(&mut b, 8, self.sqid);
        put_u16(&mut b, 10, self.cid);
        put_u16(&mut b, 12, self.status.to_field());
        put_u16(&mut b, 14, self.parameter_error_location);
        put_u64(&mut b, 16, self.lba);
        put_u32(&mut b, 24, self.nsid);
        b[28] = self.vendor_specific_log;
        b[29] = self.trtype;
        put_u64(&mut b, 32, self.command_specific);
        put_u16(&mut b, 40, self.transport_specific);
        b
    }

    /// Decode from at least 64 bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let b = fixed::<ERROR_LOG_ENTRY_LEN>(b, "Error Information log entry")?;
        Ok(Self {
            error_count: get_u64(b, 0),
            sqid: get_u16(b, 8),
            cid: get_u16(b, 10),
            status: Status::from_field(get_u16(b, 12)),
            parameter_error_location: get_u16(b, 14),
            lba: get_u64(b, 16),
            nsid: get_u32(b, 24),
            vendor_specific_log: b[28],
            trtype: b[29],
            command_specific: get_u64(b, 32),
            transport_specific: get_u16(b, 40),
        })
    }
}

/// Size of the SMART / Health Information log.
pub const SMART_LOG_LEN: usize = 512;

/// SMART / Health Information log (LID 02h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SmartLog {
    /// Critical Warning bits (0).
    pub critical_warning: u8,
    /// Composite Temperature in kelvin (1..3).
    pub composite_temperature: u16,
    /// Available Spare, percent (3).
    pub available_spare: u8,
    /// Available Spare Threshold, percent (4).
    pub available_spare_threshold: u8,
    /// Percentage Used (5).
    pub percentage_used: u8,
    /// Endurance Group Critical Warning Summary (6).
    pub endurance_group_critical_warning: u8,
    /// Data Units Read, thousands of 512-byte units (32..48).
    pub data_units_read: u128,
    /// Data Units Written, thousands of 512-byte units (48..64).
    pub data_units_written: u128,
    /// Host Read Commands (64..80).
    pub host_read_commands: u128,
    /// Host Write Commands (80..96).
    pub host_write_commands: u128,
    /// Controller Busy Time, minutes (96..112).
    pub controller_busy_time: u128,
    /// Power Cycles (112..128).
    pub power_cycles: u128,
    /// Power On Hours (128..144).
    pub power_on_hours: u128,
    /// Unsafe Shutdowns (144..160).
    pub unsafe_shutdowns: u128,
    /// Media and Data Integrity Errors (160..176).
    pub media_errors: u128,
    /// Number of Error Information Log Entries (176..192).
    pub error_log_entries: u128,
    /// Warning Composite Temperature Time, minutes (192..196).
    pub warning_temperature_time: u32,
    /// Critical Composite Temperature Time, minutes (196..200).
    pub critical_temperature_time: u32,
    /// Temperature Sensors 1..8 in kelvin (200..216).
    pub temperature_sensors: [u16; 8],
}

impl SmartLog {
    /// Encode to 512 bytes.
    pub fn to_bytes(&self) -> [u8; SMART_LOG_LEN] {
        let mut b = [0u8; SMART_LOG_LEN];
        b[0] = self.critical_warning;
        put_u16(&mut b, 1, self.composite_temperature);
        b[3] = self.available_spare;
        b[4] = self.available_spare_threshold;
        b[5] = self.percentage_used;
        b[6] = self.endurance_group_critical_warning;
        let counters = self.counters();
        for (i, v) in counters.iter().enumerate() {
            put_u128(&mut b, 32 + 16 * i, *v);
        }
        put_u32(&mut b, 192, self.warning_temperature_time);
        put_u32(&mut b, 196, self.critical_temperature_time);
        for (i, t) in self.temperature_sensors.iter().enumerate() {
            put_u16(&mut b, 200 + 2 * i, *t);
        }
        b
    }

    fn counters(&self) -> [u128; 10] {
        [
            self.data_units_read,
            self.data_units_written,
            self.host_read_commands,
            self.host_write_commands,
            self.controller_busy_time,
            self.power_cycles,
            self.power_on_hours,
            self.unsafe_shutdowns,
            self.media_errors,
            self.error_log_entries,
        ]
    }

    /// Decode from at least 512 bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let b = fixed::<SMART_LOG_LEN>(b, "SMART / Health log")?;
        let c = |i: usize| get_u128(b, 32 + 16 * i);
        let mut temperature_sensors = [0u16; 8];
        for (i, t) in temperature_sensors.iter_mut().enumerate() {
            *t = get_u16(b, 200 + 2 * i);
        }
        Ok(Self {
            critical_warning: b[0],
            composite_temperature: get_u16(b, 1),
            available_spare: b[3],
            available_spare_threshold: b[4],
            percentage_used: b[5],
            endurance_group_critical_warning: b[6],
            data_units_read: c(0),
            data_units_written: c(1),
            host_read_commands: c(2),
            host_write_commands: c(3),
            controller_busy_time: c(4),
            power_cycles: c(5),
            power_on_hours: c(6),
            unsafe_shutdowns: c(7),
            media_errors: c(8),
            error_log_entries: c(9),
            warning_temperature_time: get_u32(b, 192),
            critical_temperature_time: get_u32(b, 196),
            temperature_sensors,
        })
    }
}

/// Transport types (TRTYPE).
pub mod trtype {
    /// RDMA.
    pub const RDMA: u8 = 1;
    /// Fibre Channel.
    pub const FC: u8 = 2;
    /// TCP.
    pub const TCP: u8 = 3;
    /// Intra-host (loop).
    pub const INTRA_HOST: u8 = 254;
}

/// Address families (ADRFAM).
pub mod adrfam {
    /// IPv4.
    pub const IPV4: u8 = 1;
    /// IPv6.
    pub const IPV6: u8 = 2;
    /// InfiniBand.
    pub const IB: u8 = 3;
    /// Fibre Channel.
    pub const FC: u8 = 4;
    /// Intra-host.
    pub const INTRA_HOST: u8 = 254;
}

/// Subsystem types (SUBTYPE) of a discovery log entry.
pub mod subtype {
    /// Referral to another discovery service.
    pub const DISCOVERY_REFERRAL: u8 = 1;
    /// An NVM subsystem (I/O controllers).
    pub const NVME: u8 = 2;
    /// The current discovery subsystem.
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// Transport Requirements (TREQ) bits.
pub mod treq {
    /// Bits 1:0 = 00b: secure channel not specified.
    pub const SECURE_CHANNEL_NOT_SPECIFIED: u8 = 0;
    /// Bits 1:0 = 01b: secure channel required.
    pub const SECURE_CHANNEL_REQUIRED: u8 = 1;
    /// Bits 1:0 = 10b: secure channel not required.
    pub const SECURE_CHANNEL_NOT_REQUIRED: u8 = 2;
    /// Bit 2: the port supports disabling SQ flow control.
    pub const DISABLE_SQ_FLOW_CONTROL: u8 = 1 << 2;
}

/// TCP Security Type (TSAS byte 0 for TRTYPE TCP).
pub mod tcp_sectype {
    /// No security.
    pub const NONE: u8 = 0;
    /// TLS 1.2.
    pub const TLS_1_2: u8 = 1;
    /// TLS 1.3.
    pub const TLS_1_3: u8 = 2;
}

/// Size of the discovery log header and of each entry.
pub const DISCOVERY_RECORD_LEN: usize = 1024;

/// One discovery log entry (1024 bytes).
///
/// Layout: TRTYPE (0), ADRFAM (1), SUBTYPE (2), TREQ (3), PORTID (4..6),
/// CNTLID (6..8), ASQSZ (8..10), EFLAGS (10..12), TRSVCID (32..64, ASCII,
/// space padded), SUBNQN (256..512, NUL terminated), TRADDR (512..768,
/// ASCII, space padded), TSAS (768..1024). Only TSAS byte 0 (the TCP
/// security type) is kept: this crate speaks NVMe/TCP only.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DiscoveryLogEntry {
    /// Transport type, see [`trtype`].
    pub trtype: u8,
    /// Address family, see [`adrfam`].
    pub adrfam: u8,
    /// Subsystem type, see [`subtype`].
    pub subtype: u8,
    /// Transport requirements, see [`treq`].
    pub treq: u8,
    /// NVM subsystem port ID.
    pub portid: u16,
    /// Controller ID (FFFFh: dynamic).
    pub cntlid: u16,
    /// Admin max SQ size.
    pub asqsz: u16,
    /// Entry flags.
    pub eflags: u16,
    /// Transport service identifier (the TCP port, in decimal).
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Transport address (the IP address, as text).
    pub traddr: String,
    /// TSAS byte 0: TCP security type, see [`tcp_sectype`].
    pub tcp_sectype: u8,
}

impl DiscoveryLogEntry {
    fn write(&self, b: &mut [u8]) -> Result<(), ProtoError> {
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        put_u16(b, 4, self.portid);
        put_u16(b, 6, self.cntlid);
        put_u16(b, 8, self.asqsz);
        put_u16(b, 10, self.eflags);
        put_space_padded(b, 32, 32, &self.trsvcid);
        put_nul_terminated(b, 256, 256, &self.subnqn, "discovery SUBNQN")?;
        put_space_padded(b, 512, 256, &self.traddr);
        b[768] = self.tcp_sectype;
        Ok(())
    }

    /// Encode to 1024 bytes.
    pub fn to_bytes(&self) -> Result<Box<[u8; DISCOVERY_RECORD_LEN]>, ProtoError> {
        let mut b = Box::new([0u8; DISCOVERY_RECORD_LEN]);
        self.write(&mut b[..])?;
        Ok(b)
    }

    /// Decode from at least 1024 bytes. TRSVCID and TRADDR lose trailing
    /// spaces or NULs (peers use either); SUBNQN must be NUL terminated.
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let b = fixed::<DISCOVERY_RECORD_LEN>(b, "discovery log entry")?;
        Ok(Self {
            trtype: b[0],
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: get_u16(b, 4),
            cntlid: get_u16(b, 6),
            asqsz: get_u16(b, 8),
            eflags: get_u16(b, 10),
            trsvcid: get_padded(b, 32, 32),
            subnqn: get_nul_terminated(b, 256, 256, "discovery log entry", "SUBNQN")?,
            traddr: get_padded(b, 512, 256),
            tcp_sectype: b[768],
        })
    }
}

/// The discovery log header's counters (first 18 bytes of the page):
/// GENCTR (0..8), NUMREC (8..16), RECFMT (16..18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DiscoveryLogHeader {
    /// Generation counter: changes whenever the page changes.
    pub genctr: u64,
    /// Number of records (entries) in the page.
    pub numrec: u64,
    /// Record format (0).
    pub recfmt: u16,
}

impl DiscoveryLogHeader {
    /// Decode from at least 18 bytes (a host may read just the header).
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let b = fixed::<18>(b, "discovery log header")?;
        Ok(Self {
            genctr: get_u64(b, 0),
            numrec: get_u64(b, 8),
            recfmt: get_u16(b, 16),
        })
    }

    /// Bytes of the full page with this many records, if that fits a `u64`.
    pub fn page_len(&self) -> Option<u64> {
        self.numrec
            .checked_add(1)?
            .checked_mul(DISCOVERY_RECORD_LEN as u64)
    }
}

/// The whole discovery log page (LID 70h): a 1024-byte header then one
/// 1024-byte record per entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DiscoveryLogPage {
    /// Generation counter.
    pub genctr: u64,
    /// Record format (0).
    pub recfmt: u16,
    /// The entries; NUMREC is their count.
    pub entries: Vec<DiscoveryLogEntry>,
}

impl DiscoveryLogPage {
    /// Encode the whole page.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ProtoError> {
        let mut b = vec![0u8; DISCOVERY_RECORD_LEN * (1 + self.entries.len())];
        put_u64(&mut b, 0, self.genctr);
        put_u64(&mut b, 8, self.entries.len() as u64);
        put_u16(&mut b, 16, self.recfmt);
        for (e, chunk) in self
            .entries
            .iter()
            .zip(b[DISCOVERY_RECORD_LEN..].chunks_exact_mut(DISCOVERY_RECORD_LEN))
        {
            e.write(chunk)?;
        }
        Ok(b)
    }

    /// Decode a whole page. NUMREC entries must be present; NUMREC is
    /// untrusted, so it is checked against the buffer before anything is
    /// allocated for it.
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let header = DiscoveryLogHeader::from_bytes(b)?;
        let available = (b.len() / DISCOVERY_RECORD_LEN).saturating_sub(1) as u64;
        if header.numrec > available {
            return Err(ProtoError::Truncated {
                structure: "discovery log page",
                needed: header
                    .page_len()
                    .and_then(|n| usize::try_from(n).ok())
                    .unwrap_or(usize::MAX),
                actual: b.len(),
            });
        }
        // A header-only read (NUMREC 0) may be shorter than 1024 bytes.
        let records = b.get(DISCOVERY_RECORD_LEN..).unwrap_or_default();
        let entries = records
            .chunks_exact(DISCOVERY_RECORD_LEN)
            .take(header.numrec as usize)
            .map(DiscoveryLogEntry::from_bytes)
            .collect::<Result<_, _>>()?;
        Ok(Self {
            genctr: header.genctr,
            recfmt: header.recfmt,
            entries,
        })
    }
}

/// An opaque vendor specific log page (LID C0h..FFh). The content of the
/// Gimbal virtual view page ([`crate::command::log_id::GIMBAL_VIRTUAL_VIEW`])
/// is defined elsewhere; this only carries it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VendorLogPage {
    lid: u8,
    data: Vec<u8>,
}

impl VendorLogPage {
    /// A page with identifier `lid` (must be in C0h..=FFh) and content `data`.
    pub fn new(lid: u8, data: Vec<u8>) -> Result<Self, ProtoError> {
        if lid < 0xC0 {
            return Err(ProtoError::Unencodable {
                what: "vendor log page",
                reason: "vendor specific log page identifiers are C0h..FFh",
            });
        }
        Ok(Self { lid, data })
    }

    /// The log page identifier.
    pub fn lid(&self) -> u8 {
        self.lid
    }

    /// The page content.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Copy the window a Get Log Page asked for, see [`copy_window`].
    pub fn read(&self, offset: u64, out: &mut [u8]) {
        copy_window(&self.data, offset, out);
    }
}

/// Length of the Gimbal virtual view page (LID C0h).
pub const GIMBAL_VIEW_LEN: usize = 512;
/// Layout version of the Gimbal virtual view page.
pub const GIMBAL_VIEW_VERSION: u32 = 1;

/// The Gimbal virtual view of one namespace's device (§3.7 of the Gimbal
/// paper), as log page C0h carries it, for the namespace named in the Get
/// Log Page NSID and the tenant (host) that asks.
///
/// Layout, little endian: version (0..4), congestion state (4: 0
/// under-utilized, 1 congestion avoidance, 2 congested, 3 overloaded, FFh
/// no switch on this namespace), reserved (5..8), target rate B/s (8..16),
/// read headroom B/s (16..24), write headroom B/s (24..32), write cost ×
/// 1000 (32..40), read latency EWMA ns (40..48, 0 = none yet), write latency
/// EWMA ns (48..56), read threshold ns (56..64), write threshold ns
/// (64..72), allotted slots per tenant (72..76), the caller's credit
/// (76..80), requests in flight at the device (80..84), requests queued at
/// the switch (84..88), time of the snapshot in ns since the target started
/// (88..96); reserved to 512.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GimbalViewPage {
    /// Congestion state code (see the type documentation).
    pub congestion_state: u8,
    /// Target submission rate, bytes per second.
    pub target_rate_bps: u64,
    /// Read headroom, bytes per second.
    pub read_headroom_bps: u64,
    /// Write headroom, bytes per second.
    pub write_headroom_bps: u64,
    /// Write cost in thousandths (a cost of 9.0 is 9000).
    pub write_cost_milli: u64,
    /// Read latency EWMA in ns, 0 if none yet.
    pub read_latency_ewma_ns: u64,
    /// Write latency EWMA in ns, 0 if none yet.
    pub write_latency_ewma_ns: u64,
    /// Dynamic read latency threshold, ns.
    pub read_threshold_ns: u64,
    /// Dynamic write latency threshold, ns.
    pub write_threshold_ns: u64,
    /// Virtual slots each contending tenant may hold.
    pub allotted_slots: u32,
    /// The asking tenant's credit.
    pub credit: u32,
    /// Requests at the device.
    pub in_flight: u32,
    /// Requests queued at the switch.
    pub queued: u32,
    /// When the snapshot was taken, ns since the target started.
    pub at_ns: u64,
}

impl GimbalViewPage {
    /// Congestion state value meaning "no switch runs on this namespace".
    pub const NO_SWITCH: u8 = 0xFF;

    /// Encode to [`GIMBAL_VIEW_LEN`] bytes.
    pub fn to_bytes(&self) -> [u8; GIMBAL_VIEW_LEN] {
        let mut b = [0u8; GIMBAL_VIEW_LEN];
        put_u32(&mut b, 0, GIMBAL_VIEW_VERSION);
        b[4] = self.congestion_state;
        put_u64(&mut b, 8, self.target_rate_bps);
        put_u64(&mut b, 16, self.read_headroom_bps);
        put_u64(&mut b, 24, self.write_headroom_bps);
        put_u64(&mut b, 32, self.write_cost_milli);
        put_u64(&mut b, 40, self.read_latency_ewma_ns);
        put_u64(&mut b, 48, self.write_latency_ewma_ns);
        put_u64(&mut b, 56, self.read_threshold_ns);
        put_u64(&mut b, 64, self.write_threshold_ns);
        put_u32(&mut b, 72, self.allotted_slots);
        put_u32(&mut b, 76, self.credit);
        put_u32(&mut b, 80, self.in_flight);
        put_u32(&mut b, 84, self.queued);
        put_u64(&mut b, 88, self.at_ns);
        b
    }

    /// Decode; fails on a short page or an unknown version.
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let b = crate::wire::fixed::<GIMBAL_VIEW_LEN>(b, "Gimbal view page")?;
        if get_u32(b, 0) != GIMBAL_VIEW_VERSION {
            return Err(ProtoError::InvalidField {
                structure: "Gimbal view page",
                field: "version",
                offset: 0,
                reason: "unknown layout version",
            });
        }
        Ok(Self {
            congestion_state: b[4],
            target_rate_bps: get_u64(b, 8),
            read_headroom_bps: get_u64(b, 16),
            write_headroom_bps: get_u64(b, 24),
            write_cost_milli: get_u64(b, 32),
            read_latency_ewma_ns: get_u64(b, 40),
            write_latency_ewma_ns: get_u64(b, 48),
            read_threshold_ns: get_u64(b, 56),
            write_threshold_ns: get_u64(b, 64),
            allotted_slots: get_u32(b, 72),
            credit: get_u32(b, 76),
            in_flight: get_u32(b, 80),
            queued: get_u32(b, 84),
            at_ns: get_u64(b, 88),
        })
    }
}

#[cfg(test)]
mod gimbal_view_tests {
    use super::*;

    #[test]
    fn gimbal_view_round_trips_at_its_offsets() {
        let v = GimbalViewPage {
            congestion_state: 2,
            target_rate_bps: 1 << 30,
            write_cost_milli: 9000,
            credit: 24,
            at_ns: 77,
            ..Default::default()
        };
        let b = v.to_bytes();
        assert_eq!(&b[0..4], &[1, 0, 0, 0]);
        assert_eq!(b[4], 2);
        assert_eq!(&b[76..80], &[24, 0, 0, 0]);
        assert_eq!(GimbalViewPage::from_bytes(&b).unwrap(), v);
        let mut bad = b;
        bad[0] = 9;
        assert!(GimbalViewPage::from_bytes(&bad).is_err());
        assert!(GimbalViewPage::from_bytes(&b[..100]).is_err());
    }
}
