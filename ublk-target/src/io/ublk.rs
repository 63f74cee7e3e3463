//! The one module that talks to `libublk` (pinned at 0.4.8): device
//! creation and recovery, device parameters, one thread per ublk queue with
//! one async task per tag on the queue's io_uring, and the `uring_op` the
//! I/O engine submits its socket operations with.
//!
//! Per tag: FETCH, then loop { map the descriptor ([`crate::io::mapping`]),
//! hand the command to the queue's [`Engine`], await its outcome, COMMIT
//! the result and fetch the next request }.
//!
//! **Zero copy** (`[io] zero_copy = "auto"`, the default): where the driver
//! offers `UBLK_F_AUTO_BUF_REG` (Linux 6.16+), the device is added with it
//! and `UBLK_F_USER_COPY`. The driver then copies nothing between a
//! request's pages and our tag buffers: it registers the pages as fixed
//! buffer `tag` of the queue's ring when it hands the request over (and
//! unregisters them at COMMIT). Large reads are received from the socket
//! straight into those pages (`engine::rx_task`: one copy, the kernel's,
//! as the kernel's own NVMe/TCP host does; before, the data was received
//! into the tag buffer and the driver copied it again). What is left in
//! the tag buffer (read data that came with its headers, a write's data to
//! send) is moved with the user-copy interface: `pread`/`pwrite` on
//! `/dev/ublkcN` at the request's position; a write's large pieces are
//! then spliced to the socket (`engine::send_inline`), which takes our
//! pages by reference. Set lower than its default (never), the volume's
//! `write_pages_min` ([`WRITE_FIXED_MIN_BYTES`]) sends writes of that
//! size or more from the request's pages instead (`WRITE_FIXED` on the
//! socket per piece of data, linked between the headers' sends:
//! `engine::SendPlan`), never in our memory, but copied by the socket.
//! Off where the volume asks for data digests (the digest needs the data
//! in our memory) or the driver lacks it; `status` says which, with the
//! bytes that went direct.

use std::cell::RefCell;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::helpers::IoBuf;
use libublk::io::{UblkDev, UblkQueue};
use libublk::{BufDesc, UblkError, UblkFlags, UblkUringData};

use crate::error::Error;
use crate::io::engine::{self, Engine, TagBuf, TagWait};
use crate::io::mapping::{self, DeviceParams, Op, Plan, ReqFlags};
use crate::io::requests::Submission;
use crate::qos::LimitKind;
use crate::volume::Volume;
use qos_core::priority::NvmeClass;

/// The ublk control device; `UBLK_NVMF_CONTROL` overrides it (tests point
/// it at a missing path to check the "no ublk_drv" message).
pub fn control_path() -> String {
    std::env::var("UBLK_NVMF_CONTROL").unwrap_or_else(|_| "/dev/ublk-control".to_owned())
}

/// Check that ublk can be used here: root, and the driver loaded.
pub fn check_available() -> Result<(), Error> {
    let path = control_path();
    if !Path::new(&path).exists() {
        return Err(Error::NoUblk(path));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::NotRoot);
    }
    Ok(())
}

/// The kernel's device state (`UBLK_S_DEV_*`) of device `id`, if it exists.
pub fn device_state(id: u32) -> Option<DevState> {
    let ctrl = UblkCtrl::new_simple(id as i32).ok()?;
    let info = ctrl.dev_info();
    // Do not let the handle's drop touch the device.
    Some(match u32::from(info.state) {
        libublk::sys::UBLK_S_DEV_LIVE => DevState::Live,
        libublk::sys::UBLK_S_DEV_QUIESCED => DevState::Quiesced,
        libublk::sys::UBLK_S_DEV_DEAD => DevState::Dead,
        _ => DevState::Other,
    })
}

/// A ublk device's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevState {
    /// Served.
    Live,
    /// Its server is gone; waiting for recovery (requests held).
    Quiesced,
    /// Stopped.
    Dead,
    /// Anything else (FAIL_IO).
    Other,
}

