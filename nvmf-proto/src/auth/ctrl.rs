//! The controller side of DH-HMAC-CHAP on one queue.

use std::sync::Arc;

use crate::auth::crypto::{controller_response, host_response, HashValue, ResponseInput};
use crate::auth::dh::{DhKeyError, DhPrivateKey};
use crate::auth::message::{
    AuthMessage, Challenge, Failure, MessageError, Negotiate, Reply, Success1, Success2, MAX_IDS,
};
use crate::auth::{
    check_nqn, random_seq_num, AuthError, Authenticated, DhGroup, DhchapSecret, FailureExplanation,
    HashId, OsRandom, RandomSource, MAX_MESSAGE_LEN,
};

/// What a controller needs to authenticate one host (nvmet keeps the same
/// per host: `dhchap_key`, `dhchap_ctrl_key`, `dhchap_hash`,
/// `dhchap_dhgroup`).
#[derive(Debug, Clone)]
pub struct CtrlAuthConfig {
    /// Host NQN (from the Connect data).
    pub host_nqn: String,
    /// Subsystem NQN (from the Connect data).
    pub subsys_nqn: String,
    /// The host's secret (nvmet `dhchap_key`).
    pub host_secret: DhchapSecret,
    /// The controller's secret (nvmet `dhchap_ctrl_key`): needed to answer
    /// a host that asks the controller to authenticate itself.
    pub ctrl_secret: Option<DhchapSecret>,
    /// Hashes allowed, in preference order: the first one the host offers
    /// is used; none offered fails with "hash function unusable".
    pub hashes: Vec<HashId>,
    /// DH groups allowed, in preference order, chosen the same way.
    pub dh_groups: Vec<DhGroup>,
}

impl CtrlAuthConfig {
    /// Allow every hash and group, preferring SHA-256 and the null group —
    /// what nvmet's defaults (`hmac(sha256)`, `null`) pick against the
    /// Linux host. Restrict with [`Self::with_hashes`] and
    /// [`Self::with_dh_groups`].
    pub fn new(
        host_nqn: impl Into<String>,
        subsys_nqn: impl Into<String>,
        host_secret: DhchapSecret,
    ) -> Self {
        Self {
            host_nqn: host_nqn.into(),
            subsys_nqn: subsys_nqn.into(),
            host_secret,
            ctrl_secret: None,
            hashes: HashId::ALL.to_vec(),
            dh_groups: DhGroup::ALL.to_vec(),
        }
    }

    /// Set the controller secret.
    pub fn with_ctrl_secret(mut self, secret: DhchapSecret) -> Self {
        self.ctrl_secret = Some(secret);
        self
    }

    /// Allow only `hashes`, in this preference order.
    pub fn with_hashes(mut self, hashes: &[HashId]) -> Self {
        self.hashes = hashes.to_vec();
        self
    }

    /// Allow only `groups`, in this preference order.
    pub fn with_dh_groups(mut self, groups: &[DhGroup]) -> Self {
        self.dh_groups = groups.to_vec();
        self
    }

    /// Check the NQNs and the lists.
    pub fn validate(&self) -> Result<(), AuthError> {
        check_nqn(&self.host_nqn)?;
        check_nqn(&self.subsys_nqn)?;
        if self.hashes.is_empty() || self.hashes.len() > MAX_IDS {
            return Err(AuthError::Config("allow 1 to 30 hashes"));
        }
        if self.dh_groups.is_empty() || self.dh_groups.len() > MAX_IDS {
            return Err(AuthError::Config("allow 1 to 30 DH groups"));
        }
        Ok(())
    }
}

