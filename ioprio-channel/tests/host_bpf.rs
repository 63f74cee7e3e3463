//! Loads and attaches the real program on the host kernel and checks that it
//! sees this process's own I/O, with the ioprio set by ioprio_set(2), on a
//! loop device. Needs root, kernel BTF and loop devices (the development and
//! CI machines have them); set IOPRIO_CHANNEL_SKIP_HOST_BPF=1 to skip it on
//! a machine without. Without CAP_BPF it checks the typed fallback instead.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use ioprio_channel::layout::DevT;
use ioprio_channel::{
    dev_t_of_path, Mode, Observation, Options, PriorityChannel, QueueReader, Unavailable,
};
use qos_core::priority::{ClassMap, Ioprio, IoprioClass, NvmeClass, IOPRIO_CLASS_SHIFT};

const RT: u16 = 1;
const IDLE: u16 = 3;

/// ioprio_set(IOPRIO_WHO_PROCESS, 0 = this thread, prio).
fn set_thread_ioprio(class: u16, level: u16) {
    let prio = (class << IOPRIO_CLASS_SHIFT) | level;
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_set, 1, 0, libc::c_int::from(prio)) };
    assert_eq!(r, 0, "ioprio_set: {}", std::io::Error::last_os_error());
}

/// A loop device over a scratch file; detached on drop.
struct Loop {
    dev: PathBuf,
    file: PathBuf,
}

impl Loop {
    fn new(tag: &str) -> Loop {
        let file =
            std::env::temp_dir().join(format!("ioprio-channel-{}-{tag}.img", std::process::id()));
        let mut f = std::fs::File::create(&file).unwrap();
        f.write_all(&vec![0x5a; 1 << 20]).unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&file)
            .output()
            .expect("losetup runs");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        Loop { dev, file }
    }

    fn name(&self) -> String {
        self.dev.file_name().unwrap().to_string_lossy().into_owned()
    }

    fn nr_tags(&self) -> u16 {
        std::fs::read_to_string(format!("/sys/block/{}/mq/0/nr_tags", self.name()))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

/// One 4 KiB O_DIRECT read, so the request carries this thread's ioprio.
fn direct_read(dev: &Path, offset: u64) {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .unwrap();
    let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
    // SAFETY: non-zero size; freed below with the same layout.
    let p = unsafe { std::alloc::alloc(layout) };
    // SAFETY: p points to 4096 writable bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(p, 4096) };
    let n = f.read_at(buf, offset).unwrap();
    assert_eq!(n, 4096);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(p, layout) };
}

/// Every fresh observation on the queue.
fn drain(reader: &mut QueueReader, depth: u16) -> Vec<Observation> {
    (0..depth)
        .map(|t| reader.take(t))
        .filter(|o| *o != Observation::Stale)
        .collect()
}

#[test]
fn sees_own_io_with_its_priority() {
    if std::env::var_os("IOPRIO_CHANNEL_SKIP_HOST_BPF").is_some() {
        eprintln!("skipped: IOPRIO_CHANNEL_SKIP_HOST_BPF is set");
        return;
    }
    let (channel, mode) = PriorityChannel::open_or_fallback(&Options::default());
    let channel = match (channel, mode) {
        (Some(c), Mode::Bpf) => c,
        (_, Mode::Fallback(Unavailable::NotBuilt))
            if std::env::var_os("IOPRIO_CHANNEL_NO_BPF").is_some() =>
        {
            eprintln!("built without the BPF program on purpose: nothing to attach");
            return;
        }
        (_, Mode::Fallback(Unavailable::NoCapability { detail })) => {
            eprintln!("not privileged ({detail}): only the fallback is checked");
            return;
        }
        (_, mode) => panic!("the side channel should load here as root: {mode}"),
    };
    let lo = Loop::new("a");
    let other = Loop::new("b");
    let depth = lo.nr_tags();

    // I/O before registering is not recorded.
    direct_read(&lo.dev, 0);
    let reg = channel
        .register(dev_t_of_path(&lo.dev).unwrap(), 1, depth)
        .unwrap();
    assert!(matches!(
        channel.register(reg.dev(), 1, depth),
        Err(ioprio_channel::Error::AlreadyRegistered(_))
    ));
    let mut reader = reg.queue_reader(0);
    assert!(
        drain(&mut reader, depth).is_empty(),
        "nothing recorded before I/O"
    );

    // The priority is per thread: keep the test's I/O on one thread.
    let map = ClassMap::default();
    std::thread::scope(|s| {
        s.spawn(|| {
            set_thread_ioprio(RT, 0);
            direct_read(&lo.dev, 4096);
            let seen = drain(&mut reader, depth);
            assert!(!seen.is_empty(), "the RT read was not recorded");
            for o in &seen {
                assert_eq!(
                    o.ioprio(),
                    Some(Ioprio {
                        class: IoprioClass::RealTime,
                        level: 0
                    })
                );
                assert_eq!(o.class(&map, NvmeClass::Medium), NvmeClass::High);
            }
            // Read once: the same slot is stale now.
            assert!(drain(&mut reader, depth).is_empty());

            set_thread_ioprio(IDLE, 0);
            direct_read(&lo.dev, 8192);
            let seen = drain(&mut reader, depth);
            assert!(!seen.is_empty(), "the IDLE read was not recorded");
            for o in &seen {
                assert_eq!(o.ioprio().map(|p| p.class), Some(IoprioClass::Idle));
                assert_eq!(o.class(&map, NvmeClass::Medium), NvmeClass::Low);
            }

            // An unregistered device costs an early return and shows up
            // nowhere.
            set_thread_ioprio(RT, 1);
            direct_read(&other.dev, 0);
            assert!(drain(&mut reader, depth).is_empty());
        });
    });

    // After unregistering, the same device is not recorded; a new
    // registration starts clean with a new generation.
    let dev: DevT = reg.dev();
    drop(reg);
    direct_read(&lo.dev, 0);
    let reg = channel.register(dev, 1, depth).unwrap();
    let mut reader = reg.queue_reader(0);
    assert!(drain(&mut reader, depth).is_empty());
}

#[test]
fn registration_limits() {
    let opts = Options {
        slot_capacity: 100,
        ..Options::default()
    };
    let channel = match PriorityChannel::open(&opts) {
        Ok(c) => c,
        Err(why @ (Unavailable::NoCapability { .. } | Unavailable::NotBuilt)) => {
            eprintln!("side channel unavailable here ({why}): limits not checked");
            return;
        }
        Err(why) => panic!("the side channel should load here: {why}"),
    };
    // Device numbers nobody uses: registration does not need the device.
    let a = DevT::new(4095, 1);
    let b = DevT::new(4095, 2);
    assert!(matches!(
        channel.register(a, 0, 8),
        Err(ioprio_channel::Error::EmptyGeometry { .. })
    ));
    let ra = channel.register(a, 2, 32).unwrap();
    assert!(matches!(
        channel.register(b, 1, 64),
        Err(ioprio_channel::Error::NoSlots {
            needed: 64,
            free: 36,
            ..
        })
    ));
    drop(ra);
    let rb = channel.register(b, 1, 64).unwrap();
    assert_eq!(rb.peek(0, 0), None, "a new registration starts clean");
    assert_eq!(rb.peek(1, 0), None, "outside the geometry");
}
