//! The only module that talks to aya: loads the object built by build.rs,
//! attaches the program and maps the slot array.

use std::path::Path;

use aya::maps::{HashMap, Map, MapData};
use aya::programs::BtfTracePoint;
use aya::{Btf, Ebpf, EbpfLoader, Endianness};

use crate::layout::{DevEntry, DevT, MAX_DEVICES, SLOT_BYTES};
use crate::{Error, Unavailable};

/// The tracepoint the program attaches to (see `bpf/ioprio.bpf.c` for why).
pub(crate) const TRACEPOINT: &str = "block_rq_issue";
const PROGRAM: &str = "ioprio_rq_issue";

// The ELF parser wants the object aligned like an ELF file in memory;
// include_bytes! alone gives alignment 1.
#[cfg(ioprio_bpf_object)]
#[repr(C, align(32))]
struct Aligned<B: ?Sized>(B);

#[cfg(ioprio_bpf_object)]
static OBJECT: &Aligned<[u8]> =
    &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/ioprio.bpf.o")));

/// The compiled BPF object, if build.rs could build it.
pub(crate) fn object() -> Option<&'static [u8]> {
    #[cfg(ioprio_bpf_object)]
    return Some(&OBJECT.0);
    #[cfg(not(ioprio_bpf_object))]
    return None;
}

/// The `devices` map: dev_t → geometry of registered disks.
pub(crate) struct DeviceTable {
    map: HashMap<MapData, u32, DevEntry>,
    count: usize,
}

impl DeviceTable {
    pub(crate) fn contains(&self, dev: DevT) -> Result<bool, Error> {
        match self.map.get(&dev.0, 0) {
            Ok(_) => Ok(true),
            Err(aya::maps::MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(Error::Map {
                op: "lookup",
                detail: e.to_string(),
            }),
        }
    }

    pub(crate) fn insert(&mut self, dev: DevT, entry: DevEntry) -> Result<(), Error> {
        if self.count >= MAX_DEVICES {
            return Err(Error::TooManyDevices);
        }
        self.map.insert(dev.0, entry, 0).map_err(|e| Error::Map {
            op: "insert",
            detail: e.to_string(),
        })?;
        self.count += 1;
        Ok(())
    }

    pub(crate) fn remove(&mut self, dev: DevT) -> Result<(), Error> {
        self.map.remove(&dev.0).map_err(|e| Error::Map {
            op: "remove",
            detail: e.to_string(),
        })?;
        self.count -= 1;
        Ok(())
    }
}

/// Owns the loaded object; dropping it detaches the program.
pub(crate) struct Attached {
    _ebpf: Ebpf,
    // Keeps the array's fd open as long as the mapping is used (the
    // mapping holds its own reference too; this is belt and braces).
    _slots: MapData,
}

pub(crate) struct Loaded {
    pub(crate) slots_ptr: *mut u64,
    pub(crate) devices: DeviceTable,
    pub(crate) attached: Attached,
}

fn load_err(e: impl std::fmt::Display) -> Unavailable {
    Unavailable::Load {
        detail: e.to_string(),
    }
}

pub(crate) fn load(
    object: &[u8],
    btf_path: &Path,
    slot_capacity: u32,
    tracepoint: &str,
) -> Result<Loaded, Unavailable> {
    let btf =
        Btf::parse_file(btf_path, Endianness::default()).map_err(|e| Unavailable::BadBtf {
            path: btf_path.to_path_buf(),
            detail: e.to_string(),
        })?;
    let mut ebpf = EbpfLoader::new()
        .btf(Some(&btf))
        .set_max_entries("slots", slot_capacity)
        .load(object)
        .map_err(load_err)?;
    let program: &mut BtfTracePoint = ebpf
        .program_mut(PROGRAM)
        .ok_or_else(|| load_err(format!("program {PROGRAM} missing from the object")))?
        .try_into()
        .map_err(load_err)?;
    program
        .load(tracepoint, &btf)
        .map_err(|e| Unavailable::Load {
            detail: full_chain(&e),
        })?;

    let slots = match ebpf.take_map("slots") {
        Some(Map::Array(m)) => m,
        _ => return Err(load_err("map slots missing or not an array")),
    };
    let devices = match ebpf.take_map("devices") {
        Some(m @ Map::HashMap(_)) => HashMap::try_from(m).map_err(load_err)?,
        _ => return Err(load_err("map devices missing or not a hash map")),
    };

    let len = slot_capacity as usize * SLOT_BYTES;
    // SAFETY: mapping a BPF_F_MMAPABLE array's fd at offset 0 for its size
    // is what the kernel supports; the result is checked for MAP_FAILED.
    let ptr = unsafe {
        use std::os::fd::{AsFd, AsRawFd};
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            slots.fd().as_fd().as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Unavailable::Mmap {
            detail: std::io::Error::last_os_error().to_string(),
        });
    }
    // Attach last, so nothing runs before the maps are in our hands; if
    // attaching fails, undo the mapping.
    let program: &mut BtfTracePoint = ebpf
        .program_mut(PROGRAM)
        .expect("present above")
        .try_into()
        .expect("checked above");
    if let Err(e) = program.attach() {
        // SAFETY: ptr/len from the successful mmap above.
        unsafe { libc::munmap(ptr, len) };
        return Err(Unavailable::Attach {
            detail: full_chain(&e),
        });
    }
    Ok(Loaded {
        slots_ptr: ptr.cast(),
        devices: DeviceTable {
            map: devices,
            count: 0,
        },
        attached: Attached {
            _ebpf: ebpf,
            _slots: slots,
        },
    })
}

/// An error with its sources (the verifier log is in a source).
fn full_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
