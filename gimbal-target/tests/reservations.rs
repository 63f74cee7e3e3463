//! NVMe reservations between our initiator and gimbal-target over
//! loopback: several hosts (different host identifiers) on one namespace,
//! every type's access for holder, registrant and others, preempt and
//! preempt-and-abort, release and clear, the report and its generation,
//! the registrant limit, the notification log, and PTPL across a restart
//! on a file backend. The kernel host's `nvme resv-*` against the target:
//! `tests/vm/scenarios/reservations.sh`.

mod support;

use std::time::Duration;

use gimbal_target::frontend::reservation::MAX_REGISTRANTS;
use nvmf_initiator::blocking::{ConnectOptions, Controller, HostIdentity};
use nvmf_initiator::{Command, Error, Request};
use nvmf_proto::command::log_id;
use nvmf_proto::fabrics::PriorityClass;
use nvmf_proto::reservation::{
    cptpl, notification_type, ReservationAcquire, ReservationNotification, ReservationRegister,
    ReservationRelease, ReservationReport, ReservationType as T, NOTIFICATION_LOG_LEN,
};
use nvmf_proto::Status;
use support::{start_target, DEMO_NQN};

fn config(backend: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:0\"]\n\
         [[subsystem]]\nnqn = \"{DEMO_NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\n{backend}\n"
    )
}

fn ram() -> String {
    config("backend = \"ram\"\nsize = \"4MiB\"")
}

/// A host with its own host identifier `n`.
fn host(addr: std::net::SocketAddr, n: u8) -> Controller {
    let mut o = ConnectOptions::new(addr, DEMO_NQN);
    let mut id = [0u8; 16];
    id[0] = n;
    id[15] = 0x5A;
    o.host = HostIdentity {
        nqn: format!("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000{n:02x}"),
        id,
    };
    o.io_queues = 2;
    o.connect_timeout = Duration::from_secs(5);
    Controller::connect(o).expect("host connects")
}

fn register(c: &Controller, key: u64) -> Result<(), Error> {
    c.reservation_register(&ReservationRegister::register(1, key))
}

/// Ok(()) for access, Err(()) for Reservation Conflict; anything else
/// fails the test.
fn access(r: Result<(), Error>) -> Result<(), ()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.is_reservation_conflict() => Err(()),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn can_read(c: &Controller) -> bool {
    let mut buf = vec![0u8; 4096];
    access(c.read(1, 0, &mut buf)).is_ok()
}

fn can_write(c: &Controller) -> bool {
    access(c.write(1, 0, &[0x11; 4096])).is_ok()
}

fn notification(c: &Controller) -> ReservationNotification {
    let page = c
        .get_log_page(log_id::RESERVATION_NOTIFICATION, 0xFFFF_FFFF, 64, 0)
        .unwrap();
    ReservationNotification::from_bytes(&page[..NOTIFICATION_LOG_LEN]).unwrap()
}

#[test]
fn every_type_gives_holder_registrant_and_others_the_access_the_table_says() {
    let t = start_target(&ram());
    let addr = t.local_addrs()[0];
    let (a, b, c) = (host(addr, 1), host(addr, 2), host(addr, 3));
    // Holder read/write, registrant read/write, other read/write.
    let table = [
        (T::WriteExclusive, [true, true, true, false, true, false]),
        (T::ExclusiveAccess, [true, true, false, false, false, false]),
        (
            T::WriteExclusiveRegistrantsOnly,
            [true, true, true, true, true, false],
        ),
        (
            T::ExclusiveAccessRegistrantsOnly,
            [true, true, true, true, false, false],
        ),
        (
            T::WriteExclusiveAllRegistrants,
            [true, true, true, true, true, false],
        ),
        (
            T::ExclusiveAccessAllRegistrants,
            [true, true, true, true, false, false],
        ),
    ];
    for (rtype, expect) in table {
        register(&a, 1).unwrap();
        register(&b, 2).unwrap();
        a.reservation_acquire(&ReservationAcquire::acquire(1, rtype, 1))
            .unwrap();
        let got = [
            can_read(&a),
            can_write(&a),
            can_read(&b),
            can_write(&b),
            can_read(&c),
            can_write(&c),
        ];
        assert_eq!(got, expect, "{rtype:?}");
        let report = a.reservation_report(1).unwrap();
        assert_eq!(report.reservation_type(), Some(rtype));
        let holders: Vec<bool> = report.registrants.iter().map(|r| r.holds).collect();
        assert_eq!(holders, [true, rtype.all_registrants()], "{rtype:?}");
        // Clear for the next type; everyone has access again.
        b.reservation_release(&ReservationRelease::clear(1, 2))
            .unwrap();
        assert!(can_write(&c));
    }
    t.shutdown();
}

