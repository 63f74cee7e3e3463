//! Identify data structures (4096 bytes each): controller (CNS 01h),
//! namespace (CNS 00h), active namespace list (CNS 02h) and namespace
//! identification descriptors (CNS 03h).
//!
//! The typed structures hold the fields this project reads or sets;
//! encoding zero-fills every other byte (reserved or unused), decoding
//! ignores them. Offsets follow the NVMe base specification figures
//! "Identify Controller Data Structure" and "Identify Namespace Data
//! Structure, NVM Command Set".

use crate::error::ProtoError;
use crate::wire::{
    fixed, get_array, get_padded, get_u128, get_u16, get_u32, get_u64, put_nul_terminated,
    put_space_padded, put_u128, put_u16, put_u32, put_u64,
};

/// Size of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;
/// Size of the vendor specific area at the end of Identify Controller.
pub const CONTROLLER_VENDOR_SPECIFIC_LEN: usize = 1024;
/// Offset of the vendor specific area in Identify Controller.
pub const CONTROLLER_VENDOR_SPECIFIC_OFFSET: usize = 3072;
/// Most LBA formats a namespace can list (NLBAF is 0's based, up to 63).
pub const MAX_LBA_FORMATS: usize = 64;

/// ONCS (Optional NVM Command Support) bits.
pub mod oncs {
    /// Compare.
    pub const COMPARE: u16 = 1 << 0;
    /// Write Uncorrectable.
    pub const WRITE_UNCORRECTABLE: u16 = 1 << 1;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u16 = 1 << 2;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u16 = 1 << 3;
    /// Save field in Set Features and Select field in Get Features.
    pub const SAVE_SELECT: u16 = 1 << 4;
    /// Reservations.
    pub const RESERVATIONS: u16 = 1 << 5;
    /// Timestamp feature.
    pub const TIMESTAMP: u16 = 1 << 6;
}

/// SGLS (SGL Support) bits.
pub mod sgls {
    /// Bits 1:0 = 01b: SGLs supported, no alignment requirement.
    pub const SUPPORTED: u32 = 1 << 0;
    /// Keyed SGL Data Block descriptor supported (RDMA).
    pub const KEYED: u32 = 1 << 2;
    /// Address field may be an offset (needed for in-capsule data).
    pub const OFFSET: u32 = 1 << 20;
}

/// VWC (Volatile Write Cache) bits.
pub mod vwc {
    /// A volatile write cache is present (Flush does something).
    pub const PRESENT: u8 = 1 << 0;
}

/// CNTRLTYPE values.
pub mod controller_type {
    /// I/O controller.
    pub const IO: u8 = 1;
    /// Discovery controller.
    pub const DISCOVERY: u8 = 2;
    /// Administrative controller.
    pub const ADMINISTRATIVE: u8 = 3;
}

/// CTRATT bit: the controller supports 128-bit host identifiers (required
/// over fabrics).
pub const CTRATT_HOST_ID_128: u32 = 1 << 0;