/// Where the queue's authentication stands after a command.
#[derive(Debug)]
pub enum CtrlProgress {
    /// The transaction goes on: complete the command successfully and wait
    /// for the host's next Authentication Send or Receive.
    InProgress,
    /// The host's message was rejected: complete the Send successfully;
    /// the host's next Authentication Receive returns AUTH_Failure1 with
    /// this error's explanation, and the transaction then fails.
    FailureQueued(AuthError),
    /// The host is authenticated (and the controller too, if asked): the
    /// queue may now accept other commands.
    Authenticated(Authenticated),
    /// The transaction is over and failed (Failure1 delivered, or the host
    /// sent AUTH_Failure2). nvmet treats this as a fatal controller error;
    /// the queue must stay unauthenticated.
    Failed(AuthError),
}

/// The data to return for an Authentication Receive, and what it means.
#[derive(Debug)]
pub struct CtrlReceive {
    /// The message, zero-padded to min(AL, [`MAX_MESSAGE_LEN`]) bytes when
    /// that is longer (as nvmet returns AL bytes). Never longer than AL.
    pub data: Vec<u8>,
    /// Where the transaction stands once this data is delivered.
    pub progress: CtrlProgress,
}

/// An Authentication Receive that cannot be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReceiveError {
    /// AL is smaller than the pending message. Complete the command with
    /// Invalid Field in Command (AL is SQE bytes 44..48); the message stays
    /// pending for a Receive with a large enough AL.
    #[error("allocation length {al} is smaller than the {needed}-byte message")]
    AllocationLength {
        /// The command's AL.
        al: u32,
        /// The message's length.
        needed: u32,
    },
}

/// One transaction's parameters, fixed by the Negotiate.
struct Txn {
    t_id: u16,
    hash: HashId,
    dh_group: DhGroup,
    c1: HashValue,
    s1: u32,
    dh_key: Option<DhPrivateKey>,
}

enum State {
    /// No transaction yet (or the last one succeeded): waits for Negotiate.
    Idle,
    /// Negotiate accepted: the next Receive gets the Challenge.
    SendChallenge { txn: Txn, message: Vec<u8> },
    /// Challenge delivered: waits for the Reply.
    AwaitReply { txn: Txn },
    /// Reply verified: the next Receive gets Success1.
    SendSuccess1 {
        t_id: u16,
        message: Vec<u8>,
        outcome: Authenticated,
    },
    /// Success1 with R2 delivered: waits for Success2.
    AwaitSuccess2 { t_id: u16, outcome: Authenticated },
    /// A message was rejected: the next Receive gets Failure1.
    SendFailure1 { message: Vec<u8>, error: AuthError },
    /// Failed for good.
    Failed,
}

/// The controller side of DH-HMAC-CHAP on one queue: fed with the data of
/// each Authentication Send ([`Self::on_send`]) and asked for the data of
/// each Authentication Receive ([`Self::on_receive`]).
///
/// ```text
/// on_send(Negotiate)  -> InProgress      on_receive(al) -> Challenge
/// on_send(Reply)      -> InProgress      on_receive(al) -> Success1, then
///                                           Authenticated (unidirectional) or
///                                           InProgress (bidirectional)
/// on_send(Success2)   -> Authenticated   (bidirectional only)
/// a bad message       -> FailureQueued   on_receive(al) -> Failure1, Failed
/// on_send(Failure2)   -> Failed
/// ```
///
/// A Negotiate at any point (except after a failure) starts a new
/// transaction, as nvmet allows: that is how a host re-authenticates.
pub struct CtrlAuth {
    config: Arc<CtrlAuthConfig>,
    qid: u16,
    state: State,
    authenticated: bool,
    rng: Box<dyn RandomSource>,
}

impl std::fmt::Debug for CtrlAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CtrlAuth")
            .field("qid", &self.qid)
            .field("authenticated", &self.authenticated)
            .finish_non_exhaustive()
    }
}

impl CtrlAuth {
    /// The controller side for queue `qid`, with the operating system's
    /// random numbers.
    pub fn new(config: Arc<CtrlAuthConfig>, qid: u16) -> Result<Self, AuthError> {
        Self::with_random(config, qid, Box::new(OsRandom))
    }