/// Delete device `id` (stop it first if live).
pub fn delete_device(id: u32) -> Result<(), Error> {
    let ctrl = UblkCtrl::new_simple(id as i32).map_err(ublk_err)?;
    let _ = ctrl.kill_dev();
    ctrl.del_dev().map_err(ublk_err)?;
    Ok(())
}

fn ublk_err(e: UblkError) -> Error {
    Error::Ublk(e.to_string())
}

/// How to bring the device up.
pub struct Serve {
    /// The volume behind it.
    pub volume: Arc<Volume>,
    /// Recover this existing (quiesced) device instead of adding one.
    pub recover_id: Option<u32>,
    /// Set to stop the device and return.
    pub stop: Arc<AtomicBool>,
}

/// Called once the device is live, with its ID.
pub type OnLive = Box<dyn FnOnce(u32) + Send + Sync>;

/// Serve the device until `stop` is set (then the device is deleted) or
/// the queues go down. Blocks.
pub fn serve(s: Serve, on_live: OnLive) -> Result<u32, Error> {
    check_available()?;
    let vol = Arc::clone(&s.volume);
    let geo = vol.geometry;
    let mut flags = u64::from(libublk::sys::UBLK_F_USER_RECOVERY)
        | u64::from(libublk::sys::UBLK_F_USER_RECOVERY_REISSUE);
    match zero_copy_refused(&vol.config, UblkCtrl::get_features()) {
        None => {
            flags |= u64::from(libublk::sys::UBLK_F_AUTO_BUF_REG)
                | u64::from(libublk::sys::UBLK_F_USER_COPY);
        }
        Some(why) => log::info!("{}: ublk zero copy off: {why}", vol.config.name),
    }
    let (id, dev_flags) = match s.recover_id {
        Some(id) => (id as i32, UblkFlags::UBLK_DEV_F_RECOVER_DEV),
        None => (-1, UblkFlags::UBLK_DEV_F_ADD_DEV),
    };
    let ctrl = UblkCtrlBuilder::default()
        .name("ublk-nvmf")
        .id(id)
        .nr_queues(vol.config.queues)
        .depth(vol.config.queue_depth)
        .io_buf_bytes(geo.max_io_bytes)
        .ctrl_flags(flags)
        .dev_flags(dev_flags)
        .build()
        .map_err(|e| {
            Error::Ublk(format!(
                "{} ublk device: {e}",
                if s.recover_id.is_some() {
                    "recovering the"
                } else {
                    "adding a"
                }
            ))
        })?;
    let dev_id = ctrl.dev_info().dev_id;
    if s.recover_id.is_some() {
        // Waits (up to 30 s) until the driver has let go of the dead
        // server's queues, then the queues below re-FETCH and the driver
        // reissues what was in flight.
        ctrl.start_user_recover()
            .map_err(|e| Error::Ublk(format!("starting recovery of /dev/ublkb{dev_id}: {e}")))?;
    }
    let p = DeviceParams::new(&geo);
    let tgt_init = move |dev: &mut UblkDev| {
        let tgt = &mut dev.tgt;
        tgt.dev_size = geo.size_bytes();
        let mut attrs = 0;
        if p.volatile_cache {
            attrs |= libublk::sys::UBLK_ATTR_VOLATILE_CACHE;
        }
        if p.fua {
            attrs |= libublk::sys::UBLK_ATTR_FUA;
        }
        let mut types = libublk::sys::UBLK_PARAM_TYPE_BASIC;
        if p.max_discard_sectors > 0 || p.max_write_zeroes_sectors > 0 {
            types |= libublk::sys::UBLK_PARAM_TYPE_DISCARD;
        }
        tgt.params = libublk::sys::ublk_params {
            types,
            basic: libublk::sys::ublk_param_basic {
                attrs,
                logical_bs_shift: p.logical_bs_shift,
                physical_bs_shift: p.physical_bs_shift,
                io_opt_shift: p.logical_bs_shift.max(12),
                io_min_shift: p.logical_bs_shift,
                max_sectors: p.max_sectors,
                dev_sectors: p.dev_sectors,
                ..Default::default()
            },
            discard: libublk::sys::ublk_param_discard {
                discard_granularity: p.discard_granularity,
                max_discard_sectors: p.max_discard_sectors,
                max_write_zeroes_sectors: p.max_write_zeroes_sectors,
                max_discard_segments: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        Ok(())
    };
    let qvol = Arc::clone(&vol);
    let q_fn = move |qid: u16, dev: &UblkDev| queue_main(qid, dev, Arc::clone(&qvol));
    let stop = Arc::clone(&s.stop);
    let device_fn = move |c: &UblkCtrl| {
        on_live(c.dev_info().dev_id);
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = c.kill_dev();
    };
    ctrl.run_target(tgt_init, q_fn, device_fn)
        .map_err(|e| Error::Ublk(format!("running the ublk device: {e}")))?;
    if s.stop.load(Ordering::SeqCst) {
        let _ = ctrl.del_dev();
    }
    Ok(dev_id)
}

/// Why the device is not added with zero copy (`None`: it is), given the
/// driver's features (`None`: the driver cannot say, before Linux 6.5).
fn zero_copy_refused(
    cfg: &crate::config::VolumeConfig,
    features: Option<u64>,
) -> Option<&'static str> {
    let auto_reg = u64::from(libublk::sys::UBLK_F_AUTO_BUF_REG);
    let user_copy = u64::from(libublk::sys::UBLK_F_USER_COPY);
    if cfg.zero_copy == crate::config::ZeroCopy::Off {
        Some("[io] zero_copy = \"off\"")
    } else if cfg.data_digest {
        Some("data digests need the data in our memory")
    } else if features.unwrap_or(0) & (auto_reg | user_copy) != auto_reg | user_copy {
        Some("the ublk driver has no automatic buffer registration (Linux 6.16+)")
    } else {
        None
    }
}

/// Zero copy: writes of at least this many bytes are sent from the
/// request's registered pages (`WriteFixed` per piece of data, linked
/// between the headers' `SendMsg`s), never copied into our memory;
/// smaller ones are `pread` into the tag's buffer and sent from there,
/// their pieces of [`engine::SPLICE_MIN_BYTES`] or more spliced to the
/// socket. The default of the volume's run-time `write_pages_min`
/// ([`crate::volume::Stats::write_pages_min`]): never (`max`). A
/// `WriteFixed` is a `write` to the socket, which copies the data into
/// pages it allocates and the kernel zeroes (Debian's `init_on_alloc`);
/// the `pread` copies without allocating and the splice hands the socket
/// our pages, and in the VM bench that was 1.19x the 128k writes per
/// second on the same volumes (docs/benchmarks.md, "Spliced from the
/// queue thread"). `write_pages_min=32k` brings `WriteFixed` back, for a
/// NIC where `SEND_ZC` could make it copy-free.
pub const WRITE_FIXED_MIN_BYTES: u32 = u32::MAX;

/// SQEs as one linked chain on the calling queue thread's ring
/// ([`engine::ChainOp`]): as many as the submission queue has room for
/// (flushing it first if that is fewer than all), pushed in one go so
/// nothing else lands between them.
fn uring_chain(sqes: &[io_uring::squeue::Entry]) -> Pin<Box<dyn Future<Output = Vec<i32>>>> {
    Box::pin(Chain {
        sqes: sqes.to_vec(),
        ops: Vec::new(),
        res: Vec::new(),
    })
}

/// The future of [`uring_chain`]: pushes on its first poll.
struct Chain {
    sqes: Vec<io_uring::squeue::Entry>,
    ops: Vec<Pin<Box<dyn Future<Output = i32>>>>,
    res: Vec<Option<i32>>,
}

impl Future for Chain {
    type Output = Vec<i32>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Vec<i32>> {
        let this = self.get_mut();
        if this.ops.is_empty() {
            let want = this.sqes.len();
            let room = libublk::io::with_task_io_ring_mut(|r| {
                let free = |r: &mut io_uring::IoUring| {
                    let sq = r.submission();
                    sq.capacity() - sq.len()
                };
                if free(r) < want {
                    // What is queued goes now (the event loop would
                    // submit it next anyway); the ring is then empty.
                    let _ = r.submit();
                }
                free(r)
            });
            let n = want.min(room).max(1);
            for (i, sqe) in this.sqes.drain(..n).enumerate() {
                let sqe = if i + 1 < n {
                    sqe.flags(io_uring::squeue::Flags::IO_LINK)
                } else {
                    sqe
                };
                // Lazy: each pushes its SQE on its first poll, below, in
                // order and within this one poll.
                this.ops.push(uring_op(sqe));
                this.res.push(None);
            }
        }
        let mut pending = false;
        for (op, res) in this.ops.iter_mut().zip(this.res.iter_mut()) {
            if res.is_none() {
                match op.as_mut().poll(cx) {
                    std::task::Poll::Ready(r) => *res = Some(r),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(this.res.iter().map(|r| r.unwrap_or(-libc::EIO)).collect())
    }
}

/// An io_uring operation on the calling queue thread's ring.
fn uring_op(sqe: io_uring::squeue::Entry) -> Pin<Box<dyn Future<Output = i32>>> {
    Box::pin(async move {
        libublk::uring_async::ublk_submit_sqe_async(sqe, UblkUringData::Target as u64)
            .await
            .unwrap_or(-libc::EIO)
    })
}

fn queue_main(qid: u16, dev: &UblkDev, vol: Arc<Volume>) {
    let depth = dev.dev_info.queue_depth;
    let buf_bytes = dev.dev_info.max_io_buf_bytes as usize;
    // Declared first so they outlive the executor and the engine that
    // points into them (see `engine::TagBuf`).
    let bufs: Rc<Vec<IoBuf<u8>>> = Rc::new((0..depth).map(|_| IoBuf::new(buf_bytes)).collect());
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            log::error!("ublk queue {qid}: {e}");
            return;
        }
    };
    let engine = Rc::new(RefCell::new(Engine::new(Arc::clone(&vol), qid, depth)));
    // The device's flags, not the config: a recovered device keeps the
    // ones it was added with.
    let zero_copy = dev.dev_info.flags & u64::from(libublk::sys::UBLK_F_AUTO_BUF_REG) != 0;
    if zero_copy {
        engine
            .borrow_mut()
            .set_zero_copy(bufs.iter().map(|b| b.as_ptr() as usize).collect());
    }
    engine.borrow_mut().try_connect(Instant::now());
    let exe = smol::LocalExecutor::new();
    let mut tag_tasks = Vec::new();
    let prio = Rc::new(RefCell::new(PrioReader { qid, reader: None }));
    for tag in q.tags() {
        let q = Rc::clone(&q);
        let bufs = Rc::clone(&bufs);
        let engine = Rc::clone(&engine);
        let vol = Arc::clone(&vol);
        let prio = Rc::clone(&prio);
        tag_tasks.push(exe.spawn(async move {
            let buf = &bufs[usize::from(tag)];
            match tag_task(&q, tag, buf, zero_copy, &engine, &vol, &prio).await {
                Err(UblkError::QueueIsDown) | Ok(()) => {}
                Err(e) => log::error!("ublk queue {qid} tag {tag}: {e}"),
            }
        }));
    }
    let paths = engine.borrow().path_count();
    for p in 0..paths {
        exe.spawn(engine::rx_task(
            Rc::clone(&engine),
            p,
            uring_op,
            uring_chain,
        ))
        .detach();
        exe.spawn(engine::tx_task(Rc::clone(&engine), p, uring_chain))
            .detach();
    }
    exe.spawn(engine::tick_task(Rc::clone(&engine), uring_op))
        .detach();
    exe.spawn(engine::pace_task(Rc::clone(&engine), uring_op))
        .detach();
    smol::block_on(exe.run(async {
        let run_ops = || while exe.try_tick() {};
        let done = || tag_tasks.iter().all(|t| t.is_finished());
        if let Err(e) = libublk::wait_and_handle_io_events(&q, None, run_ops, done).await {
            log::error!("ublk queue {qid}: {e}");
        }
    }));
    // A Recv straight into a tag's buffer (engine::rx_task), or a SendMsg
    // reading a write's data from one (engine::tx_task), may still be in
    // the ring when the loop ends (an error, or the queue going down with
    // a read's data due): the kernel could use the buffers after this
    // thread freed them. Keep them: the queue thread ends only when the
    // device does, and the process (one per volume) exits soon after.
    std::mem::forget(bufs);
}

/// The ioprio side channel's reader of one ublk queue, created once the
/// device is registered (after START_DEV; requests before that use the
/// fallback class).
struct PrioReader {
    qid: u16,
    reader: Option<ioprio_channel::QueueReader>,
}

impl PrioReader {
    /// The NVMe class of the request that just arrived on `tag`.
    fn class_of(&mut self, vol: &Volume, tag: u16) -> NvmeClass {
        let pc = &vol.priority.config;
        if self.reader.is_none() {
            if !vol.priority.side_channel() {
                return pc.class;
            }
            self.reader = vol.priority.reader(self.qid);
        }
        match self.reader.as_mut() {
            Some(r) => r.take(tag).class(&pc.map, pc.class),
            None => pc.class,
        }
    }
}

/// The driver's auto registration of tag `tag`'s request: fixed buffer
/// number `tag` of the queue's ring.
fn auto_reg(tag: u16) -> BufDesc<'static> {
    BufDesc::AutoReg(libublk::sys::ublk_auto_buf_reg {
        index: tag,
        ..Default::default()
    })
}

/// Zero copy: move `len` bytes between our memory at `ptr` and tag `tag`'s
/// request at `offset` (`into_request`: a read's data into its pages;
/// else a write's data out of them) with the driver's user-copy interface:
/// `pwrite`/`pread` on `/dev/ublkcN` (`cdev`) at the request's position.
/// A plain syscall, not an SQE: the driver only copies between our memory
/// and the request's pages (it never blocks), and an SQE would add a ring
/// round trip before the COMMIT (measured: 4k QD 1 reads lost ~20 %).
/// Returns the error (negative errno) of a failed or empty transfer.
fn user_copy(
    cdev: i32,
    qid: u16,
    tag: u16,
    into_request: bool,
    offset: u32,
    ptr: *mut u8,
    len: u32,
) -> Result<(), i32> {
    let mut done = 0;
    while done < len {
        let pos = libublk::io::UblkIOCtx::ublk_user_copy_pos(qid, tag, offset + done);
        let n = (len - done) as usize;
        // SAFETY: `ptr..ptr + len` is within the tag's buffer, which
        // outlives the queue (queue_main keeps it); `cdev` is the device's
        // open char device.
        let r = unsafe {
            let at = ptr.add(done as usize);
            if into_request {
                libc::pwrite(cdev, at as *const libc::c_void, n, pos as libc::off_t)
            } else {
                libc::pread(cdev, at as *mut libc::c_void, n, pos as libc::off_t)
            }
        };
        match r {
            n if n > 0 => done += n as u32,
            0 => return Err(-libc::EIO),
            _ => {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO);
                if e != libc::EINTR {
                    return Err(-e);
                }
            }
        }
    }
    Ok(())
}

