//! Typed views of admin and NVM I/O commands.
//!
//! Each typed command converts to an [`Sqe`] (`to_sqe(cid)`) and back
//! (`from_sqe`). `from_sqe` reads only the fields the command defines;
//! reserved fields are ignored, as receivers should. [`AdminCommand::parse`]
//! and [`IoCommand::parse`] dispatch on the opcode so a target can `match`.

use crate::error::ProtoError;
use crate::fabrics::FabricsCommand;
use crate::sqe::{admin_opcode, io_opcode, SglDescriptor, Sqe};

/// Identify CNS values.
pub mod cns {
    /// Identify Namespace data structure for NSID.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list (NSIDs greater than NSID).
    pub const ACTIVE_NAMESPACE_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list for NSID.
    pub const NAMESPACE_ID_DESCRIPTORS: u8 = 0x03;
}

/// Log page identifiers.
pub mod log_id {
    /// Error Information.
    pub const ERROR_INFORMATION: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART_HEALTH: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NAMESPACE_LIST: u8 = 0x04;
    /// Commands Supported and Effects.
    pub const COMMANDS_SUPPORTED_AND_EFFECTS: u8 = 0x05;
    /// Reservation Notification (one notification per read).
    pub const RESERVATION_NOTIFICATION: u8 = 0x80;
    /// Discovery log (discovery controllers only).
    pub const DISCOVERY: u8 = 0x70;
    /// Vendor specific page reserved for the Gimbal virtual view (read-only
    /// switch state: headroom, write cost, congestion, credits).
    pub const GIMBAL_VIRTUAL_VIEW: u8 = 0xC0;
}

/// Identify (admin opcode 06h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identify {
    /// Namespace (for namespace CNS values).
    pub nsid: u32,
    /// Controller or Namespace Structure (CDW10 bits 7:0), see [`cns`].
    pub cns: u8,
    /// Controller identifier (CDW10 bits 31:16).
    pub cntid: u16,
    /// CNS specific identifier (CDW11 bits 15:0).
    pub cns_specific_id: u16,
    /// Command Set Identifier (CDW11 bits 31:24).
    pub csi: u8,
    /// Where the 4096-byte result goes.
    pub sgl: SglDescriptor,
}

/// Size of every Identify data structure.
pub const IDENTIFY_DATA_LEN: usize = 4096;

impl Identify {
    /// Identify `cns` for `nsid`, result transferred by C2HData.
    pub const fn new(cns: u8, nsid: u32) -> Self {
        Self {
            nsid,
            cns,
            cntid: 0,
            cns_specific_id: 0,
            csi: 0,
            sgl: SglDescriptor::transport(IDENTIFY_DATA_LEN as u32),
        }
    }

    /// The SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin_opcode::IDENTIFY, cid);
        s.nsid = self.nsid;
        s.dptr = self.sgl;
        s.cdw10 = self.cns as u32 | (self.cntid as u32) << 16;
        s.cdw11 = self.cns_specific_id as u32 | (self.csi as u32) << 24;
        s
    }

    /// Read from an SQE with opcode 06h.
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_opcode(s, admin_opcode::IDENTIFY, "Identify")?;
        Ok(Self {
            nsid: s.nsid,
            cns: s.cdw10 as u8,
            cntid: (s.cdw10 >> 16) as u16,
            cns_specific_id: s.cdw11 as u16,
            csi: (s.cdw11 >> 24) as u8,
            sgl: s.dptr,
        })
    }
}

/// Get Log Page (admin opcode 02h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GetLogPage {
    /// Namespace (FFFFFFFFh or 0 for controller-wide pages).
    pub nsid: u32,
    /// Log page identifier (CDW10 bits 7:0), see [`log_id`].
    pub lid: u8,
    /// Log specific field (CDW10 bits 14:8).
    pub lsp: u8,
    /// Retain Asynchronous Event (CDW10 bit 15).
    pub rae: bool,
    /// Number of dwords to return, 0's based (NUMDU:NUMDL, CDW11 15:0 and
    /// CDW10 31:16).
    pub numd: u32,
    /// Log specific identifier (CDW11 bits 31:16).
    pub lsi: u16,
    /// Byte offset into the page (CDW13:CDW12).
    pub offset: u64,
    /// UUID index (CDW14 bits 6:0).
    pub uuid_index: u8,
    /// Offset Type (CDW14 bit 23): offset is an index of entries, not bytes.
    pub offset_is_index: bool,
    /// Command Set Identifier (CDW14 bits 31:24).
    pub csi: u8,
    /// Where the data goes.
    pub sgl: SglDescriptor,
}

