//! Feature values for Set/Get Features and the Asynchronous Event completion.
//!
//! The features here travel in CDW11 of Set Features and come back in CQE
//! DW0 of Get Features (Number of Queues also in Set Features' DW0).

/// Feature identifiers (Set/Get Features CDW10 bits 7:0).
pub mod feature_id {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIGURATION: u8 = 0x0B;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0F;
    /// Host Identifier.
    pub const HOST_IDENTIFIER: u8 = 0x81;
    /// Reservation Notification Mask (namespace specific).
    pub const RESERVATION_NOTIFICATION_MASK: u8 = 0x82;
    /// Reservation Persistence (namespace specific).
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
}

/// Host Identifier (FID 81h): CDW11 bit 0 (EXHID) asks for the 128-bit
/// identifier, which travels as 16 bytes of data.
pub const HOST_IDENTIFIER_EXHID: u32 = 1 << 0;
/// Bytes of an extended (128-bit) Host Identifier.
pub const HOST_IDENTIFIER_LEN: usize = 16;

/// Reservation Notification Mask (FID 82h): which reservation
/// notifications the controller does not log (a set bit masks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReservationNotificationMask {
    /// Mask Registration Preempted notifications (bit 1).
    pub registration_preempted: bool,
    /// Mask Reservation Released notifications (bit 2).
    pub reservation_released: bool,
    /// Mask Reservation Preempted notifications (bit 3).
    pub reservation_preempted: bool,
}

impl ReservationNotificationMask {
    /// The bits this feature defines; others are reserved.
    pub const DEFINED: u32 = 0b1110;

    /// CDW11 / DW0 value.
    pub const fn to_dword(&self) -> u32 {
        (self.registration_preempted as u32) << 1
            | (self.reservation_released as u32) << 2
            | (self.reservation_preempted as u32) << 3
    }

    /// From CDW11 / DW0 (reserved bits ignored).
    pub const fn from_dword(v: u32) -> Self {
        Self {
            registration_preempted: v & (1 << 1) != 0,
            reservation_released: v & (1 << 2) != 0,
            reservation_preempted: v & (1 << 3) != 0,
        }
    }

    /// Whether notifications of `log_type` (see
    /// [`crate::reservation::notification_type`]) are masked.
    pub const fn masks(&self, log_type: u8) -> bool {
        use crate::reservation::notification_type as t;
        match log_type {
            t::REGISTRATION_PREEMPTED => self.registration_preempted,
            t::RESERVATION_RELEASED => self.reservation_released,
            t::RESERVATION_PREEMPTED => self.reservation_preempted,
            _ => false,
        }
    }
}

/// Reservation Persistence (FID 83h): CDW11 / DW0 bit 0 is PTPL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReservationPersistence {
    /// Persist Through Power Loss.
    pub ptpl: bool,
}

impl ReservationPersistence {
    /// CDW11 / DW0 value.
    pub const fn to_dword(&self) -> u32 {
        self.ptpl as u32
    }

    /// From CDW11 / DW0.
    pub const fn from_dword(v: u32) -> Self {
        Self { ptpl: v & 1 != 0 }
    }
}

/// Number of Queues (FID 07h). Counts are 0's based; the controller answers
/// with how many it allocated, in the same layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NumberOfQueues {
    /// I/O submission queues, 0's based (bits 15:0: NSQR / NSQA).
    pub nsq: u16,
    /// I/O completion queues, 0's based (bits 31:16: NCQR / NCQA).
    pub ncq: u16,
}

impl NumberOfQueues {
    /// Ask for `count` (≥ 1) submission and completion queues.
    pub const fn with_count(count: u16) -> Self {
        let n = count.saturating_sub(1);
        Self { nsq: n, ncq: n }
    }

    /// CDW11 / DW0 value.
    pub const fn to_dword(&self) -> u32 {
        self.nsq as u32 | (self.ncq as u32) << 16
    }

    /// From CDW11 / DW0.
    pub const fn from_dword(v: u32) -> Self {
        Self {
            nsq: v as u16,
            ncq: (v >> 16) as u16,
        }
    }