/// Identify Controller data structure (CNS 01h).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct IdentifyController {
    /// PCI Vendor ID (0..2).
    pub vid: u16,
    /// PCI Subsystem Vendor ID (2..4).
    pub ssvid: u16,
    /// Serial Number, ASCII, space padded (4..24).
    pub serial_number: String,
    /// Model Number, ASCII, space padded (24..64).
    pub model_number: String,
    /// Firmware Revision, ASCII, space padded (64..72).
    pub firmware_revision: String,
    /// Recommended Arbitration Burst (72).
    pub rab: u8,
    /// IEEE OUI (73..76).
    pub ieee: [u8; 3],
    /// Controller Multi-Path I/O and Namespace Sharing Capabilities (76).
    pub cmic: u8,
    /// Maximum Data Transfer Size: 2^MDTS minimum pages, 0 = no limit (77).
    pub mdts: u8,
    /// Controller ID (78..80).
    pub cntlid: u16,
    /// Version, same encoding as the VS property (80..84).
    pub ver: u32,
    /// RTD3 Resume Latency (84..88).
    pub rtd3r: u32,
    /// RTD3 Entry Latency (88..92).
    pub rtd3e: u32,
    /// Optional Asynchronous Events Supported (92..96).
    pub oaes: u32,
    /// Controller Attributes (96..100), see [`CTRATT_HOST_ID_128`].
    pub ctratt: u32,
    /// Controller Type (111), see [`controller_type`].
    pub cntrltype: u8,
    /// FRU Globally Unique Identifier (112..128).
    pub fguid: [u8; 16],
    /// Command Retry Delay Times 1..3 in 100 ms units (128..134).
    pub crdt: [u16; 3],
    /// Optional Admin Command Support (256..258).
    pub oacs: u16,
    /// Abort Command Limit, 0's based (258).
    pub acl: u8,
    /// Asynchronous Event Request Limit, 0's based (259).
    pub aerl: u8,
    /// Firmware Updates (260).
    pub frmw: u8,
    /// Log Page Attributes (261).
    pub lpa: u8,
    /// Error Log Page Entries, 0's based (262).
    pub elpe: u8,
    /// Number of Power States Support, 0's based (263).
    pub npss: u8,
    /// Admin Vendor Specific Command Configuration (264).
    pub avscc: u8,
    /// Autonomous Power State Transition Attributes (265).
    pub apsta: u8,
    /// Warning Composite Temperature Threshold, kelvin (266..268).
    pub wctemp: u16,
    /// Critical Composite Temperature Threshold, kelvin (268..270).
    pub cctemp: u16,
    /// Keep Alive Support: granularity in 100 ms units, 0 = unsupported (320..322).
    pub kas: u16,
    /// Submission Queue Entry Size: max (7:4) and required (3:0), 2^n bytes (512).
    pub sqes: u8,
    /// Completion Queue Entry Size: max (7:4) and required (3:0) (513).
    pub cqes: u8,
    /// Maximum Outstanding Commands (514..516).
    pub maxcmd: u16,
    /// Number of Namespaces: the largest valid NSID (516..520).
    pub nn: u32,
    /// Optional NVM Command Support (520..522), see [`oncs`].
    pub oncs: u16,
    /// Fused Operation Support (522..524).
    pub fuses: u16,
    /// Format NVM Attributes (524).
    pub fna: u8,
    /// Volatile Write Cache (525), see [`vwc`].
    pub vwc: u8,
    /// Atomic Write Unit Normal, 0's based blocks (526..528).
    pub awun: u16,
    /// Atomic Write Unit Power Fail, 0's based blocks (528..530).
    pub awupf: u16,
    /// NVM Vendor Specific Command Configuration (530).
    pub nvscc: u8,
    /// Namespace Write Protection Capabilities (531).
    pub nwpc: u8,
    /// Atomic Compare & Write Unit (532..534).
    pub acwu: u16,
    /// SGL Support (536..540), see [`sgls`].
    pub sgls: u32,
    /// Maximum Number of Allowed Namespaces (540..544).
    pub mnan: u32,
    /// NVM Subsystem NQN, NUL terminated (768..1024).
    pub subnqn: String,
    /// I/O Queue Command Capsule Supported Size in 16-byte units, SQE
    /// included (1792..1796).
    pub ioccsz: u32,
    /// I/O Queue Response Capsule Supported Size in 16-byte units (1796..1800).
    pub iorcsz: u32,
    /// In Capsule Data Offset in 16-byte units (1800..1802).
    pub icdoff: u16,
    /// Fabrics Controller Attributes (1802): bit 0 set = static controller model.
    pub fcatt: u8,
    /// Maximum SGL Data Block Descriptors, 0 = no limit (1803).
    pub msdbd: u8,
    /// Optional Fabric Commands Support (1804..1806).
    pub ofcs: u16,
    /// Vendor specific area (3072..4096); at most 1024 bytes, zero-filled.
    pub vendor_specific: Vec<u8>,
}