    /// [`Self::new`] with injected randomness (C1, S1, the DH private key).
    pub fn with_random(
        config: Arc<CtrlAuthConfig>,
        qid: u16,
        rng: Box<dyn RandomSource>,
    ) -> Result<Self, AuthError> {
        config.validate()?;
        Ok(Self {
            config,
            qid,
            state: State::Idle,
            authenticated: false,
            rng,
        })
    }

    /// The queue.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Whether the queue is authenticated: commands other than Connect and
    /// the authentication commands are allowed. A re-authentication in
    /// progress keeps the previous result until it fails.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// The data of an Authentication Send (TL bytes; check TL against
    /// [`MAX_MESSAGE_LEN`] before receiving them, which
    /// [`crate::fabrics::AuthenticationSend::check_dhchap`] does).
    pub fn on_send(&mut self, data: &[u8]) -> CtrlProgress {
        if matches!(self.state, State::Failed) {
            return CtrlProgress::Failed(AuthError::Misuse("transaction already failed"));
        }
        let msg = match AuthMessage::decode(data) {
            Ok(m) => m,
            Err(e) => {
                let t_id = self
                    .current_t_id()
                    .or_else(|| data.get(4..6).map(|b| u16::from_le_bytes([b[0], b[1]])));
                return self.queue_failure(t_id.unwrap_or(0), e.into());
            }
        };
        if let AuthMessage::Negotiate(n) = msg {
            return self.on_negotiate(n);
        }
        if let AuthMessage::Failure2(f) = msg {
            self.state = State::Failed;
            self.authenticated = false;
            return CtrlProgress::Failed(AuthError::PeerFailure {
                reason_code: f.reason_code,
                explanation: f.explanation,
            });
        }
        let state = std::mem::replace(&mut self.state, State::Failed);
        match (state, msg) {
            (State::AwaitReply { txn }, AuthMessage::Reply(r)) => self.on_reply(txn, r),
            (State::AwaitSuccess2 { t_id, outcome }, AuthMessage::Success2(s)) => {
                self.on_success2(t_id, outcome, s)
            }
            (state, msg) => {
                let expected = match &state {
                    State::Idle => "AUTH_Negotiate",
                    State::AwaitReply { .. } => "DH-HMAC-CHAP_Reply",
                    State::AwaitSuccess2 { .. } => "DH-HMAC-CHAP_Success2",
                    // A Send while a message waits to be received.
                    _ => "Authentication Receive",
                };
                let t_id = state_t_id(&state).unwrap_or(msg.t_id());
                self.queue_failure(
                    t_id,
                    AuthError::UnexpectedMessage {
                        expected,
                        got: msg.name(),
                    },
                )
            }
        }
    }

    /// An Authentication Receive with allocation length `al`: the data to
    /// return. A Receive with nothing to deliver (out of order) gets
    /// AUTH_Failure1 and fails the transaction, as nvmet does.
    pub fn on_receive(&mut self, al: u32) -> Result<CtrlReceive, ReceiveError> {
        let needed = match &self.state {
            State::SendChallenge { message, .. }
            | State::SendSuccess1 { message, .. }
            | State::SendFailure1 { message, .. } => message.len() as u32,
            _ => super::message::Failure::LEN as u32,
        };
        if al < needed {
            return Err(ReceiveError::AllocationLength { al, needed });
        }
        let pad = |mut m: Vec<u8>| {
            let len = (al.min(MAX_MESSAGE_LEN) as usize).max(m.len());
            m.resize(len, 0);
            m
        };
        let state = std::mem::replace(&mut self.state, State::Failed);
        let (data, progress) = match state {
            State::SendChallenge { txn, message } => {
                self.state = State::AwaitReply { txn };
                (message, CtrlProgress::InProgress)
            }
            State::SendSuccess1 {
                t_id,
                message,
                outcome,
            } => {
                if outcome.bidirectional {
                    self.state = State::AwaitSuccess2 { t_id, outcome };
                    (message, CtrlProgress::InProgress)
                } else {
                    self.state = State::Idle;
                    self.authenticated = true;
                    (message, CtrlProgress::Authenticated(outcome))
                }
            }
            State::SendFailure1 { message, error } => {
                self.authenticated = false;
                (message, CtrlProgress::Failed(error))
            }
            other => {
                self.authenticated = false;
                let error = AuthError::UnexpectedMessage {
                    expected: "Authentication Send",
                    got: "Authentication Receive",
                };
                let t_id = state_t_id(&other).unwrap_or(0);
                let message = failure1(t_id, error.explanation());
                (message, CtrlProgress::Failed(error))
            }
        };
        Ok(CtrlReceive {
            data: pad(data),
            progress,
        })
    }

