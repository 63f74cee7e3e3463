//! A blocking client of the arbiter, for the ublk-nvmf daemon (which calls
//! [`ArbiterClient::allocate`] from a dedicated thread) and the admin
//! commands.
//!
//! It finds the leader in etcd (the leader key, [`Store::leader`]), or
//! from a refusal's `x-arbiter-leader` metadata, or at a fixed address,
//! and follows it: a call that meets a non-leader, no leader, a dead
//! connection or a timeout is sent again to the leader found anew, with
//! backoff, until its deadline. Only refusals retrying cannot cure (a bad
//! argument, an unknown eVol, an extent out of range, no room) end a call
//! before its deadline.
//!
//! Like [`cluster_store::Store`], it runs its own current-thread tokio
//! runtime: not `Sync`; one per thread that calls it.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use cluster_store::evol::{EvolKeys, ExtentRecord, Placement};
use cluster_store::records::SCHEMA;
use cluster_store::{Store, StoreConfig};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::limits;
use crate::pb;
use crate::pb::arbiter_client::ArbiterClient as Rpc;

pub use crate::pb::{IoKind, IoVector, NamespaceInfo, SliceGrant, StatusResponse, VolumeInfo};

/// How to find the arbiter.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// etcd endpoints (where the leader key is); may be empty when
    /// `arbiter` is set.
    pub endpoints: Vec<String>,
    /// The key prefix (the arbiter's `[etcd] prefix`).
    pub prefix: String,
    /// An arbiter's address to try first (`HOST:PORT`); a non-leader's
    /// refusal redirects to the leader.
    pub arbiter: Option<String>,
    /// Bound on one etcd request.
    pub etcd_timeout: Duration,
    /// Bound on one RPC attempt.
    pub rpc_timeout: Duration,
    /// Overall deadline of the calls that take none (all but
    /// [`ArbiterClient::allocate`]), failovers included.
    pub call_timeout: Duration,
}