impl IdentifyController {
    /// In-capsule data bytes an I/O queue capsule may carry: IOCCSZ * 16 - 64.
    pub const fn max_in_capsule_data(&self) -> u64 {
        (self.ioccsz as u64 * 16).saturating_sub(64)
    }

    /// Encode to 4096 bytes.
    pub fn to_bytes(&self) -> Result<Box<[u8; IDENTIFY_LEN]>, ProtoError> {
        let mut page = Box::new([0u8; IDENTIFY_LEN]);
        let b = &mut page[..];
        put_u16(b, 0, self.vid);
        put_u16(b, 2, self.ssvid);
        put_space_padded(b, 4, 20, &self.serial_number);
        put_space_padded(b, 24, 40, &self.model_number);
        put_space_padded(b, 64, 8, &self.firmware_revision);
        b[72] = self.rab;
        b[73..76].copy_from_slice(&self.ieee);
        b[76] = self.cmic;
        b[77] = self.mdts;
        put_u16(b, 78, self.cntlid);
        put_u32(b, 80, self.ver);
        put_u32(b, 84, self.rtd3r);
        put_u32(b, 88, self.rtd3e);
        put_u32(b, 92, self.oaes);
        put_u32(b, 96, self.ctratt);
        b[111] = self.cntrltype;
        b[112..128].copy_from_slice(&self.fguid);
        for (i, v) in self.crdt.iter().enumerate() {
            put_u16(b, 128 + 2 * i, *v);
        }
        put_u16(b, 256, self.oacs);
        b[258] = self.acl;
        b[259] = self.aerl;
        b[260] = self.frmw;
        b[261] = self.lpa;
        b[262] = self.elpe;
        b[263] = self.npss;
        b[264] = self.avscc;
        b[265] = self.apsta;
        put_u16(b, 266, self.wctemp);
        put_u16(b, 268, self.cctemp);
        put_u16(b, 320, self.kas);
        b[512] = self.sqes;
        b[513] = self.cqes;
        put_u16(b, 514, self.maxcmd);
        put_u32(b, 516, self.nn);
        put_u16(b, 520, self.oncs);
        put_u16(b, 522, self.fuses);
        b[524] = self.fna;
        b[525] = self.vwc;
        put_u16(b, 526, self.awun);
        put_u16(b, 528, self.awupf);
        b[530] = self.nvscc;
        b[531] = self.nwpc;
        put_u16(b, 532, self.acwu);
        put_u32(b, 536, self.sgls);
        put_u32(b, 540, self.mnan);
        put_nul_terminated(b, 768, 256, &self.subnqn, "SUBNQN")?;
        put_u32(b, 1792, self.ioccsz);
        put_u32(b, 1796, self.iorcsz);
        put_u16(b, 1800, self.icdoff);
        b[1802] = self.fcatt;
        b[1803] = self.msdbd;
        put_u16(b, 1804, self.ofcs);
        if self.vendor_specific.len() > CONTROLLER_VENDOR_SPECIFIC_LEN {
            return Err(ProtoError::Unencodable {
                what: "Identify Controller",
                reason: "vendor specific area is 1024 bytes",
            });
        }
        b[CONTROLLER_VENDOR_SPECIFIC_OFFSET
            ..CONTROLLER_VENDOR_SPECIFIC_OFFSET + self.vendor_specific.len()]
            .copy_from_slice(&self.vendor_specific);
        Ok(page)
    }