    fn current_t_id(&self) -> Option<u16> {
        state_t_id(&self.state)
    }

    fn queue_failure(&mut self, t_id: u16, error: AuthError) -> CtrlProgress {
        self.state = State::SendFailure1 {
            message: failure1(t_id, error.explanation()),
            error: error.clone(),
        };
        CtrlProgress::FailureQueued(error)
    }

    fn on_negotiate(&mut self, n: Negotiate) -> CtrlProgress {
        match self.negotiate_to_challenge(&n) {
            Ok((txn, message)) => {
                self.state = State::SendChallenge { txn, message };
                CtrlProgress::InProgress
            }
            Err(e) => self.queue_failure(n.t_id, e),
        }
    }

    fn negotiate_to_challenge(&mut self, n: &Negotiate) -> Result<(Txn, Vec<u8>), AuthError> {
        if n.sc_c != 0 {
            return Err(AuthError::SecureChannel(n.sc_c));
        }
        let offer = n.dhchap().ok_or(AuthError::ProtocolNotUsable)?;
        let config = Arc::clone(&self.config);
        let hash = *config
            .hashes
            .iter()
            .find(|h| offer.hash_ids.contains(h.id()))
            .ok_or(AuthError::HashUnusable)?;
        let dh_group = *config
            .dh_groups
            .iter()
            .find(|g| offer.dh_group_ids.contains(g.id()))
            .ok_or(AuthError::DhGroupUnusable)?;
        let mut c1 = [0u8; 64];
        self.rng.fill(&mut c1[..hash.output_len()])?;
        let c1 = HashValue::new(&c1[..hash.output_len()]).expect("HL ≤ 64");
        // Linux's sequence numbers are never 0 either.
        let s1 = random_seq_num(&mut *self.rng)?;
        let (dh_key, dh_value) = if dh_group.is_null() {
            (None, Vec::new())
        } else {
            let key = DhPrivateKey::generate(dh_group, &mut *self.rng).map_err(|e| match e {
                DhKeyError::Random(r) => AuthError::Random(r),
                DhKeyError::Group(g) => AuthError::DhValue(g),
            })?;
            let public = key.public_value();
            (Some(key), public)
        };
        let challenge = Challenge {
            t_id: n.t_id,
            hash,
            dh_group,
            seq_num: s1,
            challenge: c1.clone(),
            dh_value,
        };
        let message = challenge
            .encode()
            .map_err(|_| AuthError::Misuse("challenge does not encode"))?;
        Ok((
            Txn {
                t_id: n.t_id,
                hash,
                dh_group,
                c1,
                s1,
                dh_key,
            },
            message,
        ))
    }

    fn on_reply(&mut self, txn: Txn, r: Reply) -> CtrlProgress {
        match self.verify_reply(&txn, &r) {
            Ok((message, outcome)) => {
                self.state = State::SendSuccess1 {
                    t_id: txn.t_id,
                    message,
                    outcome,
                };
                CtrlProgress::InProgress
            }
            Err(e) => self.queue_failure(txn.t_id, e),
        }
    }

