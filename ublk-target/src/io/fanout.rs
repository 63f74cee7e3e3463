//! The fan-out of one ublk queue's requests to their parts, as a sans-IO
//! state machine: events in (a part answered, a part will never be
//! answered, an intent-log record was made), [`Action`]s out (send a part,
//! record what a replica missed, complete the tag). The engine
//! ([`crate::io::engine`]) feeds it and carries the actions out; it decides
//! nothing about a request's parts on its own.
//!
//! # Requests, pieces, copies, parts
//!
//! A request (one ublk tag) is made of *pieces*, consecutive byte ranges of
//! the request, each stored as one or more *copies*; a *part* is one copy of
//! one piece, one NVMe command on one path ([`PartId`]). A mirrored volume
//! has one piece per request and one copy per replica, so copy `c` is
//! replica `c`; an elastic volume (extents on many namespaces) will split a
//! request at extent boundaries into several pieces, each with its
//! extent's copies. The machine does not know which: it sees copy indices
//! in a [`ReplicaSet`] per piece.
//!
//! A read piece goes to one copy; a write piece (write, discard,
//! write-zeroes: anything that changes the volume's bytes) to every
//! writable copy; a flush to every copy, without changing bytes.
//!
//! # The rules
//!
//! - **A write's skipped copies are recorded before it leaves.** A write
//!   piece first asks for [`Action::BeforeWrite`] (the intent log records
//!   it for every copy not in its set, durably); its parts are sent only
//!   once [`FanOut::prepared`] says the record holds. If it does not, the
//!   piece is never sent and the request fails.
//! - **A copy that misses a write is recorded before the write is
//!   acknowledged.** When a write part will not be answered (its replica
//!   went out of sync: [`FanOut::dropped`]) or was answered with an error
//!   while another copy is in sync ([`FanOut::answered`]), the machine asks
//!   for [`Action::WriteMissed`] and keeps the part live until
//!   [`FanOut::recorded`] confirms it; a failed record fails the request.
//!   With no other copy in sync, an error fails the request (the write is
//!   nowhere).
//! - **A read is retried on another copy** that serves reads and has not
//!   been tried for this piece yet: after an error status
//!   ([`Action::Retry`]) or when its replica drops out
//!   ([`Action::Reroute`]). With none left, the request fails. (Each copy
//!   is tried once, so two copies that both answer errors cannot pass a
//!   read back and forth for ever.)
//! - **A flush** that fails on any copy fails the request (that copy
//!   cannot be trusted to hold what was written); one to a replica that
//!   dropped out is not needed any more.
//! - **A tag completes exactly once, and only when every live part has
//!   ended**: answered, given up ([`FanOut::failed`]), or dropped and, for
//!   a write, recorded. Holding is the caller's business: a part on the
//!   last in-sync replica whose path is down is simply not answered yet
//!   (the engine keeps it and resends it on the next connection), so the
//!   tag waits.
//!
//! Every part that ends without an answer gives back what the QoS stage
//! charged for it ([`Action::Release`]); answered parts are accounted by
//! the caller with the completion's credits.
//!
//! Events about a part that is not live (a second answer, an answer after
//! the tag completed) change nothing; [`FanOut::stale_events`] counts them.

use std::collections::VecDeque;
use std::ops::Range;

use qos_core::{Nanos, ReplicaSet};

/// Most pieces one request may be split into.
pub const MAX_PIECES: usize = 16;

/// One part of a request: copy `copy` of piece `piece` of tag `tag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartId {
    /// The ublk tag.
    pub tag: u16,
    /// The piece of the request.
    pub piece: u8,
    /// The copy of the piece (the replica, on a mirrored volume).
    pub copy: u8,
}

impl PartId {
    /// The NVMe request's `user_data`: the part, so a completion names it.
    pub fn user_data(self) -> u64 {
        u64::from(self.tag) | u64::from(self.piece) << 16 | u64::from(self.copy) << 24
    }

    /// The part a completion's `user_data` names (`None` for values this
    /// engine never hands out).
    pub fn from_user_data(v: u64) -> Option<PartId> {
        (v >> 32 == 0).then_some(PartId {
            tag: v as u16,
            piece: (v >> 16) as u8,
            copy: (v >> 24) as u8,
        })
    }

    /// Copy `copy` of the same piece.
    pub fn with_copy(self, copy: usize) -> PartId {
        debug_assert!(copy < qos_core::replica_set::MAX_REPLICAS);
        PartId {
            copy: copy as u8,
            ..self
        }
    }