    /// Decode from at least 4096 bytes. String fields are read leniently
    /// (trailing spaces/NULs dropped, bad UTF-8 replaced); the vendor area is
    /// returned with trailing zero bytes trimmed.
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let b = &fixed::<IDENTIFY_LEN>(b, "Identify Controller")?[..];
        let vs = &b[CONTROLLER_VENDOR_SPECIFIC_OFFSET..];
        let vs_len = vs.iter().rposition(|&c| c != 0).map_or(0, |p| p + 1);
        Ok(Self {
            vid: get_u16(b, 0),
            ssvid: get_u16(b, 2),
            serial_number: get_padded(b, 4, 20),
            model_number: get_padded(b, 24, 40),
            firmware_revision: get_padded(b, 64, 8),
            rab: b[72],
            ieee: get_array(b, 73),
            cmic: b[76],
            mdts: b[77],
            cntlid: get_u16(b, 78),
            ver: get_u32(b, 80),
            rtd3r: get_u32(b, 84),
            rtd3e: get_u32(b, 88),
            oaes: get_u32(b, 92),
            ctratt: get_u32(b, 96),
            cntrltype: b[111],
            fguid: get_array(b, 112),
            crdt: [get_u16(b, 128), get_u16(b, 130), get_u16(b, 132)],
            oacs: get_u16(b, 256),
            acl: b[258],
            aerl: b[259],
            frmw: b[260],
            lpa: b[261],
            elpe: b[262],
            npss: b[263],
            avscc: b[264],
            apsta: b[265],
            wctemp: get_u16(b, 266),
            cctemp: get_u16(b, 268),
            kas: get_u16(b, 320),
            sqes: b[512],
            cqes: b[513],
            maxcmd: get_u16(b, 514),
            nn: get_u32(b, 516),
            oncs: get_u16(b, 520),
            fuses: get_u16(b, 522),
            fna: b[524],
            vwc: b[525],
            awun: get_u16(b, 526),
            awupf: get_u16(b, 528),
            nvscc: b[530],
            nwpc: b[531],
            acwu: get_u16(b, 532),
            sgls: get_u32(b, 536),
            mnan: get_u32(b, 540),
            subnqn: get_padded(b, 768, 256),
            ioccsz: get_u32(b, 1792),
            iorcsz: get_u32(b, 1796),
            icdoff: get_u16(b, 1800),
            fcatt: b[1802],
            msdbd: b[1803],
            ofcs: get_u16(b, 1804),
            vendor_specific: vs[..vs_len].to_vec(),
        })
    }
}

/// One LBA format of a namespace (4 bytes in the LBAF table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LbaFormat {
    /// Metadata bytes per block (bits 15:0).
    pub metadata_size: u16,
    /// LBA Data Size: block size is 2^LBADS bytes, ≥ 9 (bits 23:16).
    pub lbads: u8,
    /// Relative Performance (bits 25:24).
    pub relative_performance: u8,
}

impl LbaFormat {
    /// A format with 2^`lbads`-byte blocks and no metadata.
    pub const fn with_block_shift(lbads: u8) -> Self {
        Self {
            metadata_size: 0,
            lbads,
            relative_performance: 0,
        }
    }

    /// Block size in bytes, `None` if LBADS is too large to be real.
    pub const fn block_size(&self) -> Option<u64> {
        if self.lbads < 9 || self.lbads > 31 {
            None
        } else {
            Some(1 << self.lbads)
        }
    }
}