#[test]
fn preempt_and_abort_fences_the_old_holder_and_the_report_shows_it() {
    let t = start_target(&ram());
    let addr = t.local_addrs()[0];
    let (old, new) = (host(addr, 1), host(addr, 2));
    register(&old, 0x1111).unwrap();
    old.reservation_acquire(&ReservationAcquire::acquire(1, T::WriteExclusive, 0x1111))
        .unwrap();
    register(&new, 0x2222).unwrap();
    assert!(!can_write(&new), "the non-holder's write conflicts");
    let before = new.reservation_report(1).unwrap();
    assert_eq!(before.generation, 2);
    new.reservation_acquire(&ReservationAcquire::preempt(
        1,
        T::WriteExclusive,
        0x2222,
        0x1111,
        true,
    ))
    .unwrap();
    assert!(!can_write(&old), "the preempted host is fenced");
    assert!(can_read(&old), "Write Exclusive still lets it read");
    assert!(can_write(&new));
    let r = old.reservation_report(1).unwrap();
    assert_eq!(r.generation, 3, "a preempt bumps the generation");
    assert_eq!(r.regctl, 1);
    assert_eq!(r.registrants.len(), 1);
    assert_eq!(r.registrants[0].rkey, 0x2222);
    assert_eq!(r.registrants[0].cntlid, 0xFFFF);
    assert!(r.registrants[0].holds);
    assert_eq!(r.registrants[0].host_id[0], 2);
    assert!(!r.ptpls);
    // The old holder is told, once, and only it.
    let n = notification(&old);
    assert_eq!(n.log_type, notification_type::REGISTRATION_PREEMPTED);
    assert_eq!((n.nsid, n.count, n.available), (1, 1, 0));
    assert!(notification(&old).is_empty());
    assert!(notification(&new).is_empty());
    // Its old key is gone: acquiring with it conflicts.
    let e = old
        .reservation_acquire(&ReservationAcquire::acquire(1, T::WriteExclusive, 0x1111))
        .unwrap_err();
    assert!(e.is_reservation_conflict(), "{e}");
    t.shutdown();
}

#[test]
fn preempt_and_abort_completes_only_after_the_old_holders_writes() {
    // A slow device: the old holder's writes are still at the backend
    // when the preempt arrives. They fit in the capsule, so the target
    // admits them as they arrive (an R2T write would wait for this
    // thread to pump its data).
    let t = start_target(&config(
        "backend = \"sim\"\nsize = \"16MiB\"\ntime_scale = 200",
    ));
    let addr = t.local_addrs()[0];
    let (old, new) = (host(addr, 1), host(addr, 2));
    register(&old, 1).unwrap();
    old.reservation_acquire(&ReservationAcquire::acquire(1, T::WriteExclusive, 1))
        .unwrap();
    register(&new, 2).unwrap();
    let mut q = old.io_queue(PriorityClass::Medium).unwrap();
    for i in 0..16u64 {
        q.submit(Request {
            command: Command::Write {
                nsid: 1,
                slba: i * 16,
                block_size: 512,
                fua: false,
            },
            buf: Some(vec![0xA5; 8192]),
            user_data: i,
        });
    }
    q.flush();
    // Wait (untimed) until the target has admitted some of them.
    let old_ctrl = t
        .target()
        .controllers()
        .into_iter()
        .find(|c| c.host_id[0] == 1)
        .unwrap();
    while old_ctrl.ns_inflight[&1].in_flight() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    new.reservation_acquire(&ReservationAcquire::preempt(
        1,
        T::WriteExclusive,
        2,
        1,
        true,
    ))
    .unwrap();
    // The acquire has completed: nothing the old holder had admitted is
    // still on its way to the backend (without the drain, the slow
    // device still holds some). The new owner overwrites every range; no
    // old write may land on top of it.
    assert_eq!(old_ctrl.ns_inflight[&1].in_flight(), 0);
    for i in 0..16u64 {
        new.write(1, i * 16, &[0x5A; 8192]).unwrap();
    }
    let (mut done, mut landed) = (0, 0);
    while let Some(c) = q.wait() {
        let s = c.result.unwrap().status;
        landed += usize::from(s.is_success());
        assert!(
            s.is_success() || s.is_reservation_conflict() || s.same_code(Status::ABORTED_PREEMPT),
            "{s}"
        );
        done += 1;
    }
    assert_eq!(done, 16);
    assert!(
        landed > 0,
        "some old writes were admitted before the preempt"
    );
    let mut back = vec![0u8; 8192];
    for i in 0..16u64 {
        new.read(1, i * 16, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0x5A), "range {i} was overwritten");
    }
    assert!(!can_write(&old));
    t.shutdown();
}

