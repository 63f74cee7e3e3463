//! The fuzz driver shared by the cargo-fuzz target and the bounded in-CI
//! test (`tests/proto/fuzz_bounded.rs`): feeds one input through every
//! decoder configuration and every structure parser, every authentication
//! message decoder, the secret parser, and the DH-HMAC-CHAP host and
//! controller state machines, and checks their contracts. Panics on a
//! violation.

use std::sync::Arc;

use nvmf_proto::auth::message::{
    AuthMessage, Challenge, Negotiate, Reply, Success1, Success2, MAX_DH_VALUE_LEN,
};
use nvmf_proto::auth::{
    CtrlAuth, CtrlAuthConfig, CtrlProgress, DhGroup, DhchapSecret, HashId, HostAuth,
    HostAuthConfig, HostNext, RandomError, RandomSource, MAX_MESSAGE_LEN,
};
use nvmf_proto::command::DsmRange;
use nvmf_proto::fabrics::{AuthenticationReceive, AuthenticationSend, ConnectData};
use nvmf_proto::identify::{
    ActiveNamespaceList, IdentifyController, IdentifyNamespace, NamespaceIdDescriptor,
};
use nvmf_proto::log_page::{DiscoveryLogPage, ErrorLogEntry, SmartLog};
use nvmf_proto::{
    AdminCommand, Cqe, Decoded, DecoderConfig, IoCommand, PduDecoder, PduReader, ProtoError, Role,
    Sqe,
};