/// Identify Namespace data structure, NVM command set (CNS 00h).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct IdentifyNamespace {
    /// Namespace Size in blocks (0..8).
    pub nsze: u64,
    /// Namespace Capacity in blocks (8..16).
    pub ncap: u64,
    /// Namespace Utilization in blocks (16..24).
    pub nuse: u64,
    /// Namespace Features (24): bit 0 thin provisioning, bit 2 DAE
    /// (deallocated error), bit 4 optimal I/O fields valid.
    pub nsfeat: u8,
    /// Formatted LBA Size (26): format index in bits 3:0 and 6:5, bit 4
    /// metadata at end of block.
    pub flbas: u8,
    /// Metadata Capabilities (27).
    pub mc: u8,
    /// End-to-end Data Protection Capabilities (28).
    pub dpc: u8,
    /// End-to-end Data Protection Type Settings (29).
    pub dps: u8,
    /// Namespace Multi-path I/O and Namespace Sharing Capabilities (30).
    pub nmic: u8,
    /// Reservation Capabilities (31).
    pub rescap: u8,
    /// Format Progress Indicator (32).
    pub fpi: u8,
    /// Deallocate Logical Block Features (33): bits 2:0 = 001b, read of a
    /// deallocated block returns zeroes.
    pub dlfeat: u8,
    /// Namespace Atomic Write Unit Normal (34..36).
    pub nawun: u16,
    /// Namespace Atomic Write Unit Power Fail (36..38).
    pub nawupf: u16,
    /// Namespace Optimal I/O Boundary (46..48).
    pub noiob: u16,
    /// NVM Capacity in bytes (48..64).
    pub nvmcap: u128,
    /// Namespace Preferred Write Granularity, 0's based (64..66).
    pub npwg: u16,
    /// Namespace Preferred Write Alignment, 0's based (66..68).
    pub npwa: u16,
    /// Namespace Preferred Deallocate Granularity, 0's based (68..70).
    pub npdg: u16,
    /// Namespace Preferred Deallocate Alignment, 0's based (70..72).
    pub npda: u16,
    /// Namespace Optimal Write Size, 0's based (72..74).
    pub nows: u16,
    /// ANA Group Identifier (92..96).
    pub anagrpid: u32,
    /// Namespace Attributes (99): bit 0 write protected.
    pub nsattr: u8,
    /// NVM Set Identifier (100..102).
    pub nvmsetid: u16,
    /// Endurance Group Identifier (102..104).
    pub endgid: u16,
    /// Namespace Globally Unique Identifier (104..120).
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier (120..128).
    pub eui64: [u8; 8],
    /// LBA formats (128..384); NLBAF (25) is their count minus one.
    pub lba_formats: Vec<LbaFormat>,
}

impl IdentifyNamespace {
    /// Index of the format in use (FLBAS bits 3:0, plus bits 6:5 as 5:4).
    pub const fn format_index(&self) -> usize {
        ((self.flbas & 0xF) | ((self.flbas >> 1) & 0x30)) as usize
    }

    /// Block size of the format in use.
    pub fn block_size(&self) -> Option<u64> {
        self.lba_formats.get(self.format_index())?.block_size()
    }

    /// Encode to 4096 bytes (1..=64 LBA formats).
    pub fn to_bytes(&self) -> Result<Box<[u8; IDENTIFY_LEN]>, ProtoError> {
        if self.lba_formats.is_empty() || self.lba_formats.len() > MAX_LBA_FORMATS {
            return Err(ProtoError::Unencodable {
                what: "Identify Namespace",
                reason: "1..=64 LBA formats",
            });
        }
        let mut page = Box::new([0u8; IDENTIFY_LEN]);
        let b = &mut page[..];
        put_u64(b, 0, self.nsze);
        put_u64(b, 8, self.ncap);
        put_u64(b, 16, self.nuse);
        b[24] = self.nsfeat;
        b[25] = (self.lba_formats.len() - 1) as u8;
        b[26] = self.flbas;
        b[27] = self.mc;
        b[28] = self.dpc;
        b[29] = self.dps;
        b[30] = self.nmic;
        b[31] = self.rescap;
        b[32] = self.fpi;
        b[33] = self.dlfeat;
        put_u16(b, 34, self.nawun);
        put_u16(b, 36, self.nawupf);
        put_u16(b, 46, self.noiob);
        put_u128(b, 48, self.nvmcap);
        put_u16(b, 64, self.npwg);
        put_u16(b, 66, self.npwa);
        put_u16(b, 68, self.npdg);
        put_u16(b, 70, self.npda);
        put_u16(b, 72, self.nows);
        put_u32(b, 92, self.anagrpid);
        b[99] = self.nsattr;
        put_u16(b, 100, self.nvmsetid);
        put_u16(b, 102, self.endgid);
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        for (i, f) in self.lba_formats.iter().enumerate() {
            let off = 128 + 4 * i;
            put_u16(b, off, f.metadata_size);
            b[off + 2] = f.lbads;
            b[off + 3] = f.relative_performance & 0x3;
        }
        Ok(page)
    }