#[test]
fn register_replace_unregister_release_and_clear() {
    let t = start_target(&ram());
    let addr = t.local_addrs()[0];
    let (a, b) = (host(addr, 1), host(addr, 2));
    // Not registered: acquire, release and unregister conflict.
    let e = a
        .reservation_acquire(&ReservationAcquire::acquire(1, T::ExclusiveAccess, 5))
        .unwrap_err();
    assert!(matches!(e, Error::ReservationConflict { .. }), "{e}");
    register(&a, 5).unwrap();
    register(&a, 5).unwrap();
    assert!(register(&a, 6).unwrap_err().is_reservation_conflict());
    a.reservation_register(&ReservationRegister::replace(1, 5, 7))
        .unwrap();
    assert!(a
        .reservation_register(&ReservationRegister::replace(1, 5, 8))
        .unwrap_err()
        .is_reservation_conflict());
    let mut iekey = ReservationRegister::replace(1, 999, 8);
    iekey.iekey = true;
    a.reservation_register(&iekey).unwrap();
    assert_eq!(a.reservation_report(1).unwrap().generation, 4);
    register(&b, 9).unwrap();
    a.reservation_acquire(&ReservationAcquire::acquire(
        1,
        T::ExclusiveAccessRegistrantsOnly,
        8,
    ))
    .unwrap();
    // A release with another type is Invalid Field; by a non-holder, a
    // no-op success; by the holder, the end of the reservation and a
    // notice to the other registrant.
    let e = a
        .reservation_release(&ReservationRelease::release(1, T::ExclusiveAccess, 8))
        .unwrap_err();
    assert!(
        matches!(e, Error::CommandFailed { status, .. } if status.same_code(Status::INVALID_FIELD))
    );
    b.reservation_release(&ReservationRelease::release(
        1,
        T::ExclusiveAccessRegistrantsOnly,
        9,
    ))
    .unwrap();
    assert!(a.reservation_report(1).unwrap().rtype != 0);
    a.reservation_release(&ReservationRelease::release(
        1,
        T::ExclusiveAccessRegistrantsOnly,
        8,
    ))
    .unwrap();
    let r = b.reservation_report(1).unwrap();
    assert_eq!((r.rtype, r.regctl), (0, 2));
    assert_eq!(
        notification(&b).log_type,
        notification_type::RESERVATION_RELEASED
    );
    // Clear: everything goes, the others hear it was preempted.
    let gen = r.generation;
    a.reservation_acquire(&ReservationAcquire::acquire(1, T::WriteExclusive, 8))
        .unwrap();
    b.reservation_release(&ReservationRelease::clear(1, 9))
        .unwrap();
    let r = a.reservation_report(1).unwrap();
    assert_eq!((r.rtype, r.regctl, r.generation), (0, 0, gen + 1));
    assert!(r.registrants.is_empty());
    assert_eq!(
        notification(&a).log_type,
        notification_type::RESERVATION_PREEMPTED
    );
    // Unregister.
    register(&a, 1).unwrap();
    a.reservation_register(&ReservationRegister::unregister(1, 1))
        .unwrap();
    assert!(a
        .reservation_register(&ReservationRegister::unregister(1, 1))
        .unwrap_err()
        .is_reservation_conflict());
    t.shutdown();
}

#[test]
fn a_host_with_several_controllers_is_one_registrant() {
    let t = start_target(&ram());
    let addr = t.local_addrs()[0];
    let (a1, a2, b) = (host(addr, 1), host(addr, 1), host(addr, 2));
    register(&a1, 1).unwrap();
    // Same host, same key, through its other controller.
    register(&a2, 1).unwrap();
    a1.reservation_acquire(&ReservationAcquire::acquire(1, T::ExclusiveAccess, 1))
        .unwrap();
    assert!(can_write(&a2) && can_read(&a2));
    assert!(!can_read(&b));
    assert_eq!(b.reservation_report(1).unwrap().regctl, 1);
    t.shutdown();
}

