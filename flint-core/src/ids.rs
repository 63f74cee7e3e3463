//! Identities of the things Flint's policies talk about. All are small,
//! ordered and cheap to copy; who assigns them (the arbiter, from etcd) is
//! the caller's business.

use core::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub u32);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id!(
    /// A namespace of a target (one SSD's "mega-volume", §4.2): the unit
    /// extents are placed on and bandwidth is auctioned for.
    NamespaceId,
    "ns"
);
id!(
    /// A storage target (a gimbal-target, a kernel nvmet, an EBOF).
    TargetId,
    "target"
);
id!(
    /// A network port of a target (the paper's Ethernet port and NetPipe).
    PortId,
    "port"
);
id!(
    /// An NVMe-oF session: one client host's connection to one target port.
    SessionId,
    "session"
);
id!(
    /// An elastic volume.
    VolumeId,
    "vol"
);

/// Serializes a [`crate::Nanos`] as its nanoseconds (`qos-core`'s type has
/// no serde support of its own): `#[serde(with = "crate::ids::nanos_serde")]`.
pub mod nanos_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::Nanos;

    /// Writes the nanoseconds.
    pub fn serialize<S: Serializer>(n: &Nanos, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(n.as_nanos())
    }

    /// Reads the nanoseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Nanos, D::Error> {
        u64::deserialize(d).map(Nanos)
    }
}