    /// Decode from at least 4096 bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let b = &fixed::<IDENTIFY_LEN>(b, "Identify Namespace")?[..];
        let count = b[25] as usize + 1;
        if count > MAX_LBA_FORMATS {
            return Err(ProtoError::InvalidField {
                structure: "Identify Namespace",
                field: "NLBAF",
                offset: 25,
                reason: "more than 64 LBA formats",
            });
        }
        let lba_formats = (0..count)
            .map(|i| {
                let off = 128 + 4 * i;
                LbaFormat {
                    metadata_size: get_u16(b, off),
                    lbads: b[off + 2],
                    relative_performance: b[off + 3] & 0x3,
                }
            })
            .collect();
        Ok(Self {
            nsze: get_u64(b, 0),
            ncap: get_u64(b, 8),
            nuse: get_u64(b, 16),
            nsfeat: b[24],
            flbas: b[26],
            mc: b[27],
            dpc: b[28],
            dps: b[29],
            nmic: b[30],
            rescap: b[31],
            fpi: b[32],
            dlfeat: b[33],
            nawun: get_u16(b, 34),
            nawupf: get_u16(b, 36),
            noiob: get_u16(b, 46),
            nvmcap: get_u128(b, 48),
            npwg: get_u16(b, 64),
            npwa: get_u16(b, 66),
            npdg: get_u16(b, 68),
            npda: get_u16(b, 70),
            nows: get_u16(b, 72),
            anagrpid: get_u32(b, 92),
            nsattr: b[99],
            nvmsetid: get_u16(b, 100),
            endgid: get_u16(b, 102),
            nguid: get_array(b, 104),
            eui64: get_array(b, 120),
            lba_formats,
        })
    }
}

/// Active Namespace ID list (CNS 02h): up to 1024 NSIDs, ascending, ended
/// by a zero entry or the end of the page.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ActiveNamespaceList {
    /// The NSIDs (non-zero).
    pub nsids: Vec<u32>,
}

impl ActiveNamespaceList {
    /// Most NSIDs one page holds.
    pub const MAX_ENTRIES: usize = IDENTIFY_LEN / 4;

    /// Encode to 4096 bytes (at most 1024 non-zero NSIDs).
    pub fn to_bytes(&self) -> Result<Box<[u8; IDENTIFY_LEN]>, ProtoError> {
        if self.nsids.len() > Self::MAX_ENTRIES || self.nsids.contains(&0) {
            return Err(ProtoError::Unencodable {
                what: "Active Namespace ID list",
                reason: "at most 1024 non-zero NSIDs",
            });
        }
        let mut page = Box::new([0u8; IDENTIFY_LEN]);
        for (i, id) in self.nsids.iter().enumerate() {
            put_u32(&mut page[..], 4 * i, *id);
        }
        Ok(page)
    }

    /// Decode from at least 4096 bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let b = fixed::<IDENTIFY_LEN>(b, "Active Namespace ID list")?;
        Ok(Self {
            nsids: b
                .chunks_exact(4)
                .map(|c| get_u32(c, 0))
                .take_while(|&id| id != 0)
                .collect(),
        })
    }
}

/// Namespace Identifier Types (NIDT).
pub mod nidt {
    /// IEEE Extended Unique Identifier, 8 bytes.
    pub const EUI64: u8 = 0x01;
    /// Namespace Globally Unique Identifier, 16 bytes.
    pub const NGUID: u8 = 0x02;
    /// Namespace UUID, 16 bytes.
    pub const UUID: u8 = 0x03;
    /// Command Set Identifier, 1 byte.
    pub const CSI: u8 = 0x04;
}

