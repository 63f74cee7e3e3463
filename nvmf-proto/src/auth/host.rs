//! The host side of one DH-HMAC-CHAP transaction.

use std::sync::Arc;

use crate::auth::crypto::{controller_response, host_response, HashValue, ResponseInput};
use crate::auth::dh::{DhKeyError, DhPrivateKey};
use crate::auth::message::{
    AuthMessage, Challenge, Failure, MessageError, Negotiate, ProtocolDescriptor, Reply, Success1,
    Success2, MAX_IDS,
};
use crate::auth::{
    check_nqn, random_seq_num, AuthError, Authenticated, DhGroup, DhchapSecret, FailureExplanation,
    HashId, OsRandom, RandomSource, SessionKey, HOST_RECEIVE_AL,
};

/// What a host needs to authenticate to one subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAuthConfig {
    /// Host NQN (as in the Connect data).
    pub host_nqn: String,
    /// Subsystem NQN (as in the Connect data).
    pub subsys_nqn: String,
    /// The host secret (`--dhchap-secret`).
    pub host_secret: DhchapSecret,
    /// The controller secret (`--dhchap-ctrl-secret`): when present, the
    /// host asks the controller to authenticate itself too.
    pub ctrl_secret: Option<DhchapSecret>,
    /// Hashes offered, in preference order (Linux: SHA-256, -384, -512).
    pub hashes: Vec<HashId>,
    /// DH groups offered, in preference order (Linux: null, then ffdhe2048
    /// … ffdhe8192).
    pub dh_groups: Vec<DhGroup>,
}

impl HostAuthConfig {
    /// A configuration offering what Linux offers, without controller
    /// authentication.
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

    /// Ask the controller to authenticate itself with `secret`.
    pub fn with_ctrl_secret(mut self, secret: DhchapSecret) -> Self {
        self.ctrl_secret = Some(secret);
        self
    }

    /// Check the NQNs and the offer lists.
    pub fn validate(&self) -> Result<(), AuthError> {
        check_nqn(&self.host_nqn)?;
        check_nqn(&self.subsys_nqn)?;
        if self.hashes.is_empty() || self.hashes.len() > MAX_IDS {
            return Err(AuthError::Config("offer 1 to 30 hashes"));
        }
        if self.dh_groups.is_empty() || self.dh_groups.len() > MAX_IDS {
            return Err(AuthError::Config("offer 1 to 30 DH groups"));
        }
        Ok(())
    }
}

/// What the host does next, after [`HostAuth::start`] or
/// [`HostAuth::receive`].
#[derive(Debug)]
pub struct HostStep {
    /// Send this message first, in an Authentication Send whose TL is its
    /// length (SECP E9h, SPSP0 01h, SPSP1 01h).
    pub send: Option<Vec<u8>>,
    /// Then this.
    pub next: HostNext,
}

/// The host's next move once `send` (if any) has completed.
#[derive(Debug)]
pub enum HostNext {
    /// Issue an Authentication Receive with this AL and pass its data to
    /// [`HostAuth::receive`].
    Receive {
        /// Allocation length: [`HOST_RECEIVE_AL`].
        al: u32,
    },
    /// The queue is authenticated once the Send (Success2, if any)
    /// completes successfully.
    Done(Authenticated),
    /// The transaction failed. `send`, if present, is the AUTH_Failure2
    /// telling the controller why; the queue stays unauthenticated (Linux
    /// then tears the connection down).
    Failed(AuthError),
}

enum State {
    Start,
    AwaitChallenge,
    AwaitSuccess1 {
        hash: HashId,
        dh_group: DhGroup,
        session_key: Option<SessionKey>,
        /// C2 and S2 when the controller is to authenticate itself.
        ctrl_challenge: Option<(HashValue, u32)>,
    },
    Finished,
}

/// The host side of one transaction on one queue.
///
/// ```text
/// start()               -> send Negotiate,  Receive { al: 4096 }
/// receive(Challenge)    -> send Reply,      Receive { al: 4096 }
/// receive(Success1)     -> send Success2,   Done       (bidirectional)
///                       -> no send,         Done       (unidirectional)
/// receive(Failure1)     -> no send,         Failed
/// any check failing     -> send Failure2,   Failed
/// ```
pub struct HostAuth {
    config: Arc<HostAuthConfig>,
    qid: u16,
    t_id: u16,
    state: State,
    rng: Box<dyn RandomSource>,
}

impl std::fmt::Debug for HostAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAuth")
            .field("qid", &self.qid)
            .field("t_id", &self.t_id)
            .finish_non_exhaustive()
    }
}