impl GetLogPage {
    /// Read `len` bytes (a non-zero multiple of 4) of page `lid` from byte
    /// `offset`, data by C2HData.
    pub fn new(lid: u8, nsid: u32, len: u32, offset: u64) -> Result<Self, ProtoError> {
        if len == 0 || len % 4 != 0 {
            return Err(ProtoError::Unencodable {
                what: "Get Log Page",
                reason: "length must be a non-zero multiple of 4",
            });
        }
        Ok(Self {
            nsid,
            lid,
            lsp: 0,
            rae: false,
            numd: len / 4 - 1,
            lsi: 0,
            offset,
            uuid_index: 0,
            offset_is_index: false,
            csi: 0,
            sgl: SglDescriptor::transport(len),
        })
    }

    /// Bytes requested: (NUMD + 1) * 4.
    pub const fn data_len(&self) -> u64 {
        (self.numd as u64 + 1) * 4
    }

    /// The SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin_opcode::GET_LOG_PAGE, cid);
        s.nsid = self.nsid;
        s.dptr = self.sgl;
        s.cdw10 = self.lid as u32
            | ((self.lsp & 0x7F) as u32) << 8
            | (self.rae as u32) << 15
            | (self.numd & 0xFFFF) << 16;
        s.cdw11 = (self.numd >> 16) | (self.lsi as u32) << 16;
        s.cdw12 = self.offset as u32;
        s.cdw13 = (self.offset >> 32) as u32;
        s.cdw14 = (self.uuid_index & 0x7F) as u32
            | (self.offset_is_index as u32) << 23
            | (self.csi as u32) << 24;
        s
    }

    /// Read from an SQE with opcode 02h.
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_opcode(s, admin_opcode::GET_LOG_PAGE, "Get Log Page")?;
        Ok(Self {
            nsid: s.nsid,
            lid: s.cdw10 as u8,
            lsp: ((s.cdw10 >> 8) & 0x7F) as u8,
            rae: s.cdw10 & (1 << 15) != 0,
            numd: (s.cdw10 >> 16) | (s.cdw11 & 0xFFFF) << 16,
            lsi: (s.cdw11 >> 16) as u16,
            offset: s.cdw12 as u64 | (s.cdw13 as u64) << 32,
            uuid_index: (s.cdw14 & 0x7F) as u8,
            offset_is_index: s.cdw14 & (1 << 23) != 0,
            csi: (s.cdw14 >> 24) as u8,
            sgl: s.dptr,
        })
    }
}

/// Set Features (admin opcode 09h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SetFeatures {
    /// Namespace (for namespace-specific features).
    pub nsid: u32,
    /// Feature identifier (CDW10 bits 7:0), see [`crate::features::feature_id`].
    pub fid: u8,
    /// Save across power cycles (CDW10 bit 31).
    pub save: bool,
    /// Feature specific CDW11 (e.g. [`crate::features::NumberOfQueues`]).
    pub cdw11: u32,
    /// Feature specific CDW12.
    pub cdw12: u32,
    /// Data for features that carry a data structure.
    pub sgl: SglDescriptor,
}

impl SetFeatures {
    /// Set feature `fid` to `cdw11`, no data.
    pub const fn new(fid: u8, cdw11: u32) -> Self {
        Self {
            nsid: 0,
            fid,
            save: false,
            cdw11,
            cdw12: 0,
            sgl: SglDescriptor::null(),
        }
    }