/// What decoding a whole buffer PDU by PDU produced.
#[derive(Debug, PartialEq)]
enum Outcome {
    Pdu(nvmf_proto::Pdu<'static>),
    DataDigest(ProtoError),
    End(Option<ProtoError>),
}

fn configs() -> Vec<DecoderConfig> {
    let mut out = Vec::new();
    for role in [Role::Host, Role::Controller] {
        for (h, d, pda) in [
            (false, false, 0),
            (true, true, 0),
            (true, false, 1),
            (false, true, 31),
        ] {
            out.push(DecoderConfig {
                role,
                header_digest: h,
                data_digest: d,
                rx_pda: pda,
                max_data_len: 4096,
            });
        }
    }
    out
}

/// Decode `input` from the start, PDU after PDU, checking the contract.
fn decode_all(cfg: DecoderConfig, input: &[u8]) -> Vec<Outcome> {
    let dec = PduDecoder::new(cfg);
    let mut pos = 0;
    let mut out = Vec::new();
    loop {
        let rest = &input[pos..];
        match dec.decode(rest) {
            Ok(Decoded::NeedMore(n)) => {
                assert!(n > 0, "NeedMore(0)");
                out.push(Outcome::End(None));
                return out;
            }
            Ok(Decoded::Pdu { pdu, consumed }) => {
                assert!(
                    consumed > 0 && consumed <= rest.len(),
                    "consumed {consumed} of {}",
                    rest.len()
                );
                assert!(pdu.data().len() <= cfg.max_data_len as usize);
                out.push(Outcome::Pdu(pdu.into_owned()));
                pos += consumed;
            }
            Err(e @ ProtoError::DataDigestMismatch { consumed, .. }) => {
                assert!(consumed > 0 && consumed <= rest.len());
                assert!(!e.is_fatal());
                out.push(Outcome::DataDigest(e));
                pos += consumed;
            }
            Err(e) => {
                assert!(e.is_fatal(), "decoder errors end the stream: {e:?}");
                let _ = e.to_string();
                out.push(Outcome::End(Some(e)));
                return out;
            }
        }
    }
}

/// The same through a `PduReader`, fed in two pieces.
fn decode_reader(cfg: DecoderConfig, input: &[u8], cut: usize) -> Vec<Outcome> {
    let mut reader = PduReader::new(cfg);
    let mut out = Vec::new();
    let mut pieces = [&input[..cut], &input[cut..]].into_iter();
    loop {
        match reader.next_pdu() {
            Ok(Some(pdu)) => out.push(Outcome::Pdu(pdu.into_owned())),
            Ok(None) => match pieces.next() {
                Some(p) => reader.push_bytes(p),
                None => {
                    out.push(Outcome::End(None));
                    return out;
                }
            },
            Err(e @ ProtoError::DataDigestMismatch { .. }) => out.push(Outcome::DataDigest(e)),
            Err(e) => {
                // A fatal error may show up before all pieces are pushed
                // only if the bytes it needs were already there, so the
                // outcome matches the whole-buffer decode.
                out.push(Outcome::End(Some(e)));
                return out;
            }
        }
    }
}

/// Run one input through everything; returns how many PDUs decoded.
pub fn exercise(input: &[u8]) -> usize {
    let mut pdus = 0;
    let cut = input.first().map_or(0, |&b| b as usize % (input.len() + 1));
    for cfg in configs() {
        let whole = decode_all(cfg, input);
        pdus += whole
            .iter()
            .filter(|o| matches!(o, Outcome::Pdu(_)))
            .count();
        assert_eq!(
            decode_reader(cfg, input, cut),
            whole,
            "split at {cut} changed the result"
        );
    }

    // Structure parsers: any bytes, never a panic.
    let mut page = input.to_vec();
    if !page.is_empty() {
        while page.len() < 4096 {
            let n = page.len().min(4096 - page.len());
            page.extend_from_within(..n);
        }
    }
    if let Some(raw) = page.get(..64) {
        let sqe = Sqe::from_bytes(raw.try_into().expect("64 bytes"));
        let _ = AdminCommand::parse(&sqe);
        let _ = IoCommand::parse(&sqe);
        let _ = Cqe::from_bytes(raw[..16].try_into().expect("16 bytes"));
    }
    for b in [input, &page[..]] {
        let _ = ConnectData::from_bytes(b);
        let _ = IdentifyController::from_bytes(b);
        let _ = IdentifyNamespace::from_bytes(b);
        let _ = ActiveNamespaceList::from_bytes(b);
        let _ = NamespaceIdDescriptor::decode_list(b);
        let _ = DiscoveryLogPage::from_bytes(b);
        let _ = ErrorLogEntry::from_bytes(b);
        let _ = SmartLog::from_bytes(b);
        let _ = DsmRange::decode_list(b, 1 + input.len() % 300);
    }
    if let Some(raw) = page.get(..64) {
        let sqe = Sqe::from_bytes(raw.try_into().expect("64 bytes"));
        if let Ok(c) = AuthenticationSend::from_sqe(&sqe) {
            let _ = c.check_dhchap();
        }
        if let Ok(c) = AuthenticationReceive::from_sqe(&sqe) {
            let _ = c.check_dhchap();
        }
    }
    exercise_auth(input);
    pdus
}

/// Deterministic randomness for the authentication state machines.
pub struct FuzzRng(pub u64);

impl RandomSource for FuzzRng {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), RandomError> {
        for b in buf {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            *b = (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8;
        }
        Ok(())
    }
}

/// Host NQN of the fuzzed transactions.
pub const FUZZ_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz-host";
/// Subsystem NQN of the fuzzed transactions.
pub const FUZZ_SUBNQN: &str = "nqn.2024-05.io.gimbal:fuzz";

/// The host secret of the fuzzed transactions.
pub fn fuzz_host_secret() -> DhchapSecret {
    DhchapSecret::new(&[0x11; 32], Some(HashId::Sha256)).expect("valid")
}

/// The controller secret of the fuzzed transactions.
pub fn fuzz_ctrl_secret() -> DhchapSecret {
    DhchapSecret::new(&[0x22; 48], None).expect("valid")
}

/// Every authentication message a well-formed transaction sends, for
/// seeding mutations: a real host against a real controller (null group
/// and ffdhe2048, bidirectional), the fuzz configuration's secrets. Used by
/// the bounded test; libFuzzer finds its own seeds.
#[allow(dead_code)]
pub fn auth_transcripts() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
        let hcfg = HostAuthConfig::new(FUZZ_HOSTNQN, FUZZ_SUBNQN, fuzz_host_secret())
            .with_ctrl_secret(fuzz_ctrl_secret());
        let mut host =
            HostAuth::with_random(Arc::new(hcfg), 0, 7, Box::new(FuzzRng(3))).expect("config");
        let mut ctrl =
            CtrlAuth::with_random(ctrl_config(group), 0, Box::new(FuzzRng(5))).expect("config");
        let mut step = host.start();
        for _ in 0..4 {
            if let Some(m) = step.send.take() {
                ctrl.on_send(&m);
                out.push(m);
            }
            let HostNext::Receive { al } = step.next else {
                break;
            };
            let r = ctrl.on_receive(al).expect("AL is 4096");
            // Without nvmet's zero padding, so that mutations land in fields.
            let exact = AuthMessage::decode(&r.data).expect("well-formed");
            out.push(exact.encode().expect("encodes"));
            step = host.receive(&r.data);
        }
    }
    out
}

fn ctrl_config(group: DhGroup) -> Arc<CtrlAuthConfig> {
    Arc::new(
        CtrlAuthConfig::new(FUZZ_HOSTNQN, FUZZ_SUBNQN, fuzz_host_secret())
            .with_ctrl_secret(fuzz_ctrl_secret())
            .with_dh_groups(&[group]),
    )
}