    fn verify_reply(
        &mut self,
        txn: &Txn,
        r: &Reply,
    ) -> Result<(Vec<u8>, Authenticated), AuthError> {
        const N: &str = "DH-HMAC-CHAP_Reply";
        if r.t_id != txn.t_id {
            return Err(AuthError::TransactionId {
                expected: txn.t_id,
                got: r.t_id,
            });
        }
        if r.response.len() != txn.hash.output_len() {
            return Err(MessageError {
                message: N,
                field: "HL",
                offset: 6,
                reason: "not the output size of the chosen hash",
                explanation: FailureExplanation::HASH_UNUSABLE,
            }
            .into());
        }
        let session_key = match &txn.dh_key {
            None if !r.dh_value.is_empty() => {
                return Err(MessageError {
                    message: N,
                    field: "DHVLEN",
                    offset: 10,
                    reason: "a DH value with the null DH group",
                    explanation: FailureExplanation::INCORRECT_PAYLOAD,
                }
                .into())
            }
            None => None,
            Some(key) => Some(key.shared_secret(&r.dh_value)?),
        };
        let config = Arc::clone(&self.config);
        let host_key = config.host_secret.transform(&config.host_nqn);
        let expected = host_response(
            &host_key,
            &ResponseInput {
                hash: txn.hash,
                challenge: txn.c1.as_bytes(),
                session_key: session_key.as_ref(),
                seq_num: txn.s1,
                t_id: txn.t_id,
                sc_c: 0,
                host_nqn: &config.host_nqn,
                subsys_nqn: &config.subsys_nqn,
            },
        );
        if !expected.ct_eq(r.response.as_bytes()) {
            return Err(AuthError::HostResponseMismatch);
        }
        // NVMe 2.2: a C2 with SEQNUM 0 only feeds a secure channel's PSK,
        // it does not ask for bidirectional authentication (nvmet reads it
        // so too). Without secure channels, such a C2 is ignored.
        let c2 = r.ctrl_challenge.as_ref().filter(|_| r.seq_num != 0);
        let response = match c2 {
            None => None,
            Some(c2) => {
                let secret = config
                    .ctrl_secret
                    .as_ref()
                    .ok_or(AuthError::NoControllerSecret)?;
                let ctrl_key = secret.transform(&config.subsys_nqn);
                Some(controller_response(
                    &ctrl_key,
                    &ResponseInput {
                        hash: txn.hash,
                        challenge: c2.as_bytes(),
                        session_key: session_key.as_ref(),
                        seq_num: r.seq_num,
                        t_id: txn.t_id,
                        sc_c: 0,
                        host_nqn: &config.host_nqn,
                        subsys_nqn: &config.subsys_nqn,
                    },
                ))
            }
        };
        let bidirectional = response.is_some();
        let message = Success1 {
            t_id: txn.t_id,
            hash_len: txn.hash.output_len() as u8,
            response,
        }
        .encode()
        .map_err(|_| AuthError::Misuse("success1 does not encode"))?;
        Ok((
            message,
            Authenticated {
                hash: txn.hash,
                dh_group: txn.dh_group,
                bidirectional,
                session_key,
            },
        ))
    }

    fn on_success2(&mut self, t_id: u16, outcome: Authenticated, s: Success2) -> CtrlProgress {
        if s.t_id != t_id {
            return self.queue_failure(
                t_id,
                AuthError::TransactionId {
                    expected: t_id,
                    got: s.t_id,
                },
            );
        }
        self.state = State::Idle;
        self.authenticated = true;
        CtrlProgress::Authenticated(outcome)
    }
}

fn state_t_id(state: &State) -> Option<u16> {
    match state {
        State::SendChallenge { txn, .. } | State::AwaitReply { txn } => Some(txn.t_id),
        State::SendSuccess1 { t_id, .. } | State::AwaitSuccess2 { t_id, .. } => Some(*t_id),
        State::SendFailure1 { message, .. } => Some(u16::from_le_bytes([message[4], message[5]])),
        State::Idle | State::Failed => None,
    }
}

fn failure1(t_id: u16, explanation: FailureExplanation) -> Vec<u8> {
    AuthMessage::Failure1(Failure::new(t_id, explanation))
        .encode()
        .expect("fixed size")
}
