//! Controller bring-up rules, as pure functions any driver can use: which
//! CC value enables the controller, how long to wait for CSTS.RDY, what
//! MDTS and IOCCSZ mean in bytes, and what a namespace looks like.
//!
//! The bring-up sequence itself (run by [`crate::blocking`] on the admin
//! queue) is: Property Get CAP, Property Get VS, Property Set CC (EN=1,
//! and the arbitration mechanism when asked), Property Get CSTS until RDY
//! within CAP.TO, Identify Controller, and for I/O controllers Set Features
//! Number of Queues; then Keep Alive every KATO/2.

use std::time::Duration;

use nvmf_proto::fabrics::{arbitration_mechanism, Capabilities, ControllerConfiguration, Version};
use nvmf_proto::identify::{sgls, IdentifyController, IdentifyNamespace};

use crate::error::Error;

/// Largest transfer this host issues as one command, whatever MDTS allows:
/// bounds the memory one command pins and the PDU size the decoder accepts.
pub const HOST_MAX_TRANSFER_BYTES: u32 = 1 << 20;

/// Arbitration mechanism to select in CC.AMS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arbitration {
    /// Round robin (always supported; the default).
    RoundRobin,
    /// Weighted round robin with urgent priority class (CAP.AMS bit 17).
    WeightedRoundRobin,
    /// The controller's vendor specific mechanism (gimbal-target: DRR).
    VendorSpecific,
    /// Weighted round robin with urgent when CAP.AMS offers it, otherwise
    /// round robin (what a host that uses priority classes but must also
    /// work with plain targets asks for). [`enable_cc`] resolves it;
    /// [`ControllerInfo::arbitration`] says which one runs.
    PreferWeighted,
}

impl Arbitration {
    /// The CC.AMS value.
    pub fn cc_ams(self) -> u8 {
        match self {
            Self::RoundRobin => arbitration_mechanism::ROUND_ROBIN,
            Self::WeightedRoundRobin => arbitration_mechanism::WEIGHTED_ROUND_ROBIN_URGENT,
            Self::VendorSpecific => arbitration_mechanism::VENDOR_SPECIFIC,
            Self::PreferWeighted => arbitration_mechanism::WEIGHTED_ROUND_ROBIN_URGENT,
        }
    }

    /// What runs on a controller with `cap`: `PreferWeighted` becomes
    /// weighted round robin or round robin; the others stay as asked.
    pub fn resolve(self, cap: &Capabilities) -> Arbitration {
        match self {
            Self::PreferWeighted if Self::WeightedRoundRobin.supported_by(cap) => {
                Self::WeightedRoundRobin
            }
            Self::PreferWeighted => Self::RoundRobin,
            other => other,
        }
    }

    /// Whether the submission-queue priority classes mean anything under
    /// this mechanism (they do not under round robin).
    pub fn uses_classes(self) -> bool {
        !matches!(self, Self::RoundRobin)
    }

    /// Whether CAP.AMS offers it.
    pub fn supported_by(self, cap: &Capabilities) -> bool {
        match self {
            Self::RoundRobin | Self::PreferWeighted => true,
            Self::WeightedRoundRobin => cap.ams & arbitration_mechanism::CAP_WRR_URGENT != 0,
            Self::VendorSpecific => cap.ams & arbitration_mechanism::CAP_VENDOR_SPECIFIC != 0,
        }
    }
}

/// The CC value that enables the controller: NVM command set, 4 KiB pages,
/// 64-byte SQEs and 16-byte CQEs, and the arbitration mechanism asked for
/// (an error if CAP.AMS lacks it: silently running round robin would make
/// priority classes meaningless).
pub fn enable_cc(
    cap: &Capabilities,
    arbitration: Arbitration,
) -> Result<ControllerConfiguration, Error> {
    let arbitration = arbitration.resolve(cap);
    if !arbitration.supported_by(cap) {
        return Err(Error::Unsupported(
            "the arbitration mechanism asked for is not in CAP.AMS",
        ));
    }
    Ok(ControllerConfiguration {
        enable: true,
        css: 0,
        mps: cap.mpsmin,
        ams: arbitration.cc_ams(),
        shn: 0,
        iosqes: 6,
        iocqes: 4,
    })
}

/// How long to wait for CSTS.RDY after enabling: CAP.TO in 500 ms units, at
/// least 500 ms (some targets report 0).
pub fn ready_timeout(cap: &Capabilities) -> Duration {
    Duration::from_millis(500 * u64::from(cap.timeout_500ms.max(1)))
}