impl HostAuth {
    /// A transaction on queue `qid` with transaction ID `t_id`, using the
    /// operating system's random numbers. Linux numbers transactions with
    /// a per-controller counter; any value works as long as it differs
    /// from the previous transaction's on the queue.
    pub fn new(config: Arc<HostAuthConfig>, qid: u16, t_id: u16) -> Result<Self, AuthError> {
        Self::with_random(config, qid, t_id, Box::new(OsRandom))
    }

    /// [`Self::new`] with injected randomness (C2, S2, the DH private key).
    pub fn with_random(
        config: Arc<HostAuthConfig>,
        qid: u16,
        t_id: u16,
        rng: Box<dyn RandomSource>,
    ) -> Result<Self, AuthError> {
        config.validate()?;
        Ok(Self {
            config,
            qid,
            t_id,
            state: State::Start,
            rng,
        })
    }

    /// The queue this transaction authenticates.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The transaction ID.
    pub fn t_id(&self) -> u16 {
        self.t_id
    }

    /// Begin: the AUTH_Negotiate to send.
    pub fn start(&mut self) -> HostStep {
        if !matches!(self.state, State::Start) {
            return self.finish_quietly(AuthError::Misuse("start called twice"));
        }
        let c = &self.config;
        let descriptor =
            ProtocolDescriptor::dhchap(&c.hashes, &c.dh_groups).expect("validated lengths");
        let negotiate = Negotiate {
            t_id: self.t_id,
            // No secure channel concatenation.
            sc_c: 0,
            descriptors: vec![descriptor],
        };
        match negotiate.encode() {
            Ok(bytes) => {
                self.state = State::AwaitChallenge;
                HostStep {
                    send: Some(bytes),
                    next: HostNext::Receive {
                        al: HOST_RECEIVE_AL,
                    },
                }
            }
            Err(_) => self.finish_quietly(AuthError::Misuse("negotiate does not encode")),
        }
    }

    /// Feed the data an Authentication Receive returned.
    pub fn receive(&mut self, data: &[u8]) -> HostStep {
        if matches!(self.state, State::Start | State::Finished) {
            return self.finish_quietly(AuthError::Misuse("receive outside a transaction"));
        }
        let msg = match AuthMessage::decode(data) {
            Ok(m) => m,
            Err(e) => return self.fail(e.into()),
        };
        if let AuthMessage::Failure1(f) = msg {
            // The controller gave up; Linux does not answer a Failure1.
            return self.finish_quietly(AuthError::PeerFailure {
                reason_code: f.reason_code,
                explanation: f.explanation,
            });
        }
        let state = std::mem::replace(&mut self.state, State::Finished);
        match (state, msg) {
            (State::AwaitChallenge, AuthMessage::Challenge(c)) => self.on_challenge(c),
            (
                State::AwaitSuccess1 {
                    hash,
                    dh_group,
                    session_key,
                    ctrl_challenge,
                },
                AuthMessage::Success1(s),
            ) => self.on_success1(s, hash, dh_group, session_key, ctrl_challenge),
            (State::Start | State::Finished, _) => {
                self.finish_quietly(AuthError::Misuse("receive outside a transaction"))
            }
            (state, msg) => {
                let expected = match state {
                    State::AwaitChallenge => "DH-HMAC-CHAP_Challenge",
                    _ => "DH-HMAC-CHAP_Success1",
                };
                self.fail(AuthError::UnexpectedMessage {
                    expected,
                    got: msg.name(),
                })
            }
        }
    }

    fn check_t_id(&self, got: u16) -> Result<(), AuthError> {
        if got != self.t_id {
            return Err(AuthError::TransactionId {
                expected: self.t_id,
                got,
            });
        }
        Ok(())
    }

    fn on_challenge(&mut self, c: Challenge) -> HostStep {
        match self.challenge_to_reply(&c) {
            Ok((reply, next_state)) => match reply.encode() {
                Ok(bytes) => {
                    self.state = next_state;
                    HostStep {
                        send: Some(bytes),
                        next: HostNext::Receive {
                            al: HOST_RECEIVE_AL,
                        },
                    }
                }
                Err(_) => self.fail(AuthError::Misuse("reply does not encode")),
            },
            Err(e) => self.fail(e),
        }
    }