    /// The SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin_opcode::SET_FEATURES, cid);
        s.nsid = self.nsid;
        s.dptr = self.sgl;
        s.cdw10 = self.fid as u32 | (self.save as u32) << 31;
        s.cdw11 = self.cdw11;
        s.cdw12 = self.cdw12;
        s
    }

    /// Read from an SQE with opcode 09h.
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_opcode(s, admin_opcode::SET_FEATURES, "Set Features")?;
        Ok(Self {
            nsid: s.nsid,
            fid: s.cdw10 as u8,
            save: s.cdw10 & (1 << 31) != 0,
            cdw11: s.cdw11,
            cdw12: s.cdw12,
            sgl: s.dptr,
        })
    }
}

/// Get Features SEL values (CDW10 bits 10:8).
pub mod feature_select {
    /// Current value.
    pub const CURRENT: u8 = 0;
    /// Default value.
    pub const DEFAULT: u8 = 1;
    /// Saved value.
    pub const SAVED: u8 = 2;
    /// Supported capabilities.
    pub const SUPPORTED_CAPABILITIES: u8 = 3;
}

/// Get Features (admin opcode 0Ah). The value comes back in CQE DW0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GetFeatures {
    /// Namespace (for namespace-specific features).
    pub nsid: u32,
    /// Feature identifier (CDW10 bits 7:0).
    pub fid: u8,
    /// Select (CDW10 bits 10:8), see [`feature_select`].
    pub select: u8,
    /// Feature specific CDW11.
    pub cdw11: u32,
    /// Data for features that return a data structure.
    pub sgl: SglDescriptor,
}

impl GetFeatures {
    /// Get the current value of feature `fid`.
    pub const fn new(fid: u8) -> Self {
        Self {
            nsid: 0,
            fid,
            select: feature_select::CURRENT,
            cdw11: 0,
            sgl: SglDescriptor::null(),
        }
    }

    /// The SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin_opcode::GET_FEATURES, cid);
        s.nsid = self.nsid;
        s.dptr = self.sgl;
        s.cdw10 = self.fid as u32 | ((self.select & 0x7) as u32) << 8;
        s.cdw11 = self.cdw11;
        s
    }

    /// Read from an SQE with opcode 0Ah.
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_opcode(s, admin_opcode::GET_FEATURES, "Get Features")?;
        Ok(Self {
            nsid: s.nsid,
            fid: s.cdw10 as u8,
            select: ((s.cdw10 >> 8) & 0x7) as u8,
            cdw11: s.cdw11,
            sgl: s.dptr,
        })
    }
}

/// An admin queue command, by opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdminCommand {
    /// Identify.
    Identify(Identify),
    /// Get Log Page.
    GetLogPage(GetLogPage),
    /// Set Features.
    SetFeatures(SetFeatures),
    /// Get Features.
    GetFeatures(GetFeatures),
    /// Keep Alive (no fields).
    KeepAlive,
    /// Asynchronous Event Request (no fields; completes when an event occurs).
    AsyncEventRequest,
    /// A Fabrics command.
    Fabrics(FabricsCommand),
    /// Any other opcode; the target answers Invalid Command Opcode.
    Other(Sqe),
}

impl AdminCommand {
    /// Dispatch an admin SQE on its opcode.
    pub fn parse(s: &Sqe) -> Result<Self, ProtoError> {
        Ok(match s.opcode {
            admin_opcode::IDENTIFY => Self::Identify(Identify::from_sqe(s)?),
            admin_opcode::GET_LOG_PAGE => Self::GetLogPage(GetLogPage::from_sqe(s)?),
            admin_opcode::SET_FEATURES => Self::SetFeatures(SetFeatures::from_sqe(s)?),
            admin_opcode::GET_FEATURES => Self::GetFeatures(GetFeatures::from_sqe(s)?),
            admin_opcode::KEEP_ALIVE => Self::KeepAlive,
            admin_opcode::ASYNC_EVENT_REQUEST => Self::AsyncEventRequest,
            admin_opcode::FABRICS => Self::Fabrics(FabricsCommand::parse(s)?),
            _ => Self::Other(*s),
        })
    }

