//! ioprio-probe: loads the ioprio side channel, registers block devices and
//! prints the (hwq, tag, ioprio) it observes for them. Used by the VM
//! scenario `ioprio-channel` and by hand to check a kernel.
//!
//! ```text
//! ioprio-probe [--btf PATH] [--unprivileged] status
//! ioprio-probe [--btf PATH] [--unprivileged] watch DEV... [--seconds N]
//! ```
//!
//! `status` prints `mode: bpf` or `mode: fallback: <reason>` and exits 0
//! either way. `watch` registers each DEV (a path like /dev/nullb0 or a
//! name like nullb0), prints `ready`, then one line per slot change:
//! `observed dev=NAME hwq=H tag=T ioprio=0xRAW class=CLASS level=L nvme=C`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ioprio_channel::{dev_t_of_name, dev_t_of_path, Mode, Options, PriorityChannel};
use qos_core::priority::{ClassMap, Ioprio, IoprioClass};

fn usage() -> ! {
    eprintln!(
        "usage: ioprio-probe [--btf PATH] [--unprivileged] (status | watch DEV... [--seconds N])"
    );
    std::process::exit(2)
}

fn class_name(c: IoprioClass) -> &'static str {
    match c {
        IoprioClass::None => "none",
        IoprioClass::RealTime => "rt",
        IoprioClass::BestEffort => "be",
        IoprioClass::Idle => "idle",
    }
}

/// Reads a sysfs number, for the disk's geometry.
fn sysfs_u16(path: &str) -> Option<u16> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn main() -> anyhow::Result<()> {
    let mut opts = Options::default();
    let mut args = std::env::args().skip(1);
    let mut cmd = None;
    let mut devs = Vec::new();
    let mut seconds: Option<u64> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--btf" => opts.btf_path = PathBuf::from(args.next().unwrap_or_else(|| usage())),
            "--unprivileged" => opts.simulate_unprivileged = true,
            "--seconds" => {
                seconds = Some(
                    args.next()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or_else(|| usage()),
                )
            }
            "status" | "watch" if cmd.is_none() => cmd = Some(a),
            _ if cmd.as_deref() == Some("watch") => devs.push(a),
            _ => usage(),
        }
    }
    let (channel, mode) = PriorityChannel::open_or_fallback(&opts);
    println!("mode: {mode}");
    match cmd.as_deref() {
        Some("status") => Ok(()),
        Some("watch") => {
            let Some(channel) = channel else {
                bail!("side channel unavailable");
            };
            debug_assert_eq!(mode, Mode::Bpf);
            watch(&channel, &devs, seconds.map(Duration::from_secs))
        }
        _ => usage(),
    }
}

fn watch(
    channel: &PriorityChannel,
    devs: &[String],
    limit: Option<Duration>,
) -> anyhow::Result<()> {
    if devs.is_empty() {
        usage();
    }
    let map = ClassMap::default();
    let mut regs = Vec::new();
    for d in devs {
        let name = d.rsplit('/').next().unwrap_or(d).to_string();
        let dev = if d.starts_with('/') {
            dev_t_of_path(d.as_ref())?
        } else {
            dev_t_of_name(d)?
        };
        // Geometry from sysfs: one directory per hardware queue, and its
        // driver tag count.
        let nr_hwq = std::fs::read_dir(format!("/sys/block/{name}/mq"))
            .map(|r| r.count() as u16)
            .unwrap_or(1)
            .max(1);
        let depth = sysfs_u16(&format!("/sys/block/{name}/mq/0/nr_tags")).unwrap_or(1024);
        let reg = channel
            .register(dev, nr_hwq, depth)
            .with_context(|| format!("register {d}"))?;
        println!("registered {name} dev={dev} hw_queues={nr_hwq} depth={depth}");
        let last = vec![0u32; usize::from(nr_hwq) * usize::from(depth)];
        regs.push((name, reg, last));
    }
    println!("ready");
    let start = Instant::now();
    while limit.is_none_or(|l| start.elapsed() < l) {
        for (name, reg, last) in &mut regs {
            let depth = reg.queue_depth();
            for hwq in 0..reg.nr_hw_queues() {
                for tag in 0..depth {
                    let Some(v) = reg.peek(hwq, tag) else {
                        continue;
                    };
                    let seen = &mut last[usize::from(hwq) * usize::from(depth) + usize::from(tag)];
                    if v.seq == *seen {
                        continue;
                    }
                    *seen = v.seq;
                    let p = Ioprio::from_raw(v.ioprio);
                    println!(
                        "observed dev={name} hwq={hwq} tag={tag} ioprio={:#06x} class={} level={} nvme={:?} seq={}",
                        v.ioprio,
                        class_name(p.class),
                        p.level,
                        map.class_of(p),
                        v.seq
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}
