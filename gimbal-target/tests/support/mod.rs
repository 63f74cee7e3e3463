//! A minimal, scriptable NVMe/TCP host for testing the target from the
//! wire: every step is explicit so tests can stop anywhere, send something
//! malformed, and look at exactly what comes back.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use gimbal_target::config::TargetConfig;
use gimbal_target::server::{spawn, TargetHandle};
use nvmf_proto::command::{cns, AdminCommand, Identify, IoCommand};
use nvmf_proto::fabrics::{
    property, Connect, ConnectData, ControllerConfiguration, PriorityClass, PropertyGet,
    PropertySet, CNTLID_DYNAMIC,
};
use nvmf_proto::features::{feature_id, NumberOfQueues};
use nvmf_proto::pdu::{CapsuleCmd, EncodeConfig, H2CData, IcReq, IcResp, Negotiated, Pdu, Role};
use nvmf_proto::{Cqe, Decoded, DecoderConfig, PduDecoder, SglDescriptor, Sqe};

pub const DEMO_NQN: &str = "nqn.2026-01.io.gimbal:demo";
pub const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
/// The host identifier the test host sends in Connect.
pub const HOST_ID: [u8; 16] = [7; 16];

/// What [`TestHost::recv_within`] saw.
#[derive(Debug)]
pub enum Polled {
    Pdu(Pdu<'static>),
    Closed,
    Nothing,
}

/// Starts a target from TOML text on an ephemeral loopback port.
pub fn start_target(toml: &str) -> TargetHandle {
    let _ = env_logger::builder().is_test(true).try_init();
    let cfg = TargetConfig::parse(Path::new("test.toml"), toml).expect("test config");
    spawn(cfg).expect("target starts")
}

/// The shipped example, on an ephemeral port.
pub fn demo_target() -> TargetHandle {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/target.toml"))
            .unwrap()
            .replace("127.0.0.1:4420", "127.0.0.1:0");
    start_target(&text)
}

pub struct TestHost {
    pub stream: TcpStream,
    decoder: PduDecoder,
    buf: Vec<u8>,
    pub enc: EncodeConfig,
    next_cid: u16,
    pub cntlid: u16,
    pub maxh2cdata: u32,
}

impl TestHost {
    pub fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).expect("tcp connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        TestHost {
            stream,
            decoder: PduDecoder::new(DecoderConfig {
                max_data_len: 4 << 20,
                ..DecoderConfig::new(Role::Host)
            }),
            buf: Vec::new(),
            enc: EncodeConfig::default(),
            next_cid: 1,
            cntlid: 0,
            maxh2cdata: 0,
        }
    }

    pub fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        self.next_cid
    }

    pub fn send(&mut self, pdu: &Pdu<'_>) {
        let bytes = pdu.to_vec(&self.enc).expect("encodable");
        self.stream.write_all(&bytes).expect("send");
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// The next PDU, or None if the target closed the connection.
    pub fn recv_or_close(&mut self) -> Option<Pdu<'static>> {
        loop {
            match self
                .decoder
                .decode(&self.buf)
                .expect("target sent a valid PDU")
            {
                Decoded::Pdu { pdu, consumed } => {
                    let pdu = pdu.into_owned();
                    self.buf.drain(..consumed);
                    return Some(pdu);
                }
                Decoded::NeedMore(_) => {
                    let mut chunk = [0u8; 65536];
                    match self.stream.read(&mut chunk) {
                        Ok(0) => return None,
                        Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                        Err(e) => panic!("no answer from target: {e}"),
                    }
                }
            }
        }
    }

    pub fn recv(&mut self) -> Pdu<'static> {
        self.recv_or_close().expect("target closed the connection")
    }

    /// The next PDU if one arrives within `wait`.
    pub fn recv_within(&mut self, wait: Duration) -> Polled {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let polled = loop {
            match self
                .decoder
                .decode(&self.buf)
                .expect("target sent a valid PDU")
            {
                Decoded::Pdu { pdu, consumed } => {
                    let pdu = pdu.into_owned();
                    self.buf.drain(..consumed);
                    break Polled::Pdu(pdu);
                }
                Decoded::NeedMore(_) => {
                    let mut chunk = [0u8; 65536];
                    match self.stream.read(&mut chunk) {
                        Ok(0) => break Polled::Closed,
                        Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                            break Polled::Closed
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            break Polled::Nothing
                        }
                        Err(e) => panic!("reading from the target: {e}"),
                    }
                }
            }
        };
        self.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        polled
    }

    /// Reads (and drops) everything until the target closes the
    /// connection; panics if it stays open for `limit`.
    pub fn drain_until_closed(&mut self, limit: Duration) {
        let start = std::time::Instant::now();
        loop {
            assert!(
                start.elapsed() < limit,
                "the target kept the connection open for {limit:?}"
            );
            self.buf.clear();
            let mut chunk = vec![0u8; 1 << 20];
            self.stream
                .set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            match self.stream.read(&mut chunk) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("reading from the target: {e}"),
            }
        }
    }

    /// True when the target closes the connection (after an optional
    /// C2HTermReq, which is returned).
    pub fn expect_termination(&mut self) -> Option<nvmf_proto::pdu::TermReq<'static>> {
        let mut term = None;
        while let Some(p) = self.recv_or_close() {
            match p {
                Pdu::C2HTermReq(t) => term = Some(t),
                other => panic!("expected termination, got {other:?}"),
            }
        }
        term
    }

    pub fn icreq(&mut self, hdgst: bool, ddgst: bool) -> IcResp {
        let req = IcReq {
            hpda: 0,
            header_digest: hdgst,
            data_digest: ddgst,
            maxr2t: 0,
        };
        self.send(&Pdu::IcReq(req));
        let Pdu::IcResp(resp) = self.recv() else {
            panic!("expected ICResp")
        };
        let n = Negotiated::new(&req, &resp).unwrap();
        self.enc = n.encode_config(Role::Host);
        self.decoder
            .set_config(n.decoder_config(Role::Host, 4 << 20));
        self.maxh2cdata = resp.maxh2cdata;
        resp
    }

    /// Sends a capsule and gathers C2HData until its completion.
    pub fn command(&mut self, sqe: Sqe, data_out: Option<&[u8]>) -> (Cqe, Vec<u8>) {
        let capsule = match data_out {
            Some(d) => CapsuleCmd::with_data(sqe, d.to_vec()).unwrap(),
            None => CapsuleCmd::new(sqe),
        };
        self.send(&Pdu::CapsuleCmd(capsule));
        self.gather(sqe.cid)
    }

    pub fn gather(&mut self, cid: u16) -> (Cqe, Vec<u8>) {
        let mut data = Vec::new();
        loop {
            match self.recv() {
                Pdu::C2HData(d) => {
                    assert_eq!(d.cccid, cid, "data for another command");
                    assert_eq!(d.datao as usize, data.len(), "data out of order");
                    data.extend_from_slice(&d.data);
                    if d.success {
                        return (Cqe::success(cid), data);
                    }
                }
                Pdu::CapsuleResp(r) => {
                    assert_eq!(r.cqe.cid, cid, "completion for another command");
                    return (r.cqe, data);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    pub fn connect_data(&self, subnqn: &str, hostnqn: &str, cntlid: u16) -> Vec<u8> {
        self.connect_data_with_id(subnqn, hostnqn, cntlid, HOST_ID)
    }

    pub fn connect_data_with_id(
        &self,
        subnqn: &str,
        hostnqn: &str,
        cntlid: u16,
        host_id: [u8; 16],
    ) -> Vec<u8> {
        ConnectData {
            host_id,
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .to_bytes()
        .unwrap()
        .to_vec()
    }

    pub fn connect_admin_as(&mut self, subnqn: &str, hostnqn: &str, kato_ms: u32) -> Cqe {
        let cid = self.cid();
        let sqe = Connect::admin(32, kato_ms).to_sqe(cid);
        let data = self.connect_data(subnqn, hostnqn, CNTLID_DYNAMIC);
        let (cqe, _) = self.command(sqe, Some(&data));
        if cqe.status.is_success() {
            self.cntlid = cqe.dw0 as u16;
        }
        cqe
    }

    pub fn property_get(&mut self, offset: u32) -> u64 {
        let cid = self.cid();
        let (cqe, _) = self.command(PropertyGet::new(offset).to_sqe(cid), None);
        assert!(cqe.status.is_success(), "property get {offset:#x}: {cqe:?}");
        cqe.property_value()
    }

    /// Admin connect, enable, and grant `queues` I/O queues.
    pub fn bring_up(addr: SocketAddr, hdgst: bool, ddgst: bool, queues: u16) -> TestHost {
        TestHost::bring_up_as(addr, HOST_NQN, hdgst, ddgst, queues)
    }

    /// [`TestHost::bring_up`] asking for a keep-alive timeout of `kato_ms`.
    pub fn bring_up_with_kato(addr: SocketAddr, kato_ms: u32, queues: u16) -> TestHost {
        let mut h = TestHost::connect(addr);
        h.icreq(false, false);
        let cqe = h.connect_admin_as(DEMO_NQN, HOST_NQN, kato_ms);
        assert!(cqe.status.is_success(), "admin connect: {cqe:?}");
        h.enable();
        let cid = h.cid();
        let sf = nvmf_proto::command::SetFeatures::new(
            feature_id::NUMBER_OF_QUEUES,
            NumberOfQueues::with_count(queues).to_dword(),
        );
        let (cqe, _) = h.command(AdminCommand::SetFeatures(sf).to_sqe(cid), None);
        assert!(cqe.status.is_success());
        h
    }

    /// Sends read capsules (of `len` bytes each, from LBA 0 of namespace 1
    /// in 512-byte blocks) with CIDs `cids`, without waiting for anything.
    pub fn send_reads(&mut self, cids: std::ops::Range<u16>, len: u32) {
        let mut bytes = Vec::new();
        for cid in cids {
            let sqe = IoCommand::read(1, 0, len / 512, len).unwrap().to_sqe(cid);
            Pdu::CapsuleCmd(CapsuleCmd::new(sqe))
                .encode(&self.enc, &mut bytes)
                .unwrap();
        }
        // The target may close before all of it is taken.
        let _ = self.stream.write_all(&bytes);
    }

    /// [`TestHost::bring_up`] as another host NQN (another tenant).
    pub fn bring_up_as(
        addr: SocketAddr,
        hostnqn: &str,
        hdgst: bool,
        ddgst: bool,
        queues: u16,
    ) -> TestHost {
        let mut h = TestHost::connect(addr);
        h.icreq(hdgst, ddgst);
        let cqe = h.connect_admin_as(DEMO_NQN, hostnqn, 10_000);
        assert!(cqe.status.is_success(), "admin connect: {cqe:?}");
        h.enable();
        let cid = h.cid();
        let sf = nvmf_proto::command::SetFeatures::new(
            feature_id::NUMBER_OF_QUEUES,
            NumberOfQueues::with_count(queues).to_dword(),
        );
        let (cqe, _) = h.command(AdminCommand::SetFeatures(sf).to_sqe(cid), None);
        assert!(cqe.status.is_success());
        h
    }

    /// CC.EN = 1 and wait for CSTS.RDY.
    pub fn enable(&mut self) {
        let h = self;
        let mut cc = ControllerConfiguration::from_u32(0);
        cc.enable = true;
        cc.iosqes = 6;
        cc.iocqes = 4;
        let cid = h.cid();
        let (cqe, _) = h.command(
            PropertySet::new(property::CC, cc.to_u32() as u64).to_sqe(cid),
            None,
        );
        assert!(cqe.status.is_success());
        assert_eq!(h.property_get(property::CSTS) & 1, 1, "CSTS.RDY");
    }

    pub fn connect_io(
        addr: SocketAddr,
        cntlid: u16,
        qid: u16,
        hdgst: bool,
        ddgst: bool,
    ) -> TestHost {
        TestHost::connect_io_as(addr, HOST_NQN, cntlid, qid, hdgst, ddgst, 0)
    }

    /// [`TestHost::connect_io`] as another host, with extra CATTR bits.
    pub fn connect_io_as(
        addr: SocketAddr,
        hostnqn: &str,
        cntlid: u16,
        qid: u16,
        hdgst: bool,
        ddgst: bool,
        cattr_extra: u8,
    ) -> TestHost {
        let mut h = TestHost::connect(addr);
        h.icreq(hdgst, ddgst);
        let cid = h.cid();
        let mut connect = Connect::io(qid, 64, PriorityClass::Medium);
        connect.cattr |= cattr_extra;
        let sqe = connect.to_sqe(cid);
        let data = h.connect_data(DEMO_NQN, hostnqn, cntlid);
        let (cqe, _) = h.command(sqe, Some(&data));
        assert!(cqe.status.is_success(), "io connect: {cqe:?}");
        h.cntlid = cntlid;
        h
    }

    /// An I/O queue `qid` of `cntlid` with `depth` entries, as the demo
    /// host; returns the Connect's completion whatever it is.
    pub fn try_connect_io(
        addr: SocketAddr,
        cntlid: u16,
        qid: u16,
        depth: u16,
        host_id: [u8; 16],
    ) -> (TestHost, Cqe) {
        let mut h = TestHost::connect(addr);
        h.icreq(false, false);
        let cid = h.cid();
        let sqe = Connect::io(qid, depth, PriorityClass::Medium).to_sqe(cid);
        let data = h.connect_data_with_id(DEMO_NQN, HOST_NQN, cntlid, host_id);
        let (cqe, _) = h.command(sqe, Some(&data));
        h.cntlid = cntlid;
        (h, cqe)
    }

    pub fn identify(&mut self, cns_value: u8, nsid: u32) -> (Cqe, Vec<u8>) {
        let cid = self.cid();
        self.command(
            AdminCommand::Identify(Identify::new(cns_value, nsid)).to_sqe(cid),
            None,
        )
    }

    pub fn identify_controller(&mut self) -> nvmf_proto::identify::IdentifyController {
        let (cqe, data) = self.identify(cns::CONTROLLER, 0);
        assert!(cqe.status.is_success());
        nvmf_proto::identify::IdentifyController::from_bytes(&data).unwrap()
    }

    pub fn read(&mut self, nsid: u32, slba: u64, blocks: u32, block_size: u32) -> (Cqe, Vec<u8>) {
        let cid = self.cid();
        let cmd = IoCommand::read(nsid, slba, blocks, blocks * block_size).unwrap();
        self.command(cmd.to_sqe(cid), None)
    }

    /// Writes in-capsule when it fits `in_capsule_max`, else through R2T
    /// and H2CData in MAXH2CDATA pieces.
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        data: &[u8],
        block_size: u32,
        in_capsule_max: usize,
    ) -> Cqe {
        let cid = self.cid();
        let blocks = (data.len() / block_size as usize) as u32;
        if data.len() <= in_capsule_max {
            let cmd = IoCommand::write(
                nsid,
                slba,
                blocks,
                SglDescriptor::in_capsule(0, data.len() as u32),
            )
            .unwrap();
            return self.command(cmd.to_sqe(cid), Some(data)).0;
        }
        let cmd = IoCommand::write(
            nsid,
            slba,
            blocks,
            SglDescriptor::transport(data.len() as u32),
        )
        .unwrap();
        self.send(&Pdu::CapsuleCmd(CapsuleCmd::new(cmd.to_sqe(cid))));
        let r2t = match self.recv() {
            Pdu::R2T(r) => r,
            Pdu::CapsuleResp(r) => return r.cqe,
            other => panic!("expected R2T, got {other:?}"),
        };
        assert_eq!(r2t.cccid, cid);
        assert_eq!(r2t.r2to, 0);
        assert_eq!(r2t.r2tl as usize, data.len());
        let piece = self.maxh2cdata as usize;
        let mut off = 0;
        while off < data.len() {
            let n = piece.min(data.len() - off);
            self.send(&Pdu::H2CData(H2CData {
                cccid: cid,
                ttag: r2t.ttag,
                datao: off as u32,
                last: off + n == data.len(),
                data: data[off..off + n].to_vec().into(),
            }));
            off += n;
        }
        self.gather(cid).0
    }
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}