    /// The SQE for this command with `cid` (for `Other`, its own SQE with
    /// `cid` replaced).
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        match self {
            Self::Identify(c) => c.to_sqe(cid),
            Self::GetLogPage(c) => c.to_sqe(cid),
            Self::SetFeatures(c) => c.to_sqe(cid),
            Self::GetFeatures(c) => c.to_sqe(cid),
            Self::KeepAlive => Sqe::new(admin_opcode::KEEP_ALIVE, cid),
            Self::AsyncEventRequest => Sqe::new(admin_opcode::ASYNC_EVENT_REQUEST, cid),
            Self::Fabrics(c) => c.to_sqe(cid),
            Self::Other(s) => Sqe { cid, ..*s },
        }
    }
}

/// Read and Write (I/O opcodes 02h and 01h) share one layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadWrite {
    /// Namespace.
    pub nsid: u32,
    /// Starting LBA (CDW11:CDW10).
    pub slba: u64,
    /// Number of logical blocks, 0's based (CDW12 bits 15:0); see
    /// [`ReadWrite::block_count`].
    pub nlb: u16,
    /// Directive type (CDW12 bits 23:20).
    pub dtype: u8,
    /// Protection information field (CDW12 bits 29:26).
    pub prinfo: u8,
    /// Force Unit Access (CDW12 bit 30).
    pub fua: bool,
    /// Limited Retry (CDW12 bit 31).
    pub limited_retry: bool,
    /// Dataset management hints (CDW13 bits 7:0).
    pub dsm: u8,
    /// Directive specific (CDW13 bits 31:16).
    pub dspec: u16,
    /// Where the data is.
    pub sgl: SglDescriptor,
}

impl ReadWrite {
    /// `block_count` blocks (1..=65536) from `slba`, data described by `sgl`.
    pub fn new(
        nsid: u32,
        slba: u64,
        block_count: u32,
        sgl: SglDescriptor,
    ) -> Result<Self, ProtoError> {
        let nlb = block_count
            .checked_sub(1)
            .and_then(|n| u16::try_from(n).ok())
            .ok_or(ProtoError::Unencodable {
                what: "Read/Write",
                reason: "block count must be 1..=65536",
            })?;
        Ok(Self {
            nsid,
            slba,
            nlb,
            dtype: 0,
            prinfo: 0,
            fua: false,
            limited_retry: false,
            dsm: 0,
            dspec: 0,
            sgl,
        })
    }

    /// Number of blocks (NLB + 1).
    pub const fn block_count(&self) -> u32 {
        self.nlb as u32 + 1
    }

    fn to_sqe(self, opcode: u8, cid: u16) -> Sqe {
        let mut s = Sqe::new(opcode, cid);
        s.nsid = self.nsid;
        s.dptr = self.sgl;
        s.cdw10 = self.slba as u32;
        s.cdw11 = (self.slba >> 32) as u32;
        s.cdw12 = self.nlb as u32
            | ((self.dtype & 0xF) as u32) << 20
            | ((self.prinfo & 0xF) as u32) << 26
            | (self.fua as u32) << 30
            | (self.limited_retry as u32) << 31;
        s.cdw13 = self.dsm as u32 | (self.dspec as u32) << 16;
        s
    }

    fn from_sqe(s: &Sqe) -> Self {
        Self {
            nsid: s.nsid,
            slba: s.cdw10 as u64 | (s.cdw11 as u64) << 32,
            nlb: s.cdw12 as u16,
            dtype: ((s.cdw12 >> 20) & 0xF) as u8,
            prinfo: ((s.cdw12 >> 26) & 0xF) as u8,
            fua: s.cdw12 & (1 << 30) != 0,
            limited_retry: s.cdw12 & (1 << 31) != 0,
            dsm: s.cdw13 as u8,
            dspec: (s.cdw13 >> 16) as u16,
            sgl: s.dptr,
        }
    }
}

/// Write Zeroes (I/O opcode 08h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WriteZeroes {
    /// Namespace.
    pub nsid: u32,
    /// Starting LBA (CDW11:CDW10).
    pub slba: u64,
    /// Number of logical blocks, 0's based (CDW12 bits 15:0).
    pub nlb: u16,
    /// Deallocate the blocks if the namespace can (CDW12 bit 25).
    pub deallocate: bool,
    /// Force Unit Access (CDW12 bit 30).
    pub fua: bool,
    /// Limited Retry (CDW12 bit 31).
    pub limited_retry: bool,
}