/// Check what a controller returned for a Receive of `al` bytes.
fn check_receive(data: &[u8], al: u32) {
    assert!(
        data.len() <= al as usize,
        "{} bytes for AL {al}",
        data.len()
    );
    assert!(data.len() <= MAX_MESSAGE_LEN as usize);
    match AuthMessage::decode(data) {
        Ok(AuthMessage::Challenge(_) | AuthMessage::Success1(_) | AuthMessage::Failure1(_)) => {}
        other => panic!("controller returned {other:?}"),
    }
}

/// Authentication: every decoder, the secret parser, and both state
/// machines, with `input` as their peer. Returns how many messages decoded.
pub fn exercise_auth(input: &[u8]) -> usize {
    let mut decoded = 0;
    if let Ok(m) = AuthMessage::decode(input) {
        decoded += 1;
        let again = m.encode().expect("a decoded message encodes");
        assert_eq!(AuthMessage::decode(&again).expect("re-decodes"), m);
    }
    let _ = Negotiate::decode(input);
    let _ = Challenge::decode(input);
    let _ = Reply::decode(input);
    let _ = Success1::decode(input);
    let _ = Success2::decode(input);
    if let Ok(s) = DhchapSecret::parse(&String::from_utf8_lossy(input)) {
        assert_eq!(DhchapSecret::parse(&s.to_representation()), Ok(s));
    }

    // Controller: the input is a script of records [op, len, bytes...].
    // The DH group is ffdhe2048 when the first byte is D7h (exponentiations are
    // the slow part; random inputs rarely pick it), null otherwise.
    let group = if input.first() == Some(&0xD7) {
        DhGroup::Ffdhe2048
    } else {
        DhGroup::Null
    };
    let mut ctrl =
        CtrlAuth::with_random(ctrl_config(group), 1, Box::new(FuzzRng(9))).expect("config");
    let mut rest = input.get(1..).unwrap_or(&[]);
    let mut t_id = 0u16;
    while let [op, len, tail @ ..] = rest {
        let n = (*len as usize).min(tail.len());
        let (chunk, next) = tail.split_at(n);
        rest = next;
        match op % 4 {
            0 => {
                let _ = ctrl.on_send(chunk);
            }
            1 => {
                let al = match chunk {
                    [a, b, ..] => u16::from_le_bytes([*a, *b]) as u32,
                    _ => 4096,
                };
                if let Ok(r) = ctrl.on_receive(al) {
                    check_receive(&r.data, al);
                    if matches!(r.progress, CtrlProgress::Authenticated(_)) {
                        assert!(ctrl.is_authenticated());
                    }
                }
            }
            2 => {
                // A valid Negotiate, to reach the later states.
                t_id = t_id.wrapping_add(1);
                let _ = ctrl.on_send(&Negotiate::linux_default(t_id).encode().expect("encodes"));
            }
            _ => {
                // A Reply of plausible shape around the chunk's bytes.
                let hash = HashId::ALL[*len as usize % 3];
                let mut r = vec![1, 2, 0, 0];
                r.extend_from_slice(&t_id.to_le_bytes());
                r.extend_from_slice(&[
                    hash.output_len() as u8,
                    0,
                    chunk.first().map_or(0, |b| b & 1),
                    0,
                ]);
                let dhvlen = chunk.len().min(MAX_DH_VALUE_LEN) as u16;
                r.extend_from_slice(&dhvlen.to_le_bytes());
                r.extend_from_slice(&[1, 0, 0, 0]);
                r.extend(std::iter::repeat_n(0x5A, 2 * hash.output_len()));
                r.extend_from_slice(chunk);
                let _ = ctrl.on_send(&r);
            }
        }
    }

    // Host: the input as the controller's answers.
    let hcfg = HostAuthConfig::new(FUZZ_HOSTNQN, FUZZ_SUBNQN, fuzz_host_secret())
        .with_ctrl_secret(fuzz_ctrl_secret());
    let mut host =
        HostAuth::with_random(Arc::new(hcfg), 1, 7, Box::new(FuzzRng(11))).expect("config");
    host.start();
    let cut = input.len() / 2;
    for piece in [input, &input[cut..]] {
        let step = host.receive(piece);
        if let Some(sent) = step.send {
            match AuthMessage::decode(&sent) {
                Ok(AuthMessage::Reply(_) | AuthMessage::Success2(_) | AuthMessage::Failure2(_)) => {
                }
                other => panic!("host sent {other:?}"),
            }
        }
        if !matches!(step.next, HostNext::Receive { .. }) {
            break;
        }
    }
    decoded
}