    fn challenge_to_reply(&mut self, c: &Challenge) -> Result<(Reply, State), AuthError> {
        self.check_t_id(c.t_id)?;
        let config = Arc::clone(&self.config);
        if !config.hashes.contains(&c.hash) {
            return Err(AuthError::HashUnusable);
        }
        if !config.dh_groups.contains(&c.dh_group) {
            return Err(AuthError::DhGroupUnusable);
        }
        let (dh_value, session_key) = if c.dh_group.is_null() {
            (Vec::new(), None)
        } else {
            let x = DhPrivateKey::generate(c.dh_group, &mut *self.rng).map_err(|e| match e {
                DhKeyError::Random(r) => AuthError::Random(r),
                DhKeyError::Group(g) => AuthError::DhValue(g),
            })?;
            let session = x.shared_secret(&c.dh_value)?;
            (x.public_value(), Some(session))
        };
        let key = config.host_secret.transform(&config.host_nqn);
        let response = host_response(
            &key,
            &ResponseInput {
                hash: c.hash,
                challenge: c.challenge.as_bytes(),
                session_key: session_key.as_ref(),
                seq_num: c.seq_num,
                t_id: self.t_id,
                sc_c: 0,
                host_nqn: &config.host_nqn,
                subsys_nqn: &config.subsys_nqn,
            },
        );
        let ctrl_challenge = match &config.ctrl_secret {
            Some(_) => {
                let mut c2 = [0u8; 64];
                self.rng.fill(&mut c2[..c.hash.output_len()])?;
                let s2 = random_seq_num(&mut *self.rng)?;
                Some((
                    HashValue::new(&c2[..c.hash.output_len()]).expect("HL ≤ 64"),
                    s2,
                ))
            }
            None => None,
        };
        let reply = Reply {
            t_id: self.t_id,
            response,
            ctrl_challenge: ctrl_challenge.as_ref().map(|(c2, _)| c2.clone()),
            seq_num: ctrl_challenge.as_ref().map_or(0, |(_, s2)| *s2),
            dh_value,
        };
        let state = State::AwaitSuccess1 {
            hash: c.hash,
            dh_group: c.dh_group,
            session_key,
            ctrl_challenge,
        };
        Ok((reply, state))
    }

    fn on_success1(
        &mut self,
        s: Success1,
        hash: HashId,
        dh_group: DhGroup,
        session_key: Option<SessionKey>,
        ctrl_challenge: Option<(HashValue, u32)>,
    ) -> HostStep {
        if let Err(e) = self.check_t_id(s.t_id) {
            return self.fail(e);
        }
        if s.hash_len as usize != hash.output_len() {
            return self.fail(
                MessageError {
                    message: "DH-HMAC-CHAP_Success1",
                    field: "HL",
                    offset: 6,
                    reason: "not the output size of the challenge's hash",
                    explanation: FailureExplanation::HASH_UNUSABLE,
                }
                .into(),
            );
        }
        let config = Arc::clone(&self.config);
        let Some((c2, s2)) = ctrl_challenge else {
            // Unidirectional: an R2 we did not ask for has nothing to be
            // checked against, and is ignored.
            return HostStep {
                send: None,
                next: HostNext::Done(Authenticated {
                    hash,
                    dh_group,
                    bidirectional: false,
                    session_key,
                }),
            };
        };
        let Some(r2) = s.response else {
            return self.fail(AuthError::ControllerNotAuthenticated);
        };
        let ctrl_secret = config.ctrl_secret.as_ref().expect("C2 only with a secret");
        let key = ctrl_secret.transform(&config.subsys_nqn);
        let expected = controller_response(
            &key,
            &ResponseInput {
                hash,
                challenge: c2.as_bytes(),
                session_key: session_key.as_ref(),
                seq_num: s2,
                t_id: self.t_id,
                sc_c: 0,
                host_nqn: &config.host_nqn,
                subsys_nqn: &config.subsys_nqn,
            },
        );
        if !expected.ct_eq(r2.as_bytes()) {
            return self.fail(AuthError::ControllerResponseMismatch);
        }
        HostStep {
            send: Some(Success2 { t_id: self.t_id }.encode()),
            next: HostNext::Done(Authenticated {
                hash,
                dh_group,
                bidirectional: true,
                session_key,
            }),
        }
    }

    /// End the transaction and tell the controller with AUTH_Failure2.
    fn fail(&mut self, e: AuthError) -> HostStep {
        self.state = State::Finished;
        let failure = Failure::new(self.t_id, e.explanation());
        HostStep {
            send: Some(AuthMessage::Failure2(failure).encode().expect("fixed size")),
            next: HostNext::Failed(e),
        }
    }

    /// End the transaction without sending anything.
    fn finish_quietly(&mut self, e: AuthError) -> HostStep {
        self.state = State::Finished;
        HostStep {
            send: None,
            next: HostNext::Failed(e),
        }
    }
}