impl ClientOptions {
    /// Defaults: 1 s per etcd request, 5 s per RPC attempt, 15 s per call
    /// (three lease TTLs of the default 5 s: a failover fits).
    pub fn new(endpoints: Vec<String>, prefix: &str) -> Self {
        ClientOptions {
            endpoints,
            prefix: prefix.to_owned(),
            arbiter: None,
            etcd_timeout: Duration::from_secs(1),
            rpc_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(15),
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ArbiterError {
    /// No leader answered before the deadline; the last failure says why.
    /// Retrying later may succeed.
    #[error("no arbiter leader answered in time: {0}")]
    Unavailable(String),
    /// The leader refused the request; retrying will not help (unknown
    /// eVol, extent out of range, no room, a bad argument...).
    #[error("the arbiter refused: {message} ({code:?})")]
    Refused {
        /// The gRPC code (NotFound, OutOfRange, ResourceExhausted,
        /// InvalidArgument, AlreadyExists, FailedPrecondition...).
        code: Code,
        /// The arbiter's message.
        message: String,
    },
    /// The options cannot work (no endpoints and no address).
    #[error("{0}")]
    Config(String),
}

/// The blocking client; see the module documentation.
pub struct ArbiterClient {
    rt: tokio::runtime::Runtime,
    store: Option<Store>,
    keys: EvolKeys,
    opts: ClientOptions,
    /// The connection in use and its address.
    conn: RefCell<Option<(String, Rpc<Channel>)>>,
    /// Where a refusal said the leader is.
    hint: RefCell<Option<String>>,
}

/// Whether a failure is one a retry (at the leader found anew) may cure.
fn retryable(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::Aborted | Code::DeadlineExceeded | Code::Cancelled => true,
        Code::Unknown | Code::Internal => {
            s.message().contains("transport")
                || s.message().contains("connection")
                || s.message().contains("h2")
        }
        Code::FailedPrecondition => s.metadata().contains_key(crate::LEADER_METADATA),
        _ => false,
    }
}

impl ArbiterClient {
    /// A client; connects lazily (the first call finds the leader).
    pub fn connect(opts: ClientOptions) -> Result<Self, ArbiterError> {
        if opts.endpoints.is_empty() && opts.arbiter.is_none() {
            return Err(ArbiterError::Config(
                "give etcd endpoints or an arbiter address".into(),
            ));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ArbiterError::Config(format!("cannot start a runtime: {e}")))?;
        let store = if opts.endpoints.is_empty() {
            None
        } else {
            Some(
                Store::connect(StoreConfig {
                    endpoints: opts.endpoints.clone(),
                    op_timeout: opts.etcd_timeout,
                })
                .map_err(|e| ArbiterError::Config(e.to_string()))?,
            )
        };
        Ok(ArbiterClient {
            rt,
            store,
            keys: EvolKeys::new(&opts.prefix),
            opts,
            conn: RefCell::new(None),
            hint: RefCell::new(None),
        })
    }

    /// The address of the arbiter the client talks to now, if connected.
    pub fn connected_to(&self) -> Option<String> {
        self.conn.borrow().as_ref().map(|(a, _)| a.clone())
    }

    /// Where to send the next attempt.
    fn resolve(&self) -> Result<String, String> {
        if let Some(h) = self.hint.borrow_mut().take() {
            return Ok(h);
        }
        if let Some(store) = &self.store {
            return match store.leader(&self.keys) {
                Ok(Some(l)) => Ok(l.address),
                Ok(None) => Err("no arbiter leads (no leader key in etcd)".into()),
                Err(e) => Err(e.to_string()),
            };
        }
        self.opts
            .arbiter
            .clone()
            .ok_or_else(|| "no arbiter address".into())
    }

    fn channel(&self, addr: &str, timeout: Duration) -> Result<Rpc<Channel>, String> {
        if let Some((a, c)) = self.conn.borrow().as_ref() {
            if a == addr {
                return Ok(c.clone());
            }
        }
        let ep = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("{addr}: {e}"))?
            .connect_timeout(timeout);
        let ch = self
            .rt
            .block_on(async { tokio::time::timeout(timeout, ep.connect()).await })
            .map_err(|_| format!("{addr}: no connection within {timeout:?}"))?
            .map_err(|e| format!("{addr}: {e}"))?;
        let c = Rpc::new(ch)
            .max_decoding_message_size(limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(limits::MAX_MESSAGE_BYTES);
        *self.conn.borrow_mut() = Some((addr.to_owned(), c.clone()));
        Ok(c)
    }

    /// One call with retries until `deadline` (see the module docs).
    fn call<T, F, Fut>(&self, deadline: Instant, f: F) -> Result<T, ArbiterError>
    where
        F: Fn(Rpc<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut backoff = Duration::from_millis(20);
        let mut last = String::from("no attempt made");
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(ArbiterError::Unavailable(last));
            }
            let left = deadline - now;
            let attempt_timeout = self.opts.rpc_timeout.min(left);
            let mut redirected = false;
            match self
                .resolve()
                .and_then(|addr| self.channel(&addr, attempt_timeout).map(|c| (addr, c)))
            {
                Err(e) => last = e,
                Ok((addr, c)) => {
                    let r = self
                        .rt
                        .block_on(async { tokio::time::timeout(attempt_timeout, f(c)).await });
                    match r {
                        Ok(Ok(resp)) => return Ok(resp.into_inner()),
                        Ok(Err(s)) if !retryable(&s) => {
                            return Err(ArbiterError::Refused {
                                code: s.code(),
                                message: s.message().to_owned(),
                            })
                        }
                        Ok(Err(s)) => {
                            last = format!("{addr}: {}", s.message());
                            if let Some(l) = s
                                .metadata()
                                .get(crate::LEADER_METADATA)
                                .and_then(|v| v.to_str().ok())
                            {
                                // A standby named the leader: go there now.
                                redirected = l != addr;
                                *self.hint.borrow_mut() = Some(l.to_owned());
                            }
                        }
                        Err(_) => last = format!("{addr}: no answer within {attempt_timeout:?}"),
                    }
                    *self.conn.borrow_mut() = None;
                }
            }
            if !redirected {
                let pause = backoff.min(deadline.saturating_duration_since(Instant::now()));
                std::thread::sleep(pause);
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
    }

    fn default_deadline(&self) -> Instant {
        Instant::now() + self.opts.call_timeout
    }

    /// The copies of logical extent `index` of `evol`: mapped by this call
    /// or earlier (by anyone), durable in etcd when this returns. Retries
    /// across leader failover until `deadline`; the same extent always
    /// gets the same answer.
    pub fn allocate(
        &self,
        evol: &str,
        index: u64,
        deadline: Instant,
    ) -> Result<ExtentRecord, ArbiterError> {
        let r = self.call(deadline, |mut c| {
            let req = pb::AllocateRequest {
                evol: evol.to_owned(),
                index,
            };
            async move { c.allocate(req).await }
        })?;
        Ok(ExtentRecord {
            schema: SCHEMA,
            evol: r.evol,
            index: r.index,
            copies: r
                .copies
                .into_iter()
                .map(|c| Placement {
                    namespace: c.namespace,
                    pext: c.pext,
                })
                .collect(),
        })
    }

    /// Reports a batch of completed I/Os of `client`'s sessions of `evol`
    /// (at most [`limits::MAX_REPORT_BATCH`]) to the view.
    pub fn report_io(
        &self,
        client: &str,
        evol: &str,
        batch: &[IoVector],
    ) -> Result<pb::ReportIoResponse, ArbiterError> {
        self.call(self.default_deadline(), |mut c| {
            let req = pb::ReportIoRequest {
                client: client.to_owned(),
                evol: evol.to_owned(),
                vectors: batch.to_vec(),
            };
            async move { c.report_io(req).await }
        })
    }

    /// Asks for up to `slices` slices (1 to
    /// [`limits::MAX_SLICES_PER_REQUEST`]) of each of `namespaces` for
    /// `client`'s sessions of `evol`, waiting up to `wait` (at most 1 s)
    /// for grants not available at once; the grants available by then
    /// (possibly none: ask again).
    pub fn request_slices(
        &self,
        client: &str,
        evol: &str,
        namespaces: &[String],
        slices: u32,
        wait: Duration,
    ) -> Result<Vec<SliceGrant>, ArbiterError> {
        let slices = slices.clamp(1, limits::MAX_SLICES_PER_REQUEST);
        let wait_ms = wait.as_millis().min(u128::from(limits::MAX_SLICE_WAIT_MS)) as u32;
        self.call(self.default_deadline(), |mut c| {
            let req = pb::RequestSlicesRequest {
                client: client.to_owned(),
                evol: evol.to_owned(),
                namespaces: namespaces.to_vec(),
                wait_ms,
                slices,
            };
            async move { c.request_slices(req).await }
        })
        .map(|r| r.grants)
    }

    /// `client`'s sessions of `evol` no longer need `namespaces`.
    pub fn release_slices(
        &self,
        client: &str,
        evol: &str,
        namespaces: &[String],
    ) -> Result<(), ArbiterError> {
        self.call(self.default_deadline(), |mut c| {
            let req = pb::ReleaseSlicesRequest {
                client: client.to_owned(),
                evol: evol.to_owned(),
                namespaces: namespaces.to_vec(),
            };
            async move { c.release_slices(req).await }
        })
        .map(|_| ())
    }

    /// The view of `namespaces` (all if empty) and the last bottleneck
    /// report.
    pub fn query_view(&self, namespaces: &[String]) -> Result<pb::QueryViewResponse, ArbiterError> {
        self.call(self.default_deadline(), |mut c| {
            let req = pb::QueryViewRequest {
                namespaces: namespaces.to_vec(),
            };
            async move { c.query_view(req).await }
        })
    }

    /// Creates an eVol (idempotent for the same spec).
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        copies: u32,
        weight: u32,
    ) -> Result<VolumeInfo, ArbiterError> {
        self.call(self.default_deadline(), |mut c| {
            let req = pb::CreateVolumeRequest {
                name: name.to_owned(),
                size_bytes,
                copies,
                weight,
            };
            async move { c.create_volume(req).await }
        })
    }

    /// Deletes an eVol: unmaps every extent, then the spec. The physical
    /// extents freed (zeroed by the arbiter before reuse). Refused
    /// (`FAILED_PRECONDITION`, naming the host) while a client host serves
    /// the eVol, unless `force`, which is dangerous: see
    /// `DeleteVolumeRequest.force`.
    pub fn delete_volume(&self, name: &str, force: bool) -> Result<u64, ArbiterError> {
        self.call(self.default_deadline(), |mut c| {
            let req = pb::DeleteVolumeRequest {
                name: name.to_owned(),
                force,
            };
            async move { c.delete_volume(req).await }
        })
        .map(|r| r.freed_extents)
    }

    /// Grows an eVol to `size_bytes` (rounded up to whole extents).
    pub fn grow_volume(&self, name: &str, size_bytes: u64) -> Result<VolumeInfo, ArbiterError> {
        self.call(self.default_deadline(), |mut c| {
            let req = pb::GrowVolumeRequest {
                name: name.to_owned(),
                size_bytes,
            };
            async move { c.grow_volume(req).await }
        })
    }

    /// Every eVol.
    pub fn list_volumes(&self) -> Result<Vec<VolumeInfo>, ArbiterError> {
        self.call(self.default_deadline(), |mut c| async move {
            c.list_volumes(pb::ListVolumesRequest {}).await
        })
        .map(|r| r.volumes)
    }

    /// Adds (or grows, or moves) a namespace of the pool.
    pub fn add_namespace(
        &self,
        req: &pb::AddNamespaceRequest,
    ) -> Result<NamespaceInfo, ArbiterError> {
        self.call(self.default_deadline(), |mut c| {
            let req = req.clone();
            async move { c.add_namespace(req).await }
        })
    }

    /// Every namespace of the pool with its use.
    pub fn list_namespaces(&self) -> Result<Vec<NamespaceInfo>, ArbiterError> {
        self.call(self.default_deadline(), |mut c| async move {
            c.list_namespaces(pb::ListNamespacesRequest {}).await
        })
        .map(|r| r.namespaces)
    }

    /// The status of the arbiter this client reaches (the leader, when
    /// one is elected).
    pub fn status(&self) -> Result<StatusResponse, ArbiterError> {
        self.call(self.default_deadline(), |mut c| async move {
            c.status(pb::StatusRequest {}).await
        })
    }
}