/// One Namespace Identification Descriptor (CNS 03h): NIDT (byte 0), NIDL
/// (byte 1), reserved (2..4), NID (NIDL bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NamespaceIdDescriptor {
    /// EUI-64.
    Eui64([u8; 8]),
    /// NGUID.
    Nguid([u8; 16]),
    /// UUID.
    Uuid([u8; 16]),
    /// Command Set Identifier (0 = NVM).
    Csi(u8),
    /// A type this crate does not know.
    Unknown {
        /// NIDT (non-zero).
        nidt: u8,
        /// NID bytes (1..=255).
        nid: Vec<u8>,
    },
}

impl NamespaceIdDescriptor {
    fn parts(&self) -> (u8, &[u8]) {
        match self {
            Self::Eui64(v) => (nidt::EUI64, v),
            Self::Nguid(v) => (nidt::NGUID, v),
            Self::Uuid(v) => (nidt::UUID, v),
            Self::Csi(v) => (nidt::CSI, std::slice::from_ref(v)),
            Self::Unknown { nidt, nid } => (*nidt, nid),
        }
    }

    /// Encode a descriptor list into the 4096-byte page (zero-terminated).
    pub fn encode_list(list: &[Self]) -> Result<Box<[u8; IDENTIFY_LEN]>, ProtoError> {
        let mut page = Box::new([0u8; IDENTIFY_LEN]);
        let mut off = 0;
        for d in list {
            let (t, nid) = d.parts();
            if t == 0 || nid.is_empty() || nid.len() > 255 {
                return Err(ProtoError::Unencodable {
                    what: "Namespace Identification Descriptor",
                    reason: "NIDT must be non-zero and NID 1..=255 bytes",
                });
            }
            let end = off + 4 + nid.len();
            if end > IDENTIFY_LEN {
                return Err(ProtoError::Unencodable {
                    what: "Namespace Identification Descriptor list",
                    reason: "list longer than 4096 bytes",
                });
            }
            page[off] = t;
            page[off + 1] = nid.len() as u8;
            page[off + 4..end].copy_from_slice(nid);
            off = end;
        }
        Ok(page)
    }

    /// Decode a descriptor list from at least 4096 bytes; the list ends at
    /// a descriptor with NIDT 0 or at the end of the page.
    pub fn decode_list(b: &[u8]) -> Result<Vec<Self>, ProtoError> {
        let b = &fixed::<IDENTIFY_LEN>(b, "Namespace Identification Descriptor list")?[..];
        let invalid = |field, offset, reason| ProtoError::InvalidField {
            structure: "Namespace Identification Descriptor list",
            field,
            offset,
            reason,
        };
        let mut list = Vec::new();
        let mut off = 0;
        while off + 4 <= IDENTIFY_LEN && b[off] != 0 {
            let (t, len) = (b[off], b[off + 1] as usize);
            let nid = b
                .get(off + 4..off + 4 + len)
                .filter(|n| !n.is_empty())
                .ok_or(invalid(
                    "NIDL",
                    off + 1,
                    "descriptor overruns the page or is empty",
                ))?;
            let wrong_len = || invalid("NIDL", off + 1, "wrong length for this NIDT");
            list.push(match t {
                nidt::EUI64 => Self::Eui64(nid.try_into().map_err(|_| wrong_len())?),
                nidt::NGUID => Self::Nguid(nid.try_into().map_err(|_| wrong_len())?),
                nidt::UUID => Self::Uuid(nid.try_into().map_err(|_| wrong_len())?),
                nidt::CSI if len == 1 => Self::Csi(nid[0]),
                nidt::CSI => return Err(wrong_len()),
                _ => Self::Unknown {
                    nidt: t,
                    nid: nid.to_vec(),
                },
            });
            off += 4 + len;
        }
        Ok(list)
    }
}