impl WriteZeroes {
    /// Number of blocks (NLB + 1).
    pub const fn block_count(&self) -> u32 {
        self.nlb as u32 + 1
    }
}

/// Dataset Management attribute bits (CDW11).
pub mod dsm_attr {
    /// Integral Dataset for Read.
    pub const IDR: u32 = 1 << 0;
    /// Integral Dataset for Write.
    pub const IDW: u32 = 1 << 1;
    /// Deallocate (discard/trim).
    pub const DEALLOCATE: u32 = 1 << 2;
}

/// Size of one Dataset Management range entry.
pub const DSM_RANGE_LEN: usize = 16;
/// Most ranges one Dataset Management command carries.
pub const DSM_MAX_RANGES: usize = 256;

/// Dataset Management (I/O opcode 09h); the ranges travel as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatasetManagement {
    /// Namespace.
    pub nsid: u32,
    /// Number of ranges, 0's based (CDW10 bits 7:0).
    pub nr: u8,
    /// Attributes (CDW11), see [`dsm_attr`].
    pub attributes: u32,
    /// Where the range list is (16 bytes per range).
    pub sgl: SglDescriptor,
}

impl DatasetManagement {
    /// Number of ranges (NR + 1).
    pub const fn range_count(&self) -> usize {
        self.nr as usize + 1
    }

    /// Whether the Deallocate attribute is set.
    pub const fn deallocate(&self) -> bool {
        self.attributes & dsm_attr::DEALLOCATE != 0
    }
}

/// One Dataset Management range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DsmRange {
    /// Context attributes (bytes 0..4).
    pub context_attributes: u32,
    /// Length in logical blocks (bytes 4..8; not 0's based).
    pub block_count: u32,
    /// Starting LBA (bytes 8..16).
    pub slba: u64,
}

impl DsmRange {
    /// Encode a range list (at most 256 ranges).
    pub fn encode_list(ranges: &[DsmRange]) -> Result<Vec<u8>, ProtoError> {
        if ranges.is_empty() || ranges.len() > DSM_MAX_RANGES {
            return Err(ProtoError::Unencodable {
                what: "Dataset Management ranges",
                reason: "1..=256 ranges",
            });
        }
        let mut out = vec![0u8; ranges.len() * DSM_RANGE_LEN];
        for (chunk, r) in out.chunks_exact_mut(DSM_RANGE_LEN).zip(ranges) {
            crate::wire::put_u32(chunk, 0, r.context_attributes);
            crate::wire::put_u32(chunk, 4, r.block_count);
            crate::wire::put_u64(chunk, 8, r.slba);
        }
        Ok(out)
    }

    /// Decode `count` ranges (the command's NR + 1, at most 256) from `data`.
    pub fn decode_list(data: &[u8], count: usize) -> Result<Vec<DsmRange>, ProtoError> {
        if count == 0 || count > DSM_MAX_RANGES {
            return Err(ProtoError::InvalidField {
                structure: "Dataset Management",
                field: "NR",
                offset: 40,
                reason: "1..=256 ranges",
            });
        }
        let needed = count * DSM_RANGE_LEN;
        let data = data.get(..needed).ok_or(ProtoError::Truncated {
            structure: "Dataset Management ranges",
            needed,
            actual: data.len(),
        })?;
        Ok(data
            .chunks_exact(DSM_RANGE_LEN)
            .map(|c| DsmRange {
                context_attributes: crate::wire::get_u32(c, 0),
                block_count: crate::wire::get_u32(c, 4),
                slba: crate::wire::get_u64(c, 8),
            })
            .collect())
    }
}