    /// Number of queue pairs usable: min of both, 1-based.
    pub const fn queue_pairs(&self) -> u32 {
        let n = if self.nsq < self.ncq {
            self.nsq
        } else {
            self.ncq
        };
        n as u32 + 1
    }
}

/// Keep Alive Timer (FID 0Fh): KATO in milliseconds in CDW11.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KeepAliveTimer {
    /// Keep alive timeout in milliseconds (0 disables it).
    pub kato_ms: u32,
}

impl KeepAliveTimer {
    /// CDW11 / DW0 value.
    pub const fn to_dword(&self) -> u32 {
        self.kato_ms
    }

    /// From CDW11 / DW0.
    pub const fn from_dword(v: u32) -> Self {
        Self { kato_ms: v }
    }
}

/// Arbitration (FID 01h): weights for weighted round robin with urgent
/// priority class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Arbitration {
    /// Arbitration Burst (bits 2:0): up to 2^AB commands taken from one
    /// queue at a time; 111b means no limit.
    pub burst: u8,
    /// Low Priority Weight, 0's based (bits 15:8).
    pub low_weight: u8,
    /// Medium Priority Weight, 0's based (bits 23:16).
    pub medium_weight: u8,
    /// High Priority Weight, 0's based (bits 31:24).
    pub high_weight: u8,
}

impl Arbitration {
    /// AB value meaning no burst limit.
    pub const BURST_UNLIMITED: u8 = 0b111;

    /// CDW11 / DW0 value.
    pub const fn to_dword(&self) -> u32 {
        (self.burst & 0x7) as u32
            | (self.low_weight as u32) << 8
            | (self.medium_weight as u32) << 16
            | (self.high_weight as u32) << 24
    }

    /// From CDW11 / DW0.
    pub const fn from_dword(v: u32) -> Self {
        Self {
            burst: (v & 0x7) as u8,
            low_weight: (v >> 8) as u8,
            medium_weight: (v >> 16) as u8,
            high_weight: (v >> 24) as u8,
        }
    }
}

/// Asynchronous event types (AER completion DW0 bits 2:0).
pub mod async_event_type {
    /// Error status.
    pub const ERROR: u8 = 0;
    /// SMART / health status.
    pub const SMART_HEALTH: u8 = 1;
    /// Notice.
    pub const NOTICE: u8 = 2;
    /// I/O command set specific status.
    pub const IO_COMMAND_SET: u8 = 6;
    /// Vendor specific.
    pub const VENDOR_SPECIFIC: u8 = 7;
}

/// Notice event information values (type [`async_event_type::NOTICE`]).
pub mod notice {
    /// Namespace Attribute Changed.
    pub const NAMESPACE_ATTRIBUTE_CHANGED: u8 = 0x00;
    /// Firmware Activation Starting.
    pub const FIRMWARE_ACTIVATION_STARTING: u8 = 0x01;
    /// Asymmetric Namespace Access Change.
    pub const ANA_CHANGE: u8 = 0x03;
    /// Discovery Log Page Change.
    pub const DISCOVERY_LOG_CHANGED: u8 = 0xF0;
}

/// I/O command set specific event information values (type
/// [`async_event_type::IO_COMMAND_SET`]).
pub mod io_command_set_event {
    /// Reservation Log Page Available (log page 80h).
    pub const RESERVATION_LOG_PAGE_AVAILABLE: u8 = 0x00;
}

/// The completion of an Asynchronous Event Request (CQE DW0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AsyncEvent {
    /// Event type (bits 2:0), see [`async_event_type`].
    pub event_type: u8,
    /// Event information (bits 15:8), e.g. [`notice`] values.
    pub event_info: u8,
    /// Log page to read to clear the event (bits 23:16).
    pub log_page_id: u8,
}

impl AsyncEvent {
    /// CQE DW0 value.
    pub const fn to_dw0(&self) -> u32 {
        (self.event_type & 0x7) as u32
            | (self.event_info as u32) << 8
            | (self.log_page_id as u32) << 16
    }

    /// From CQE DW0.
    pub const fn from_dw0(v: u32) -> Self {
        Self {
            event_type: (v & 0x7) as u8,
            event_info: (v >> 8) as u8,
            log_page_id: (v >> 16) as u8,
        }
    }
}
