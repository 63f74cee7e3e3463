//! The fuzz driver shared by the cargo-fuzz target and the bounded in-CI
//! test (`tests/proto/fuzz_bounded.rs`): feeds one input through every
//! decoder configuration and every structure parser and checks the
//! decoder's contract. Panics on a violation.

use nvmf_proto::command::DsmRange;
use nvmf_proto::fabrics::ConnectData;
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
    pdus
}