/// An I/O queue command, by opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoCommand {
    /// Read.
    Read(ReadWrite),
    /// Write.
    Write(ReadWrite),
    /// Flush the namespace's volatile write cache.
    Flush {
        /// Namespace (FFFFFFFFh: all).
        nsid: u32,
    },
    /// Write Zeroes.
    WriteZeroes(WriteZeroes),
    /// Dataset Management.
    DatasetManagement(DatasetManagement),
    /// A Fabrics command (Disconnect travels on I/O queues).
    Fabrics(FabricsCommand),
    /// Any other opcode.
    Other(Sqe),
}

impl IoCommand {
    /// Read `block_count` blocks from `slba`; data comes back in C2HData.
    pub fn read(
        nsid: u32,
        slba: u64,
        block_count: u32,
        len_bytes: u32,
    ) -> Result<Self, ProtoError> {
        ReadWrite::new(nsid, slba, block_count, SglDescriptor::transport(len_bytes)).map(Self::Read)
    }

    /// Write `block_count` blocks at `slba`; `sgl` is in-capsule (see
    /// [`crate::CapsuleCmd::with_data`]) or transport (data after R2T).
    pub fn write(
        nsid: u32,
        slba: u64,
        block_count: u32,
        sgl: SglDescriptor,
    ) -> Result<Self, ProtoError> {
        ReadWrite::new(nsid, slba, block_count, sgl).map(Self::Write)
    }

    /// Dispatch an I/O SQE on its opcode.
    pub fn parse(s: &Sqe) -> Result<Self, ProtoError> {
        Ok(match s.opcode {
            io_opcode::READ => Self::Read(ReadWrite::from_sqe(s)),
            io_opcode::WRITE => Self::Write(ReadWrite::from_sqe(s)),
            io_opcode::FLUSH => Self::Flush { nsid: s.nsid },
            io_opcode::WRITE_ZEROES => Self::WriteZeroes(WriteZeroes {
                nsid: s.nsid,
                slba: s.cdw10 as u64 | (s.cdw11 as u64) << 32,
                nlb: s.cdw12 as u16,
                deallocate: s.cdw12 & (1 << 25) != 0,
                fua: s.cdw12 & (1 << 30) != 0,
                limited_retry: s.cdw12 & (1 << 31) != 0,
            }),
            io_opcode::DATASET_MANAGEMENT => Self::DatasetManagement(DatasetManagement {
                nsid: s.nsid,
                nr: s.cdw10 as u8,
                attributes: s.cdw11,
                sgl: s.dptr,
            }),
            io_opcode::FABRICS => Self::Fabrics(FabricsCommand::parse(s)?),
            _ => Self::Other(*s),
        })
    }

    /// The SQE for this command with `cid`.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        match self {
            Self::Read(c) => c.to_sqe(io_opcode::READ, cid),
            Self::Write(c) => c.to_sqe(io_opcode::WRITE, cid),
            Self::Flush { nsid } => {
                let mut s = Sqe::new(io_opcode::FLUSH, cid);
                s.nsid = *nsid;
                s
            }
            Self::WriteZeroes(c) => {
                let mut s = Sqe::new(io_opcode::WRITE_ZEROES, cid);
                s.nsid = c.nsid;
                s.cdw10 = c.slba as u32;
                s.cdw11 = (c.slba >> 32) as u32;
                s.cdw12 = c.nlb as u32
                    | (c.deallocate as u32) << 25
                    | (c.fua as u32) << 30
                    | (c.limited_retry as u32) << 31;
                s
            }
            Self::DatasetManagement(c) => {
                let mut s = Sqe::new(io_opcode::DATASET_MANAGEMENT, cid);
                s.nsid = c.nsid;
                s.dptr = c.sgl;
                s.cdw10 = c.nr as u32;
                s.cdw11 = c.attributes;
                s
            }
            Self::Fabrics(c) => c.to_sqe(cid),
            Self::Other(s) => Sqe { cid, ..*s },
        }
    }
}

pub(crate) fn expect_opcode(
    s: &Sqe,
    opcode: u8,
    structure: &'static str,
) -> Result<(), ProtoError> {
    if s.opcode == opcode {
        Ok(())
    } else {
        Err(ProtoError::InvalidField {
            structure,
            field: "OPC",
            offset: 0,
            reason: "SQE has a different opcode",
        })
    }
}