/// Bytes one command may transfer: MDTS (a power of two of the minimum
/// page size; 0 = no limit) capped by [`HOST_MAX_TRANSFER_BYTES`].
pub fn max_transfer_bytes(mdts: u8, cap: &Capabilities) -> u32 {
    if mdts == 0 {
        return HOST_MAX_TRANSFER_BYTES;
    }
    let page_shift = 12 + u32::from(cap.mpsmin);
    let shift = u32::from(mdts) + page_shift;
    if shift >= 31 {
        HOST_MAX_TRANSFER_BYTES
    } else {
        (1u32 << shift).min(HOST_MAX_TRANSFER_BYTES)
    }
}

/// In-capsule write data an I/O queue capsule may carry (IOCCSZ*16 - 64),
/// capped at the transfer limit.
pub fn in_capsule_bytes(id: &IdentifyController, max_transfer: u32) -> u32 {
    id.max_in_capsule_data().min(u64::from(max_transfer)) as u32
}

/// Check Identify Controller for what NVMe/TCP needs: SGL support.
pub fn check_identify(id: &IdentifyController) -> Result<(), Error> {
    // SGLS bits 1:0 = 00b means no SGL support; fabrics data needs SGLs.
    if id.sgls & (sgls::SUPPORTED | 0x2) == 0 {
        return Err(Error::Unsupported("controller reports no SGL support"));
    }
    Ok(())
}

/// What bring-up learned about a controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    /// Controller ID (dynamic: assigned by this connection's Connect).
    pub cntlid: u16,
    /// CAP.
    pub cap: Capabilities,
    /// VS.
    pub version: Version,
    /// Identify Controller.
    pub identify: IdentifyController,
    /// I/O queue pairs the controller granted (0 for discovery).
    pub io_queues: u16,
    /// Most entries per I/O queue (CAP.MQES + 1).
    pub max_queue_depth: u16,
    /// Bytes one command may transfer.
    pub max_transfer_bytes: u32,
    /// In-capsule write data per I/O command.
    pub in_capsule_bytes: u32,
    /// Keep alive timeout in ms (0: none).
    pub kato_ms: u32,
    /// The arbitration mechanism enabled in CC.AMS.
    pub arbitration: Arbitration,
}

/// A namespace as a block device sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// Namespace ID.
    pub nsid: u32,
    /// Size in blocks (NSZE).
    pub blocks: u64,
    /// Block size in bytes (from the LBA format in use).
    pub block_size: u32,
    /// The whole Identify Namespace structure.
    pub identify: IdentifyNamespace,
}

impl Namespace {
    /// From Identify Namespace; an inactive namespace (NSZE 0) or one with
    /// an unusable LBA format is an error.
    pub fn from_identify(nsid: u32, identify: IdentifyNamespace) -> Result<Self, Error> {
        if identify.nsze == 0 {
            return Err(Error::InvalidRequest("namespace is not active"));
        }
        let block_size = identify
            .block_size()
            .filter(|&b| b <= 1 << 16)
            .ok_or(Error::Unsupported("namespace LBA format"))?;
        Ok(Self {
            nsid,
            blocks: identify.nsze,
            block_size: block_size as u32,
            identify,
        })
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mdts_in_bytes() {
        let cap = Capabilities::default();
        assert_eq!(max_transfer_bytes(0, &cap), HOST_MAX_TRANSFER_BYTES);
        assert_eq!(max_transfer_bytes(5, &cap), 128 * 1024);
        assert_eq!(max_transfer_bytes(30, &cap), HOST_MAX_TRANSFER_BYTES);
    }

    #[test]
    fn prefer_weighted_falls_back_to_round_robin() {
        let mut cap = Capabilities::default();
        assert_eq!(
            Arbitration::PreferWeighted.resolve(&cap),
            Arbitration::RoundRobin
        );
        assert_eq!(enable_cc(&cap, Arbitration::PreferWeighted).unwrap().ams, 0);
        assert!(!Arbitration::PreferWeighted.resolve(&cap).uses_classes());
        cap.ams = arbitration_mechanism::CAP_WRR_URGENT;
        assert_eq!(
            Arbitration::PreferWeighted.resolve(&cap),
            Arbitration::WeightedRoundRobin
        );
        assert_eq!(enable_cc(&cap, Arbitration::PreferWeighted).unwrap().ams, 1);
        // Asked for explicitly, a missing mechanism stays an error.
        cap.ams = 0;
        assert!(enable_cc(&cap, Arbitration::VendorSpecific).is_err());
    }

    #[test]
    fn arbitration_must_be_offered() {
        let mut cap = Capabilities::default();
        assert!(enable_cc(&cap, Arbitration::WeightedRoundRobin).is_err());
        cap.ams = arbitration_mechanism::CAP_WRR_URGENT;
        let cc = enable_cc(&cap, Arbitration::WeightedRoundRobin).unwrap();
        assert!(cc.enable);
        assert_eq!(cc.ams, 1);
        assert_eq!(
            ready_timeout(&Capabilities::default()),
            Duration::from_millis(500)
        );
    }
}