async fn tag_task(
    q: &UblkQueue<'_>,
    tag: u16,
    buf: &IoBuf<u8>,
    zero_copy: bool,
    engine: &Rc<RefCell<Engine>>,
    vol: &Volume,
    prio: &RefCell<PrioReader>,
) -> Result<(), UblkError> {
    if zero_copy {
        q.submit_io_prep_cmd(tag, auto_reg(tag), 0, None).await?;
    } else {
        q.submit_io_prep_cmd(tag, BufDesc::Slice(buf.as_slice()), 0, Some(buf))
            .await?;
    }
    let qid = q.get_qid();
    let cdev = q.dev.tgt.fds[0];
    let geo = vol.geometry;
    let stats = &vol.stats;
    loop {
        let iod = q.get_iod(tag);
        let op = Op::from_ublk(iod.op_flags & 0xff);
        let flags = ReqFlags::from_ublk(iod.op_flags);
        let nr_sectors = iod.nr_sectors;
        // Read the side channel's slot for every request, even one
        // completed locally, so the next request on this tag is not
        // mistaken for this one.
        let nvme_class = prio.borrow_mut().class_of(vol, tag);
        let plan = mapping::map_request(&geo, op, iod.start_sector, nr_sectors, flags);
        let res = match plan {
            Plan::Complete(r) => r,
            Plan::Send {
                command,
                data_len,
                dsm_range,
            } => {
                if let Some(r) = dsm_range {
                    // SAFETY: the buffer is at least 4 KiB and ours until
                    // the commit below.
                    unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), buf.as_mut_ptr(), 16) };
                }
                // An eVol's discard needs room for one range list per
                // part (each copy's physical LBA differs).
                let data_len = if vol.evol.is_some() && dsm_range.is_some() {
                    crate::io::requests::EVOL_DSM_BYTES as u32
                } else {
                    data_len
                };
                let data = (data_len > 0).then(|| {
                    // SAFETY: `buf` outlives the engine (queue_main) and is
                    // not touched until TagWait returns.
                    unsafe { TagBuf::exclusive(buf.as_mut_ptr(), data_len as usize) }
                });
                let kind = match op {
                    Op::Read => LimitKind::Read,
                    Op::Write => LimitKind::Write,
                    _ => LimitKind::Other,
                };
                // What the intent log of a replicated volume records:
                // every op that changes data.
                let start = iod.start_sector << 9;
                let write = matches!(op, Op::Write | Op::Discard | Op::WriteZeroes)
                    .then(|| start..start + (u64::from(nr_sectors) << 9));
                let sent = std::time::Instant::now();
                // A large write's data stays in the request's pages (sent
                // from there, `engine::SendPlan`); set for every request,
                // so the flag never outlives the write it was for.
                let zc_write = zero_copy && op == Op::Write && data_len > 0;
                let in_request = engine
                    .borrow_mut()
                    .data_in_request(tag, zc_write && data_len >= stats.write_pages_min());
                if in_request {
                    stats
                        .zc_write_direct
                        .fetch_add(u64::from(data_len), Ordering::Relaxed);
                } else if zc_write {
                    // The driver no longer copies the data into the tag's
                    // buffer: fetch it (the sends read it from there).
                    if let Err(e) = user_copy(cdev, qid, tag, false, 0, buf.as_mut_ptr(), data_len)
                    {
                        log::error!(
                            "{}: reading a write's data from the driver: errno {}",
                            vol.config.name,
                            -e
                        );
                        q.submit_io_commit_cmd(tag, auto_reg(tag), -libc::EIO)
                            .await?;
                        continue;
                    }
                }
                engine.borrow_mut().submit(Submission {
                    tag,
                    command,
                    buf: data,
                    kind,
                    bytes: u64::from(nr_sectors) << 9,
                    class: nvme_class,
                    write,
                });
                let mut ok = TagWait {
                    engine: Rc::clone(engine),
                    tag,
                }
                .await;
                if zero_copy && ok && op == Op::Read {
                    // What did not go straight into the request's pages.
                    let copied = engine.borrow_mut().take_copied(tag, data_len);
                    for (a, b) in copied {
                        // SAFETY: within the tag's buffer (a..b <= data_len).
                        let at = unsafe { buf.as_mut_ptr().add(a as usize) };
                        if let Err(e) = user_copy(cdev, qid, tag, true, a, at, b - a) {
                            log::error!(
                                "{}: copying read data to the driver: errno {}",
                                vol.config.name,
                                -e
                            );
                            ok = false;
                            break;
                        }
                    }
                }
                let op_index = match op {
                    Op::Read => 0,
                    Op::Write => 1,
                    Op::Flush => 2,
                    _ => 3,
                };
                stats.latency[op_index].observe(sent.elapsed());
                if ok {
                    let bytes = u64::from(nr_sectors) << 9;
                    let (n, b) = match op {
                        Op::Read => (&stats.reads, Some(&stats.read_bytes)),
                        Op::Write => (&stats.writes, Some(&stats.write_bytes)),
                        Op::Flush => (&stats.flushes, None),
                        _ => (&stats.discards, None),
                    };
                    n.fetch_add(1, Ordering::Relaxed);
                    if let Some(b) = b {
                        b.fetch_add(bytes, Ordering::Relaxed);
                        let c = nvme_class.index();
                        stats.class_ios[c].fetch_add(1, Ordering::Relaxed);
                        stats.class_bytes[c].fetch_add(bytes, Ordering::Relaxed);
                    }
                }
                mapping::result_for(ok, nr_sectors)
            }
        };
        if zero_copy {
            q.submit_io_commit_cmd(tag, auto_reg(tag), res).await?;
        } else {
            q.submit_io_commit_cmd(tag, BufDesc::Slice(buf.as_slice()), res)
                .await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_constants_match_the_driver_abi() {
        use libublk::sys;
        assert_eq!(Op::from_ublk(sys::UBLK_IO_OP_READ), Op::Read);
        assert_eq!(Op::from_ublk(sys::UBLK_IO_OP_WRITE), Op::Write);
        assert_eq!(Op::from_ublk(sys::UBLK_IO_OP_FLUSH), Op::Flush);
        assert_eq!(Op::from_ublk(sys::UBLK_IO_OP_DISCARD), Op::Discard);
        assert_eq!(Op::from_ublk(sys::UBLK_IO_OP_WRITE_ZEROES), Op::WriteZeroes);
        assert_eq!(ReqFlags::UBLK_FUA, sys::UBLK_IO_F_FUA);
        assert_eq!(ReqFlags::UBLK_NOUNMAP, sys::UBLK_IO_F_NOUNMAP);
    }

    #[test]
    fn zero_copy_needs_the_driver_the_config_and_no_data_digest() {
        use crate::config::VolumeConfig;
        let cfg = |io: &str| {
            let src = format!(
                "name = \"v\"\n[target]\naddress = \"127.0.0.1\"\nsubnqn = \"nqn.2026-01.io.x:y\"\n[io]\n{io}\n"
            );
            VolumeConfig::parse(Path::new("v.toml"), &src).unwrap()
        };
        let all = u64::from(libublk::sys::UBLK_F_AUTO_BUF_REG | libublk::sys::UBLK_F_USER_COPY);
        let old = u64::from(libublk::sys::UBLK_F_USER_COPY);
        assert_eq!(zero_copy_refused(&cfg(""), Some(all)), None);
        assert!(zero_copy_refused(&cfg(""), Some(old))
            .unwrap()
            .contains("6.16"));
        assert!(zero_copy_refused(&cfg(""), None).is_some());
        assert!(zero_copy_refused(&cfg("zero_copy = \"off\""), Some(all))
            .unwrap()
            .contains("off"));
        assert!(zero_copy_refused(&cfg("data_digest = true"), Some(all))
            .unwrap()
            .contains("digest"));
    }

    #[test]
    fn a_missing_control_device_is_named() {
        std::env::set_var("UBLK_NVMF_CONTROL", "/nonexistent/ublk-control");
        let e = check_available().unwrap_err();
        std::env::remove_var("UBLK_NVMF_CONTROL");
        assert!(e.to_string().contains("modprobe ublk_drv"), "{e}");
    }
}