#[test]
fn the_registrant_limit_is_refused_with_capacity_exceeded() {
    let t = start_target(&ram());
    let addr = t.local_addrs()[0];
    for n in 0..MAX_REGISTRANTS {
        let c = host(addr, n as u8);
        register(&c, 100 + n as u64).unwrap();
        c.disconnect().unwrap();
    }
    let extra = host(addr, MAX_REGISTRANTS as u8);
    let e = register(&extra, 1).unwrap_err();
    assert!(
        matches!(e, Error::CommandFailed { status, .. } if status.same_code(Status::CAPACITY_EXCEEDED)),
        "{e}"
    );
    // The report holds every registrant (64 x 64 bytes need a second,
    // larger report: REGCTL says how many).
    let r = extra.reservation_report(1).unwrap();
    assert_eq!(r.regctl as usize, MAX_REGISTRANTS);
    assert_eq!(r.registrants.len(), MAX_REGISTRANTS);
    t.shutdown();
}

#[test]
fn a_report_without_the_extended_structure_or_too_short_is_refused() {
    let t = start_target(&ram());
    let addr = t.local_addrs()[0];
    let a = host(addr, 1);
    let mut q = a.io_queue(PriorityClass::Medium).unwrap();
    let mut status_of = |cmd: ReservationReport, len: usize| {
        q.submit(Request {
            command: Command::Raw(cmd.to_sqe(0)),
            buf: Some(vec![0; len]),
            user_data: 0,
        });
        q.wait().unwrap().result.unwrap().status
    };
    let s = status_of(ReservationReport::new(1, 4096, false).unwrap(), 4096);
    assert!(
        s.same_code(Status::HOST_ID_INCONSISTENT_FORMAT) && s.dnr,
        "{s}"
    );
    let s = status_of(ReservationReport::new(1, 32, true).unwrap(), 32);
    assert!(s.same_code(Status::INVALID_FIELD), "{s}");
    let mut wrong_ns = ReservationReport::new(1, 4096, true).unwrap();
    wrong_ns.nsid = 9;
    let s = status_of(wrong_ns, 4096);
    assert!(s.same_code(Status::INVALID_NAMESPACE), "{s}");
    t.shutdown();
}

#[test]
fn reservations_survive_a_restart_when_ptpl_is_set_on_a_file_backend() {
    let dir = std::env::temp_dir().join(format!("gimbal-ptpl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ns1.img");
    let cfg = config(&format!(
        "backend = \"file\"\npath = \"{}\"\nsize = \"4MiB\"",
        path.display()
    ));
    let t = start_target(&cfg);
    let addr = t.local_addrs()[0];
    let (a, b) = (host(addr, 1), host(addr, 2));
    let mut reg = ReservationRegister::register(1, 0xFEED);
    reg.cptpl = cptpl::SET;
    a.reservation_register(&reg).unwrap();
    register(&b, 0xBEEF).unwrap();
    a.reservation_acquire(&ReservationAcquire::acquire(1, T::ExclusiveAccess, 0xFEED))
        .unwrap();
    let before = a.reservation_report(1).unwrap();
    assert!(before.ptpls);
    drop((a, b));
    t.shutdown();
    assert!(
        std::path::Path::new(&format!("{}.resv", path.display())).exists(),
        "the sidecar is written"
    );

    // A restarted target: the old owner's fence holds.
    let t = start_target(&cfg);
    let addr = t.local_addrs()[0];
    let (a, b, c) = (host(addr, 1), host(addr, 2), host(addr, 3));
    assert_eq!(b.reservation_report(1).unwrap(), before);
    assert!(!can_read(&b) && !can_write(&c));
    assert!(can_write(&a));
    // Clearing PTPL forgets the sidecar: the next restart starts empty.
    let mut clear = ReservationRegister::replace(1, 0xFEED, 0xFEED);
    clear.cptpl = cptpl::CLEAR;
    a.reservation_register(&clear).unwrap();
    drop((a, b, c));
    t.shutdown();
    let t = start_target(&cfg);
    let c = host(t.local_addrs()[0], 3);
    let r = c.reservation_report(1).unwrap();
    assert_eq!((r.regctl, r.rtype, r.ptpls), (0, 0, false));
    assert!(can_write(&c));
    t.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn volatile_backends_refuse_ptpl_and_advertise_every_type() {
    let t = start_target(&ram());
    let a = host(t.local_addrs()[0], 1);
    let mut reg = ReservationRegister::register(1, 1);
    reg.cptpl = cptpl::SET;
    let e = a.reservation_register(&reg).unwrap_err();
    assert!(
        matches!(e, Error::CommandFailed { status, .. } if status.same_code(Status::INVALID_FIELD))
    );
    let id = a.identify_controller().unwrap();
    assert_ne!(id.oncs & nvmf_proto::identify::oncs::RESERVATIONS, 0);
    t.shutdown();
}