    fn copy(self) -> usize {
        usize::from(self.copy)
    }
}

/// What a request does to the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read: each piece from one copy.
    Read,
    /// Write, discard, write-zeroes: each piece to every writable copy;
    /// changes the bytes of its pieces.
    Write,
    /// Flush (or another command that changes no bytes), to every copy.
    Flush,
}

/// One piece of a request as the caller splits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceSpec {
    /// The volume bytes the piece covers (what the intent log records for
    /// a write); empty for a flush.
    pub range: Range<u64>,
    /// The copies it goes to: one for a read.
    pub copies: ReplicaSet,
}

/// What the caller must do, in order ([`FanOut::poll_action`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Record a write of `range` for every copy not in `to` (the intent
    /// log, durably) before any part of it is sent, and tell a running
    /// resync; then call [`FanOut::prepared`].
    BeforeWrite {
        /// The request.
        tag: u16,
        /// Its piece.
        piece: u8,
        /// The bytes it changes.
        range: Range<u64>,
        /// The copies it will be sent to.
        to: ReplicaSet,
    },
    /// Send the part.
    Send(PartId),
    /// A read part's replica dropped out: move its QoS charge from `from`
    /// to `to`'s copy and send it there.
    Reroute {
        /// The part that will not be answered.
        from: PartId,
        /// The part to send instead.
        to: PartId,
    },
    /// A read part was answered with an error: send it to another copy
    /// (uncharged; the failed part was accounted with its answer).
    Retry(PartId),
    /// The part ended without an answer: give back its QoS charge.
    Release(PartId),
    /// The part's copy did not get the write of `range` (or its outcome
    /// there is unknown): record that, durably, before the request is
    /// acknowledged; with `out_of_sync`, first take the copy's replica out
    /// of sync (it answered the write with an error, so it no longer holds
    /// the data: reset its controller). Then call [`FanOut::recorded`].
    WriteMissed {
        /// The part.
        part: PartId,
        /// The bytes its copy missed.
        range: Range<u64>,
        /// Whether the replica must be marked out of sync first.
        out_of_sync: bool,
    },
    /// Every part of the write piece has ended: tell a running resync
    /// (pairs with [`Action::BeforeWrite`]'s `to`).
    AfterWrite {
        /// The request.
        tag: u16,
        /// The bytes it changed.
        range: Range<u64>,
        /// The copies it was sent to.
        sent: ReplicaSet,
    },
    /// The request is over: `ok` if it succeeded. Comes last, once.
    Complete {
        /// The request.
        tag: u16,
        /// Its outcome.
        ok: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceState {
    /// Waiting for [`FanOut::prepared`].
    Preparing,
    /// Its parts went out.
    Sent,
}

#[derive(Debug, Clone)]
struct Piece {
    range: Range<u64>,
    state: PieceState,
    /// Copies it was (or will be) sent to.
    sent: ReplicaSet,
    /// Parts awaiting an answer.
    outstanding: ReplicaSet,
    /// Parts whose missed write awaits [`FanOut::recorded`].
    recording: ReplicaSet,
    /// Copies a read was tried on.
    tried: ReplicaSet,
}

impl Piece {
    fn live(&self) -> bool {
        self.state == PieceState::Preparing
            || !self.outstanding.is_empty()
            || !self.recording.is_empty()
    }
}

#[derive(Debug, Default)]
struct TagState {
    active: bool,
    op: Option<Op>,
    pieces: Vec<Piece>,
    failed: bool,
    started: Nanos,
}

/// The fan-out of one ublk queue; see the module documentation.
#[derive(Debug)]
pub struct FanOut {
    tags: Vec<TagState>,
    actions: VecDeque<Action>,
    active: usize,
    stale: u64,
}

impl FanOut {
    /// A machine for tags `0..depth`.
    pub fn new(depth: u16) -> Self {
        FanOut {
            tags: (0..depth).map(|_| TagState::default()).collect(),
            actions: VecDeque::new(),
            active: 0,
            stale: 0,
        }
    }

    /// The next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether tag `tag` has a request in the machine.
    pub fn is_active(&self, tag: u16) -> bool {
        self.tags.get(usize::from(tag)).is_some_and(|t| t.active)
    }

    /// Requests in the machine.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Events that named a part that was not live.
    pub fn stale_events(&self) -> u64 {
        self.stale
    }

    /// How long the oldest request in the machine has been in it.
    pub fn oldest_age(&self, now: Nanos) -> Option<Nanos> {
        self.tags
            .iter()
            .filter(|t| t.active)
            .map(|t| Nanos(now.nanos_since(t.started)))
            .max()
    }

    /// Whether `part` awaits an answer.
    pub fn is_outstanding(&self, part: PartId) -> bool {
        self.piece(part)
            .is_some_and(|p| p.outstanding.contains(part.copy()))
    }

    /// A request for tag `tag`, admitted at `now`, made of `pieces`.
    ///
    /// # Panics
    /// In debug builds, if the tag is active, there is no piece or more
    /// than [`MAX_PIECES`], or a read piece has other than one copy.
    pub fn start(&mut self, now: Nanos, tag: u16, op: Op, pieces: &[PieceSpec]) {
        let t = usize::from(tag);
        debug_assert!(!self.tags[t].active, "tag {tag} started twice");
        debug_assert!(!pieces.is_empty() && pieces.len() <= MAX_PIECES);
        let st = &mut self.tags[t];
        st.active = true;
        st.op = Some(op);
        st.failed = false;
        st.started = now;
        st.pieces.clear();
        self.active += 1;
        for (i, spec) in pieces.iter().enumerate() {
            debug_assert!(
                op != Op::Read || spec.copies.len() == 1,
                "a read has one copy"
            );
            let piece = i as u8;
            let preparing = op == Op::Write;
            self.tags[t].pieces.push(Piece {
                range: spec.range.clone(),
                state: if preparing {
                    PieceState::Preparing
                } else {
                    PieceState::Sent
                },
                sent: spec.copies,
                outstanding: if preparing {
                    ReplicaSet::EMPTY
                } else {
                    spec.copies
                },
                recording: ReplicaSet::EMPTY,
                tried: if op == Op::Read {
                    spec.copies
                } else {
                    ReplicaSet::EMPTY
                },
            });
            if preparing {
                self.actions.push_back(Action::BeforeWrite {
                    tag,
                    piece,
                    range: spec.range.clone(),
                    to: spec.copies,
                });
            } else {
                for c in spec.copies {
                    self.actions.push_back(Action::Send(PartId {
                        tag,
                        piece,
                        copy: c as u8,
                    }));
                }
            }
        }
        self.maybe_complete(tag);
    }

    /// The [`Action::BeforeWrite`] of `tag`'s `piece` is done: `ok` if the
    /// record holds (then the parts go out), else the piece is never sent
    /// and the request fails.
    pub fn prepared(&mut self, tag: u16, piece: u8, ok: bool) {
        let Some(p) = self
            .tags
            .get_mut(usize::from(tag))
            .filter(|t| t.active)
            .and_then(|t| t.pieces.get_mut(usize::from(piece)))
            .filter(|p| p.state == PieceState::Preparing)
        else {
            self.stale += 1;
            return;
        };
        p.state = PieceState::Sent;
        let to = p.sent;
        if ok {
            p.outstanding = to;
            for c in to {
                self.actions.push_back(Action::Send(PartId {
                    tag,
                    piece,
                    copy: c as u8,
                }));
            }
        } else {
            // Nothing went anywhere: give back what every part was charged.
            for c in to {
                self.actions.push_back(Action::Release(PartId {
                    tag,
                    piece,
                    copy: c as u8,
                }));
            }
            self.tags[usize::from(tag)].failed = true;
        }
        self.maybe_complete(tag);
    }

    /// `part` was answered (`ok`: success status). `readable`: the copies
    /// of its piece that serve reads now (in sync and reachable or the
    /// last in sync), for a retry or to know whether a write is held
    /// elsewhere.
    pub fn answered(&mut self, part: PartId, ok: bool, readable: ReplicaSet) {
        let Some(op) = self.take_outstanding(part) else {
            return;
        };
        if !ok {
            let c = part.copy();
            match op {
                Op::Read => self.retry_read(part, readable, false),
                Op::Write if !readable.without(c).is_empty() => {
                    let range = self.piece(part).map(|p| p.range.clone()).unwrap_or(0..0);
                    self.record_missed(part, range, true);
                }
                Op::Write | Op::Flush => self.tags[usize::from(part.tag)].failed = true,
            }
        }
        self.maybe_complete(part.tag);
    }

    /// `part`'s replica is out of sync and the part will not be answered
    /// (the engine took it back from a failed path). A read moves to
    /// another copy, a write is recorded as missed there, a flush is not
    /// needed there any more.
    pub fn dropped(&mut self, part: PartId, readable: ReplicaSet) {
        let Some(op) = self.take_outstanding(part) else {
            return;
        };
        match op {
            Op::Read => self.retry_read(part, readable, true),
            Op::Write => {
                self.actions.push_back(Action::Release(part));
                let range = self.piece(part).map(|p| p.range.clone()).unwrap_or(0..0);
                self.record_missed(part, range, false);
            }
            Op::Flush => self.actions.push_back(Action::Release(part)),
        }
        self.maybe_complete(part.tag);
    }

    /// `part` failed for good (its controller is lost for longer than the
    /// policy allows, or a queue can never send it): the request fails.
    pub fn failed(&mut self, part: PartId) {
        if self.take_outstanding(part).is_none() {
            return;
        }
        self.actions.push_back(Action::Release(part));
        self.tags[usize::from(part.tag)].failed = true;
        self.maybe_complete(part.tag);
    }

    /// The [`Action::WriteMissed`] of `part` is done: `ok` if the record
    /// holds; if not, the request fails (its write cannot be acknowledged
    /// as held by the volume when nothing remembers the copy missed it).
    pub fn recorded(&mut self, part: PartId, ok: bool) {
        let Some(p) = self.piece_mut(part) else {
            self.stale += 1;
            return;
        };
        if !p.recording.remove(part.copy()) {
            self.stale += 1;
            return;
        }
        if !ok {
            self.tags[usize::from(part.tag)].failed = true;
        }
        self.maybe_complete(part.tag);
    }

    fn piece(&self, part: PartId) -> Option<&Piece> {
        self.tags
            .get(usize::from(part.tag))
            .filter(|t| t.active)?
            .pieces
            .get(usize::from(part.piece))
    }

    fn piece_mut(&mut self, part: PartId) -> Option<&mut Piece> {
        self.tags
            .get_mut(usize::from(part.tag))
            .filter(|t| t.active)?
            .pieces
            .get_mut(usize::from(part.piece))
    }

    /// Ends `part`'s wait for an answer; its request's op, or `None` (and
    /// counted stale) if it was not outstanding.
    fn take_outstanding(&mut self, part: PartId) -> Option<Op> {
        let op = self.tags.get(usize::from(part.tag)).and_then(|t| t.op);
        let removed = self
            .piece_mut(part)
            .is_some_and(|p| p.outstanding.remove(part.copy()));
        if removed {
            op
        } else {
            self.stale += 1;
            None
        }
    }

    fn record_missed(&mut self, part: PartId, range: Range<u64>, out_of_sync: bool) {
        if let Some(p) = self.piece_mut(part) {
            p.recording.insert(part.copy());
        }
        self.actions.push_back(Action::WriteMissed {
            part,
            range,
            out_of_sync,
        });
    }

    /// Send `part`'s read to a copy in `readable` not tried yet, or fail
    /// the request. `reroute`: the part was not answered (its charge moves
    /// with it); else it was answered with an error.
    fn retry_read(&mut self, part: PartId, readable: ReplicaSet, reroute: bool) {
        let next = self.piece_mut(part).and_then(|p| {
            let to = readable.difference(p.tried).first()?;
            p.tried.insert(to);
            p.outstanding.insert(to);
            Some(to)
        });
        match next {
            Some(to) if reroute => self.actions.push_back(Action::Reroute {
                from: part,
                to: part.with_copy(to),
            }),
            Some(to) => self.actions.push_back(Action::Retry(part.with_copy(to))),
            None => {
                if reroute {
                    self.actions.push_back(Action::Release(part));
                }
                self.tags[usize::from(part.tag)].failed = true;
            }
        }
    }

    fn maybe_complete(&mut self, tag: u16) {
        let st = &mut self.tags[usize::from(tag)];
        if !st.active || st.pieces.iter().any(Piece::live) {
            return;
        }
        if st.op == Some(Op::Write) {
            for p in &st.pieces {
                self.actions.push_back(Action::AfterWrite {
                    tag,
                    range: p.range.clone(),
                    sent: p.sent,
                });
            }
        }
        st.active = false;
        st.op = None;
        self.active -= 1;
        self.actions.push_back(Action::Complete {
            tag,
            ok: !st.failed,
        });
    }
}

#[cfg(test)]
mod tests;
