//! The control QP: the dedicated RC QP pair on the backup devices that carries the failover
//! protocol's own messages (`docs/failover.md` section 4), never the application's.
//!
//! Messages are 32-byte inline RDMA WRITE_WITH_IMMs ([`ControlRepr`]), as the SHIFT paper
//! synchronizes its two ends: each end has a **control ring** of `2 x depth` 32-byte slots on
//! its backup device, registered for remote writes, whose address and rkey the peer learns at
//! the rendezvous. Message number `k` (counted per direction from 0) is written into slot
//! `k mod 2 x depth` of the peer's ring, with `k` as the immediate. The immediate consumes one
//! of `depth` zero-length receive WQEs kept posted; the receiver checks that the write was one
//! whole slot and that the number is the next it expects (anything else is dropped, counted
//! and logged), reads the slot the immediate names, then posts the receive again.
//!
//! What a stranger can reach through the control QP is only the ring: the QP and the ring
//! live in a protection domain of their own, not the backup PD that holds the application's
//! memory, so a peer (or a forged packet) that writes through the control QP with some other
//! rkey of the backup device gets a remote access error. Each end sends from a random initial
//! PSN it publishes with its attributes (`PeerAttrs::control_psn`): control QPNs repeat from
//! process to process, and a stale request of an earlier run (held behind an unresolved
//! neighbour, `docs/testbed.md`) would otherwise be in sequence for a new QP at PSN 0.
//!
//! Why `2 x depth` slots: message `k + 2 x depth` can only be accepted once message
//! `k + depth` was, which took a receive WQE that was posted again only after slot `k` had been
//! read; so no message overwrites a slot before it is read, even on a NIC that places a
//! WRITE_WITH_IMM's data before it finds the receive WQE missing (softnic checks first).
//!
//! The service lcore polls the channel's CQ, which it shares with the other channels of its
//! device ([`cq`]; the CQ has completion events, so an idle service sleeps
//! until a message comes), and hands messages to the resilient QP's mailbox; the QP's own
//! lcore sends. Both take the channel's lock: control messages are rare, and the lock never
//! sits on the application's datapath.

pub(super) mod cq;

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::control::ModifyError;
use crate::control::{Pd, Qp, RegisteredBuffer};
use crate::datapath::wr::{RecvWr, Remote, SendOp, SendWr, WcOpcode, WorkCompletion};
use crate::failover::{
    ControlMessage, ControlPacket, ControlRepr, Event, Path, Side, SideEpoch, CONTROL_MESSAGE_LEN,
};
use crate::provider::VerbsError;
use crate::qp_state::QpState;
use crate::verbs::{random_psn, Access, AddressVector, Gid, QpAttr, QpCaps};

use cq::{Reservation, TakesCompletions};

/// The shared control CQs of a service, whose members are control channels.
pub(crate) type ChannelCqs = cq::ControlCqs<ControlChannel>;

/// Why a control message could not be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// The control QP is in ERR (the backup path failed) or refused the post.
    #[error("control QP {qpn:#x} cannot send: {reason}")]
    Broken {
        /// The control QP.
        qpn: u32,
        /// Why.
        reason: String,
    },
}

struct Inner {
    /// In the channel's own protection domain (the QP and the ring's MR keep it alive), which
    /// holds only the ring.
    qp: Qp,
    /// This end's control ring: where the peer writes its messages.
    ring: RegisteredBuffer,
    /// Receive WQEs kept posted; the ring has twice as many slots.
    depth: u32,
    /// The peer's control ring (address, rkey), once connected.
    peer_ring: Option<(u64, u32)>,
    /// The number of the next message this end sends...
    next_send: u32,
    /// ... and of the next it expects.
    next_recv: u32,
    /// The peer's default QPN: the destination every message names.
    peer_default_qpn: u32,
    /// Our default QPN: what messages for us name.
    local_default_qpn: u32,
    /// A send or receive failed: the channel is dead until a backup repair resets and
    /// reconnects it (`docs/failover.md` 5d).
    broken: bool,
    /// Where the peer is, kept from [`ControlChannel::connect`] for a reconnection.
    peer: Option<PeerLink>,
    /// Messages dropped: out of sequence, not one whole slot, or not a ring write.
    dropped: u64,
    /// Messages sent and not yet acknowledged (their send completions not polled).
    unacked: u32,
}

/// What [`ControlChannel::connect`] was told of the peer, kept for a reconnection in a new
/// backup epoch.
struct PeerLink {
    gid: Gid,
    qpn: u32,
    psn: u32,
    template_rtr: QpAttr,
    template_rts: QpAttr,
    handshake_timeout: std::time::Duration,
}

/// One end of a control QP pair.
pub(crate) struct ControlChannel {
    inner: Mutex<Inner>,
    /// The devices the channel is on: the backup devices (the failover protocol's channel) or
    /// the default devices (the channel that repairs the backup side).
    path: Path,
    qpn: u32,
    /// The first PSN this end sends.
    send_psn: u32,
    /// Its place in the device's shared control CQ, where its completions arrive.
    cq: Reservation<ControlChannel>,
    /// The mailbox of the resilient QP the channel serves: where the service puts what it
    /// polls for the channel.
    owner: OnceLock<Weak<dyn ChannelOwner>>,
}

impl std::fmt::Debug for ControlChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlChannel")
            .field("qpn", &self.qpn)
            .finish_non_exhaustive()
    }
}

/// Retries of the control QP: the most RC allows (3 bits).
const CONTROL_RETRY_CNT: u8 = 7;

/// The control QP's retransmit probe: while a message is unacknowledged it is resent 2 ms
/// after it was sent, then at twice the last wait up to 16 ms, spending no RC retry.
///
/// Why: the control QP's own ACK timer is long on purpose (its 8 tries outlast the handshake
/// wait, [`control_ack_timeout`]: 67 ms at the simulation's attributes, 537 ms at the apps'),
/// so a message sent while its path is down was resent once per ACK timeout; under a
/// flapping link those resends kept landing in the down windows, and after one outage the
/// round waited up to a whole timeout although the path was back. A resend every 16 ms at
/// most finds any window the path is up for longer than that; the ACK timer, which the
/// probe never moves, still decides when the path is given up. The cost while a path is
/// down: one 32-byte packet per unacknowledged channel every 16 ms; while an ACK is only
/// slow (queued behind a round's windows), a few duplicates the peer re-acknowledges and
/// does not execute.
///
/// Those are the waits of a device's first 16 channels (its first shared control CQ). A
/// channel of a later CQ, which takes 2, 4, ... 32 times as many, waits that many times
/// longer, and resends on hints (below) only in the first CQ: so the channels of one CQ
/// together resend about once per millisecond at the cap, whatever their number. Without the
/// scaling, a failover of 1,000 QPs at once (their messages' ACKs queued behind the windows
/// they all move to the backup) spent a storm of duplicates there: every QP on the backup
/// after 185-582 ms against 143-448 ms without the probe, and two runs of six lost
/// connections. With softnic's congestion window, unscaled 67-391 ms against 41-47 ms scaled
/// (`docs/measurements.md`).
const PROBE_FIRST: Duration = Duration::from_millis(2);
/// The longest wait between two resends of the probe (of the first CQ's channels).
const PROBE_CAP: Duration = Duration::from_millis(16);

/// The control QP's local ACK timeout exponent (4.096 us x 2^t): the application's
/// (`app`, 14 when it set none; 0, no timeout, stays 0), raised until the control QP's
/// `CONTROL_RETRY_CNT + 1` tries last at least `handshake_timeout`.
///
/// Why not the application's: a control message's ACK comes back on the backup path behind
/// everything the peer's end sent there before it answered, and a failover round sends the
/// outstanding windows of every QP that fails over at once. With 64 QPs of 128 16 KiB WRITEs
/// that is 128 MiB queued in front of the ACK; on softnic (and on a NIC with a slow or
/// congested backup port) it takes longer than an application's 16 ms x 4 tries, the control
/// QP exhausted its retries although every message had arrived, and the connection failed
/// with `backup-unavailable` (`docs/failover.md`, 4.1). A control QP carries a few messages
/// per round and nothing else, so a long timeout costs nothing while packets arrive; when
/// the backup path really is dead, the handshake timeout and the backup's link and data QPs
/// report it first.
pub(crate) fn control_ack_timeout(app: Option<u8>, handshake_timeout: std::time::Duration) -> u8 {
    let mut t = app.unwrap_or(14).min(31);
    if t == 0 {
        return 0;
    }
    let tries = u128::from(CONTROL_RETRY_CNT) + 1;
    while t < 31 && tries * (4096u128 << t) < handshake_timeout.as_nanos() {
        t += 1;
    }
    t
}

/// wr_id of control sends.
const SEND_WR_ID: u64 = u64::MAX;
/// wr_id of control receives (zero-length: the data goes to the ring).
const RECV_WR_ID: u64 = 0;

/// Where a channel's messages go: the mailbox of the QP it serves (`super::service::mailbox`, which
/// names this module, so the channel knows its owner only by this trait).
pub(crate) trait ChannelOwner: Send + Sync {
    /// Hands the owner an event the channel made of a completion.
    fn post_event(&self, event: Event);
}

impl TakesCompletions for ControlChannel {
    fn take_completion(&self, wc: &WorkCompletion, out: &mut Vec<Event>) {
        self.take(wc, out);
    }
}

impl ControlChannel {
    /// Creates the control QP and its ring on the device of the backup PD `backup_pd`, in a
    /// protection domain of the channel's own, its completions going to a CQ of `cqs` shared
    /// with the device's other channels.
    pub fn create(
        backup_pd: &Arc<Pd>,
        depth: u32,
        local_default_qpn: u32,
        cqs: &ChannelCqs,
    ) -> Result<Arc<ControlChannel>, VerbsError> {
        Self::create_on(Path::Backup, backup_pd, depth, local_default_qpn, cqs)
    }

    /// Creates a control QP and its ring on the device of `pd`, which is `path`'s device, in
    /// a protection domain of the channel's own, its completions going to a CQ of `cqs`
    /// shared with the device's other channels.
    pub fn create_on(
        path: Path,
        pd: &Arc<Pd>,
        depth: u32,
        local_default_qpn: u32,
        cqs: &ChannelCqs,
    ) -> Result<Arc<ControlChannel>, VerbsError> {
        // A power of two, so the slot of a message number stays consistent when the 32-bit
        // numbers wrap.
        let depth = depth.max(4).next_power_of_two();
        let ctx = pd.context();
        let own_pd = ctx.alloc_pd()?;
        let cq = cqs.reserve(ctx, depth)?;
        let qp = cq.cq.with_cq(|shared| {
            own_pd.create_qp(
                shared,
                shared,
                QpCaps {
                    max_send_wr: depth,
                    max_recv_wr: depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: CONTROL_MESSAGE_LEN as u32,
                },
            )
        })?;
        let ring = own_pd.alloc_buffer(
            2 * depth as usize * CONTROL_MESSAGE_LEN,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        // Receives may be posted from INIT on: `init` posts them.
        let qpn = qp.qpn();
        let channel = Arc::new(ControlChannel {
            inner: Mutex::new(Inner {
                qp,
                ring,
                depth,
                peer_ring: None,
                next_send: 0,
                next_recv: 0,
                peer_default_qpn: 0,
                local_default_qpn,
                broken: false,
                peer: None,
                dropped: 0,
                unacked: 0,
            }),
            path,
            qpn,
            send_psn: random_psn(),
            cq,
            owner: OnceLock::new(),
        });
        channel.cq.cq.attach(qpn, &channel);
        Ok(channel)
    }

    /// Names the mailbox of the QP the channel serves (once).
    pub fn set_owner<O: ChannelOwner + 'static>(&self, owner: &Arc<O>) {
        let owner: Weak<O> = Arc::downgrade(owner);
        let owner: Weak<dyn ChannelOwner> = owner;
        let _ = self.owner.set(owner);
    }

    /// The mailbox of the QP the channel serves, while it lives.
    pub fn owner(&self) -> Option<Arc<dyn ChannelOwner>> {
        self.owner.get().and_then(Weak::upgrade)
    }

    /// The shared CQ the channel's completions arrive on.
    #[cfg(all(test, feature = "soft"))]
    pub fn control_cq(&self) -> &Arc<cq::ControlCq<ControlChannel>> {
        &self.cq.cq
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The control QP's number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The first PSN this end sends (the peer's receive side starts there).
    pub fn send_psn(&self) -> u32 {
        self.send_psn
    }

    /// Messages dropped so far: out of sequence, not one whole slot, or not a ring write.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// This end's control ring as the peer must address it: (address, rkey).
    pub fn ring(&self) -> (u64, u32) {
        let c = self.lock();
        let remote = c.ring.remote(0);
        (remote.addr, remote.rkey)
    }

    /// RESET -> INIT (remote writes allowed: the peer writes into the ring), then posts the
    /// receives.
    pub fn init(&self) -> Result<(), ModifyError> {
        let mut c = self.lock();
        c.qp.modify(QpState::Init, &QpAttr::init(Access::REMOTE_WRITE))?;
        for _ in 0..c.depth {
            c.qp.post_recv(&RecvWr::new(RECV_WR_ID, &[])).map_err(|e| {
                ModifyError::Verbs(VerbsError::Failed {
                    device: c.qp.pd().context().name().to_string(),
                    verb: "post_recv (control ring)",
                    reason: e.to_string(),
                })
            })?;
        }
        Ok(())
    }

    /// INIT -> RTR -> RTS towards the peer's control QP `peer_qpn` on the device with GID
    /// `peer_gid`, which sends from `peer_psn`; `template_rtr`/`template_rts` are the
    /// application's attributes (path MTU and RNR timer carry over; no reads or atomics). The
    /// ACK timeout and retries are the control QP's own ([`control_ack_timeout`]): its
    /// retries must outlast `handshake_timeout`.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &self,
        peer_gid: Gid,
        peer_qpn: u32,
        peer_psn: u32,
        peer_default_qpn: u32,
        peer_ring: (u64, u32),
        template_rtr: &QpAttr,
        template_rts: &QpAttr,
        handshake_timeout: std::time::Duration,
    ) -> Result<(), ModifyError> {
        let mut c = self.lock();
        c.peer_default_qpn = peer_default_qpn;
        c.peer_ring = Some(peer_ring);
        c.peer = Some(PeerLink {
            gid: peer_gid,
            qpn: peer_qpn,
            psn: peer_psn,
            template_rtr: template_rtr.clone(),
            template_rts: template_rts.clone(),
            handshake_timeout,
        });
        let side = match self.path {
            Path::Backup => Side::Backup,
            Path::Default => Side::DefaultChannel,
        };
        self.bring_up(&mut c, SideEpoch::new(side, 0))
    }

    /// INIT -> RTR -> RTS towards the peer kept by `connect`, both directions' PSNs those of
    /// `epoch` ([`SideEpoch::start_psn`] of the published ones).
    fn bring_up(&self, c: &mut Inner, epoch: SideEpoch) -> Result<(), ModifyError> {
        let Some(peer) = &c.peer else {
            return Err(ModifyError::NotSaved {
                qpn: self.qpn,
                state: QpState::Rtr,
            });
        };
        let mut rtr = QpAttr::rtr(
            AddressVector::to_gid(peer.gid),
            peer.qpn,
            epoch.start_psn(peer.psn & 0x00ff_ffff),
            peer.template_rtr
                .path_mtu
                .unwrap_or(crate::verbs::Mtu::Mtu1024),
        );
        rtr.max_dest_rd_atomic = Some(0);
        if let Some(t) = peer.template_rtr.min_rnr_timer {
            rtr.min_rnr_timer = Some(t);
        }
        let mut rts = QpAttr::rts(epoch.start_psn(self.send_psn));
        rts.timeout = Some(control_ack_timeout(
            peer.template_rts.timeout,
            peer.handshake_timeout,
        ));
        rts.retry_cnt = Some(CONTROL_RETRY_CNT);
        rts.max_rd_atomic = Some(0);
        c.qp.modify(QpState::Rtr, &rtr)?;
        c.qp.modify(QpState::Rts, &rts)?;
        let scale = self.cq.cq.scale();
        if let Err(e) =
            c.qp.set_retransmit_probe(PROBE_FIRST * scale, PROBE_CAP * scale)
        {
            // Messages then wait for the ACK timer, as on a ConnectX: slower, not wrong.
            tracing::warn!(control_qpn = self.qpn, error = %e, "failover: control QP without a retransmit probe");
        }
        c.broken = false;
        Ok(())
    }

    /// Resends the channel's unacknowledged messages now, if it has any: the path may carry
    /// packets again (its link was reported up, or a message of the peer came over it).
    /// Nothing is delivered twice: the resend carries the same PSNs, which the peer's QP
    /// acknowledges again without executing (and a repeat that reached the ring would fail
    /// its sequence check). On a ConnectX this does nothing (the ACK timer resends).
    pub fn path_may_be_back(&self) {
        let c = self.lock();
        if c.unacked > 0 && !c.broken {
            self.resend_now(&c);
        }
    }

    /// Resends at once, for a channel of a device's first shared control CQ; the others
    /// leave it to their probe ([`PROBE_FIRST`]: hints reach every channel of a device at
    /// once, and a thousand resends in one go are the storm the scaling avoids).
    fn resend_now(&self, c: &Inner) {
        if self.cq.cq.scale() > 1 {
            return;
        }
        if let Err(e) = c.qp.retransmit_now() {
            tracing::debug!(control_qpn = self.qpn, error = %e, "failover: control resend not asked for");
        }
    }

    /// Takes the channel out of its epoch: the QP to RESET (what it had posted is gone, and
    /// completions still in its CQ are discarded unread: they belong to the old
    /// incarnation), message numbers back to 0 both ways, then INIT with the receives
    /// posted again. The channel sends nothing until [`ControlChannel::reconnect`].
    pub fn reset(&self) -> Result<(), ModifyError> {
        {
            // The shared CQ's lock first (`control_cq`'s lock order): a completion the
            // service polled before the reset is handed over before it, and the reset has the
            // QP's CQEs still in the ring dropped at the next poll.
            let _polling = self.cq.cq.polling();
            let mut c = self.lock();
            c.qp.modify(QpState::Reset, &QpAttr::default())?;
            c.next_send = 0;
            c.next_recv = 0;
            c.unacked = 0;
            // Nothing may be sent before the reconnection.
            c.broken = true;
        }
        self.init()
    }

    /// Connects the channel again, after [`ControlChannel::reset`], to the same peer in
    /// `epoch`, the incarnation of the side it belongs to (the backup side, or the default
    /// devices' channel): the peer's channel must have left every earlier one.
    pub fn reconnect(&self, epoch: SideEpoch) -> Result<(), ModifyError> {
        let mut c = self.lock();
        self.bring_up(&mut c, epoch)
    }

    /// Sends `message` to the peer.
    pub fn send(&self, message: ControlMessage) -> Result<(), ControlError> {
        let mut c = self.lock();
        let qpn = self.qpn;
        if c.broken {
            return Err(ControlError::Broken {
                qpn,
                reason: "an earlier control completion failed".into(),
            });
        }
        let mut bytes = [0u8; CONTROL_MESSAGE_LEN];
        if let Ok(mut packet) = ControlPacket::new_checked(&mut bytes[..]) {
            ControlRepr {
                dest_qpn: c.peer_default_qpn,
                message,
            }
            .emit(&mut packet);
        }
        let Some((addr, rkey)) = c.peer_ring else {
            return Err(ControlError::Broken {
                qpn,
                reason: "not connected to the peer's control ring".into(),
            });
        };
        let number = c.next_send;
        let slot = u64::from(number % (2 * c.depth));
        let op = SendOp::WriteImm {
            remote: Remote {
                addr: addr + slot * CONTROL_MESSAGE_LEN as u64,
                rkey,
            },
            imm: number,
        };
        let wr = SendWr::inline(SEND_WR_ID, op, &bytes).signaled();
        c.qp.post_send(&wr).map_err(|e| ControlError::Broken {
            qpn,
            reason: e.to_string(),
        })?;
        c.next_send = number.wrapping_add(1);
        c.unacked += 1;
        c.qp.ring_doorbell();
        Ok(())
    }

    /// Takes one completion of the channel's QP (the shared CQ's poll hands it over): a
    /// message for us becomes [`Event::Control`], a failed completion one
    /// [`Event::ControlFailed`] (the channel is then dead).
    pub fn take(&self, wc: &WorkCompletion, out: &mut Vec<Event>) {
        let mut guard = self.lock();
        let c = &mut *guard;
        if !wc.is_ok() {
            if !c.broken {
                tracing::warn!(control_qpn = self.qpn, path = ?self.path, status = ?wc.status, "failover: control QP failed");
                c.broken = true;
                out.push(Event::ControlFailed { via: self.path });
            }
            return;
        }
        if wc.wr_id == SEND_WR_ID {
            // Acknowledged by the peer's QP.
            c.unacked = c.unacked.saturating_sub(1);
            return;
        }
        if c.unacked > 0 {
            // The peer's message came over the path ours are stuck on: it carries packets.
            self.resend_now(c);
        }
        let (Some(number), WcOpcode::RecvRdmaWithImm) = (wc.imm, wc.opcode) else {
            // A SEND from a peer that does not write: nothing to read.
            tracing::warn!(control_qpn = self.qpn, opcode = ?wc.opcode, "failover: control message without a ring slot dropped");
            Self::drop_unread(c, self.qpn);
            return;
        };
        if wc.byte_len != CONTROL_MESSAGE_LEN as u32 {
            // Every message is one whole slot; a shorter or longer write is not ours (and a
            // longer one already hit the next slot: only its own slot is read).
            tracing::warn!(
                control_qpn = self.qpn,
                number,
                bytes = wc.byte_len,
                "failover: control message that is not one whole slot dropped"
            );
            Self::drop_unread(c, self.qpn);
            return;
        }
        if number != c.next_recv {
            // RC delivers in order: a gap or a repeat means a peer that does not follow the
            // format, or a forged packet; the slot it names is not read.
            tracing::warn!(
                control_qpn = self.qpn,
                number,
                expected = c.next_recv,
                "failover: control message out of sequence dropped"
            );
            Self::drop_unread(c, self.qpn);
            return;
        }
        c.next_recv = number.wrapping_add(1);
        let slot = (number % (2 * c.depth)) as usize;
        let mut bytes = [0u8; CONTROL_MESSAGE_LEN];
        c.ring.read(slot * CONTROL_MESSAGE_LEN, &mut bytes);
        match ControlPacket::new_checked(&bytes[..]).and_then(|p| ControlRepr::parse(&p)) {
            Ok(repr) if repr.dest_qpn == c.local_default_qpn => {
                tracing::debug!(dest_qpn = repr.dest_qpn, message = ?repr.message, "failover: control message received");
                out.push(Event::Control(repr.message))
            }
            Ok(repr) => tracing::warn!(
                control_qpn = self.qpn,
                dest_qpn = repr.dest_qpn,
                "failover: control message for another QP dropped"
            ),
            Err(e) => {
                tracing::warn!(control_qpn = self.qpn, error = %e, "failover: malformed control message dropped")
            }
        }
        // Only now may the peer's message `number + 2 x depth` reuse the slot.
        Self::repost(c, self.qpn);
    }

    /// Polls the channel's shared CQ; what it brings for this channel goes to `out`, what it
    /// brings for another channel to that channel's owner. Returns whether anything was
    /// polled. (The service polls the shared CQs themselves.)
    #[cfg(all(test, feature = "soft"))]
    pub fn poll(&self, out: &mut Vec<Event>) -> bool {
        let mut scratch = Vec::new();
        self.cq.cq.poll(&mut scratch, |channel, events| {
            if std::ptr::eq(channel, self) {
                out.append(events);
            } else if let Some(owner) = channel.owner() {
                for e in events.drain(..) {
                    owner.post_event(e);
                }
            }
        })
    }

    /// A message not taken: counted, and its receive WQE posted again.
    fn drop_unread(c: &mut Inner, qpn: u32) {
        c.dropped += 1;
        Self::repost(c, qpn);
    }

    fn repost(c: &mut Inner, qpn: u32) {
        if let Err(e) = c.qp.post_recv(&RecvWr::new(RECV_WR_ID, &[])) {
            tracing::warn!(control_qpn = qpn, error = %e, "failover: control receive not reposted");
        }
    }
}

// They run two control channels over softnic's in-memory fabric.
#[cfg(all(test, feature = "soft"))]
mod tests {
    use super::*;
    use crate::failover::Epoch;
    use crate::provider::soft::{register_fabric, unregister_fabric};
    use crate::provider::ProgressModel;
    use crate::{Context, ContextConfig};

    struct End {
        ctx: Arc<Context>,
        /// The backup PD the channel was created beside (the application's memory).
        backup_pd: Arc<Pd>,
        /// The shared control CQs of the end's device.
        cqs: ChannelCqs,
        channel: Arc<ControlChannel>,
    }

    /// Two control channels on two softnic devices of one fabric, connected; default QPNs
    /// 0x11 (a) and 0x22 (b).
    fn pair(fabric: &str) -> (End, End) {
        let (a, b, _) = pair_on_fabric(fabric);
        (a, b)
    }

    /// [`pair`], with the fabric (port 0 is a's, port 1 b's).
    fn pair_on_fabric(fabric: &str) -> (End, End, softnic::Fabric) {
        let f = softnic::Fabric::new(7, std::time::Duration::ZERO);
        f.add_port("198.18.1.1".parse().unwrap());
        f.add_port("198.18.1.2".parse().unwrap());
        register_fabric(fabric, &f);
        let config = ContextConfig {
            progress: ProgressModel::Manual,
            ..ContextConfig::default()
        };
        let end = |port: u32, default_qpn: u32| {
            let ctx = Context::open(&format!("fabric:{fabric}/{port}"), &config).unwrap();
            let backup_pd = ctx.alloc_pd().unwrap();
            let cqs = ChannelCqs::default();
            let channel = ControlChannel::create(&backup_pd, 4, default_qpn, &cqs).unwrap();
            channel.init().unwrap();
            End {
                ctx,
                backup_pd,
                cqs,
                channel,
            }
        };
        let (a, b) = (end(0, 0x11), end(1, 0x22));
        let rtr = QpAttr::rtr(
            AddressVector::to_gid(Gid::default()),
            0,
            0,
            crate::verbs::Mtu::Mtu1024,
        );
        let rts = QpAttr::rts(0);
        for (me, peer, peer_default) in [(&a, &b, 0x22), (&b, &a, 0x11)] {
            me.channel
                .connect(
                    peer.ctx.query_gid(0).unwrap(),
                    peer.channel.qpn(),
                    peer.channel.send_psn(),
                    peer_default,
                    peer.channel.ring(),
                    &rtr,
                    &rts,
                    std::time::Duration::from_secs(2),
                )
                .unwrap();
        }
        (a, b, f)
    }

    /// Runs both devices and polls both channels (as the service does: the sender's
    /// completions free its send queue) until `receiver` got `n` messages, then a little more
    /// for the acknowledgments; returns what it got. Real time must pass for the fabric's
    /// ports, so each round sleeps briefly.
    fn deliver(a: &End, b: &End, receiver: &End, n: usize) -> Vec<Event> {
        let mut events = [Vec::new(), Vec::new()];
        let got = |events: &[Vec<Event>; 2]| events[usize::from(!std::ptr::eq(receiver, a))].len();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut after = 0;
        while after < 20 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(100));
            a.ctx.progress();
            b.ctx.progress();
            a.channel.poll(&mut events[0]);
            b.channel.poll(&mut events[1]);
            if got(&events) >= n {
                after += 1;
            }
        }
        let [to_a, to_b] = events;
        if std::ptr::eq(receiver, a) {
            assert_eq!(to_b, []);
            to_a
        } else {
            assert_eq!(to_a, []);
            to_b
        }
    }

    /// Whether `fd` is readable now (`poll(2)` without waiting).
    fn readable(fd: std::os::fd::RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn a_sleeping_service_rearms_a_channel_only_once_its_descriptor_signalled() {
        let name = format!("control-rearm-{}", std::process::id());
        let (a, b) = pair(&name);
        let cq = b.channel.control_cq().clone();
        let fd = cq.event_fd().expect("control CQs have completion events");
        // Never armed: it must be, whatever poll(2) found.
        assert!(cq.needs_rearm(&[]));
        cq.arm();
        // Armed, its descriptor quiet: the round leaves it alone (no system call).
        assert!(!cq.needs_rearm(&[]));
        assert!(!cq.needs_rearm(&[fd + 1]));
        // A message's completion signals the armed channel: the round must take it.
        a.channel
            .send(ControlMessage::Rearm { epoch: Epoch(3) })
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !readable(fd) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(100));
            a.ctx.progress();
            b.ctx.progress();
        }
        assert!(
            readable(fd),
            "the armed control CQ did not signal its descriptor"
        );
        assert!(cq.needs_rearm(&[fd - 1, fd]));
        cq.clear_event();
        let mut events = Vec::new();
        b.channel.poll(&mut events);
        cq.arm();
        assert_eq!(
            events,
            [Event::Control(ControlMessage::Rearm { epoch: Epoch(3) })]
        );
        assert!(!cq.needs_rearm(&[]));
        unregister_fabric(&name);
    }

    #[test]
    fn channels_of_one_device_share_a_cq_and_each_gets_its_own_messages() {
        let name = format!("control-shared-{}", std::process::id());
        let (a, b) = pair(&name);
        // A second pair of channels on the same two devices, from the same CQ pools.
        let a2 = ControlChannel::create(&a.backup_pd, 4, 0x33, &a.cqs).unwrap();
        let b2 = ControlChannel::create(&b.backup_pd, 4, 0x44, &b.cqs).unwrap();
        assert!(Arc::ptr_eq(a.channel.control_cq(), a2.control_cq()));
        assert!(Arc::ptr_eq(b.channel.control_cq(), b2.control_cq()));
        let rtr = QpAttr::rtr(
            AddressVector::to_gid(Gid::default()),
            0,
            0,
            crate::verbs::Mtu::Mtu1024,
        );
        let rts = QpAttr::rts(0);
        for (me, peer, peer_ctx, peer_default) in
            [(&a2, &b2, &b.ctx, 0x44), (&b2, &a2, &a.ctx, 0x33)]
        {
            me.init().unwrap();
            me.connect(
                peer_ctx.query_gid(0).unwrap(),
                peer.qpn(),
                peer.send_psn(),
                peer_default,
                peer.ring(),
                &rtr,
                &rts,
                std::time::Duration::from_secs(2),
            )
            .unwrap();
        }
        a.channel
            .send(ControlMessage::PathUp { epoch: Epoch(1) })
            .unwrap();
        a2.send(ControlMessage::PathUp { epoch: Epoch(2) }).unwrap();
        a2.send(ControlMessage::PathUp { epoch: Epoch(3) }).unwrap();
        // One poll of b's shared CQ hands each message to its own channel.
        let mut got: Vec<(u32, Event)> = Vec::new();
        let mut scratch = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(100));
            a.ctx.progress();
            b.ctx.progress();
            a.channel.control_cq().poll(&mut scratch, |_, _| {});
            b.channel
                .control_cq()
                .poll(&mut scratch, |channel, events| {
                    got.extend(events.drain(..).map(|e| (channel.qpn(), e)));
                });
        }
        let message = |epoch| {
            Event::Control(ControlMessage::PathUp {
                epoch: Epoch(epoch),
            })
        };
        let mut for_b: Vec<_> = got.iter().filter(|(q, _)| *q == b.channel.qpn()).collect();
        let for_b2: Vec<_> = got.iter().filter(|(q, _)| *q == b2.qpn()).collect();
        for_b.sort_by_key(|(q, _)| *q);
        assert_eq!(for_b, [&(b.channel.qpn(), message(1))], "{got:?}");
        assert_eq!(
            for_b2,
            [&(b2.qpn(), message(2)), &(b2.qpn(), message(3))],
            "{got:?}"
        );
        unregister_fabric(&name);
    }

    #[test]
    fn the_control_qps_retries_outlast_the_handshake_timeout() {
        let two = std::time::Duration::from_secs(2);
        // 4.096 us x 2^16 = 268 ms, 8 tries: 2.1 s.
        assert_eq!(control_ack_timeout(Some(12), two), 16);
        assert_eq!(control_ack_timeout(None, two), 16);
        assert_eq!(
            control_ack_timeout(Some(14), std::time::Duration::from_millis(500)),
            14
        );
        assert_eq!(control_ack_timeout(Some(20), two), 20);
        // No timeout at all stays none.
        assert_eq!(control_ack_timeout(Some(0), two), 0);
        assert_eq!(control_ack_timeout(Some(40), two), 31);
    }

    #[test]
    fn messages_are_written_into_the_peers_ring_and_arrive_in_order_across_its_wrap() {
        let name = format!("control-{}", std::process::id());
        let (a, b) = pair(&name);
        // Depth 4: eight slots; twenty messages wrap the ring twice.
        let sent: Vec<ControlMessage> = (0..20)
            .map(|e| ControlMessage::Rearm { epoch: Epoch(e) })
            .collect();
        let mut got = Vec::new();
        for chunk in sent.chunks(3) {
            for m in chunk {
                a.channel.send(*m).unwrap();
            }
            got.extend(deliver(&a, &b, &b, chunk.len()));
        }
        let want: Vec<Event> = sent.iter().map(|m| Event::Control(*m)).collect();
        assert_eq!(got, want);
        // The last message (number 19) sits in slot 19 mod 8 of b's ring, as the peer wrote it.
        let mut bytes = [0u8; CONTROL_MESSAGE_LEN];
        b.channel
            .lock()
            .ring
            .read(3 * CONTROL_MESSAGE_LEN, &mut bytes);
        let repr = ControlRepr::parse(&ControlPacket::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.dest_qpn, 0x22);
        assert_eq!(repr.message, ControlMessage::Rearm { epoch: Epoch(19) });
        // And the other way.
        b.channel
            .send(ControlMessage::PathUp { epoch: Epoch(1) })
            .unwrap();
        assert_eq!(
            deliver(&a, &b, &a, 1),
            [Event::Control(ControlMessage::PathUp { epoch: Epoch(1) })]
        );
        drop((a, b));
        unregister_fabric(&name);
    }

    /// Runs both devices and polls both channels for a while; returns what each got.
    fn settle(a: &End, b: &End) -> [Vec<Event>; 2] {
        let mut events = [Vec::new(), Vec::new()];
        for _ in 0..200 {
            std::thread::sleep(std::time::Duration::from_micros(100));
            a.ctx.progress();
            b.ctx.progress();
            a.channel.poll(&mut events[0]);
            b.channel.poll(&mut events[1]);
        }
        events
    }

    /// A well-formed control message for default QPN `dest_qpn`.
    fn message_bytes(dest_qpn: u32, message: ControlMessage) -> [u8; CONTROL_MESSAGE_LEN] {
        let mut bytes = [0u8; CONTROL_MESSAGE_LEN];
        let mut packet = ControlPacket::new_checked(&mut bytes[..]).unwrap();
        ControlRepr { dest_qpn, message }.emit(&mut packet);
        bytes
    }

    /// Posts a raw WRITE_WITH_IMM of `bytes` from `from`'s control QP into slot `slot` of
    /// `to`'s ring, with immediate `imm`: what a buggy or hostile peer could send.
    fn raw_write(from: &End, to: &End, slot: u64, bytes: &[u8], imm: u32) {
        let (addr, rkey) = to.channel.ring();
        let op = SendOp::WriteImm {
            remote: Remote {
                addr: addr + slot * CONTROL_MESSAGE_LEN as u64,
                rkey,
            },
            imm,
        };
        let mut c = from.channel.lock();
        c.qp.post_send(&SendWr::inline(SEND_WR_ID, op, bytes).signaled())
            .unwrap();
        c.qp.ring_doorbell();
    }

    #[test]
    fn each_channel_sends_from_a_random_psn_its_peer_expects() {
        let name = format!("control-psn-{}", std::process::id());
        let (a, b) = pair(&name);
        // Control QPNs repeat from run to run; PSNs must not. Eight draws of 24 bits that
        // were all the same would be a fixed PSN (the odds of a false alarm: 2^-168).
        let psns: std::collections::BTreeSet<u32> = (0..8)
            .map(|_| {
                ControlChannel::create(&a.backup_pd, 4, 0x33, &a.cqs)
                    .unwrap()
                    .send_psn()
            })
            .collect();
        assert!(psns.len() > 1, "{psns:?}");
        assert!(psns.iter().all(|p| *p <= 0x00ff_ffff));
        // And the pair, connected with each other's PSN, talks both ways.
        a.channel
            .send(ControlMessage::PathUp { epoch: Epoch(3) })
            .unwrap();
        assert_eq!(
            deliver(&a, &b, &b, 1),
            [Event::Control(ControlMessage::PathUp { epoch: Epoch(3) })]
        );
        b.channel
            .send(ControlMessage::PathUp { epoch: Epoch(4) })
            .unwrap();
        assert_eq!(
            deliver(&a, &b, &a, 1),
            [Event::Control(ControlMessage::PathUp { epoch: Epoch(4) })]
        );
    }

    #[test]
    fn the_control_qp_reaches_only_its_ring_not_the_backup_memory() {
        let name = format!("control-pd-{}", std::process::id());
        let (a, b) = pair(&name);
        // Application memory on a's backup device, open to remote writes through a QP of
        // the backup PD.
        let memory = a
            .backup_pd
            .alloc_buffer(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let target = memory.remote(0);
        let op = SendOp::WriteImm {
            remote: target,
            imm: 0,
        };
        {
            let mut c = b.channel.lock();
            c.qp.post_send(&SendWr::inline(SEND_WR_ID, op, &[0xee; 32]).signaled())
                .unwrap();
            c.qp.ring_doorbell();
        }
        let [to_a, to_b] = settle(&a, &b);
        // Refused at a with a remote access error, which ends both ends of the channel (an
        // RC responder's QP goes to ERR on it: the connection is left unprotected, closed
        // rather than open), and the memory is untouched.
        assert_eq!(to_b, [Event::ControlFailed { via: Path::Backup }]);
        assert_eq!(to_a, [Event::ControlFailed { via: Path::Backup }]);
        let mut bytes = [0u8; 32];
        memory.read(0, &mut bytes);
        assert_eq!(bytes, [0u8; 32]);
    }

    #[test]
    fn messages_out_of_sequence_or_not_one_whole_slot_are_dropped_and_counted() {
        let name = format!("control-seq-{}", std::process::id());
        let (a, b) = pair(&name);
        // A well-formed message numbered 5 where 0 is expected (accepted after a warning
        // before); then number 0, but only the first 16 bytes of a message.
        let forged = message_bytes(0x11, ControlMessage::PathUp { epoch: Epoch(99) });
        raw_write(&b, &a, 5, &forged, 5);
        raw_write(&b, &a, 0, &forged[..16], 0);
        let [to_a, to_b] = settle(&a, &b);
        assert_eq!(to_a, []);
        assert_eq!(to_b, []);
        assert_eq!(a.channel.dropped(), 2);
        // The channel is still in step: b's next real message (its number 0) arrives.
        b.channel
            .send(ControlMessage::PathUp { epoch: Epoch(7) })
            .unwrap();
        assert_eq!(
            deliver(&a, &b, &a, 1),
            [Event::Control(ControlMessage::PathUp { epoch: Epoch(7) })]
        );
        assert_eq!(a.channel.dropped(), 2);
    }

    #[test]
    fn a_message_whose_acks_are_lost_is_probed_again_and_delivered_once() {
        let name = format!("control-probe-{}", std::process::id());
        let (a, b, fabric) = pair_on_fabric(&name);
        // b's acknowledgments are lost for 200 ms, less than the control QP's 268 ms ACK
        // timer: a's control QP resends the message on its probe (at 2, 6, 14, 30, 46, ...
        // ms), and b's QP takes each resend for the duplicate it is.
        let now = fabric.clock().now();
        fabric.add_rule(softnic::FaultRule {
            fault: softnic::Fault::Partition,
            from: Some(1),
            to: Some(0),
            start: now,
            end: Some(now + Duration::from_millis(200)),
        });
        a.channel
            .send(ControlMessage::PathUp { epoch: Epoch(9) })
            .unwrap();
        let mut events = [Vec::new(), Vec::new()];
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while (a.channel.lock().unacked > 0 || events[1].is_empty())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_micros(100));
            a.ctx.progress();
            b.ctx.progress();
            a.channel.poll(&mut events[0]);
            b.channel.poll(&mut events[1]);
        }
        assert_eq!(a.channel.lock().unacked, 0, "never acknowledged");
        let [to_a, to_b] = settle(&a, &b);
        events[0].extend(to_a);
        events[1].extend(to_b);
        assert_eq!(events[0], []);
        assert_eq!(
            events[1],
            [Event::Control(ControlMessage::PathUp { epoch: Epoch(9) })]
        );
        assert_eq!(b.channel.dropped(), 0);
        // The first ACK was lost, and the ACKs of the resends in the window: without the
        // probe only the first, the ACK timer's resend coming after the window.
        assert!(fabric.stats().blackholed >= 2, "{:?}", fabric.stats());
        unregister_fabric(&name);
    }

    #[test]
    fn channels_past_a_devices_first_sixteen_probe_at_their_cqs_scale() {
        let name = format!("control-scale-{}", std::process::id());
        let (a, _b) = pair(&name);
        // a's first channel is in the device's first CQ (16 channels); fifteen more fill it,
        // and the next goes to a CQ of 32, whose channels wait twice as long.
        assert_eq!(a.channel.control_cq().scale(), 1);
        let more: Vec<_> = (0..16)
            .map(|k| ControlChannel::create(&a.backup_pd, 4, 0x100 + k, &a.cqs).unwrap())
            .collect();
        let scales: Vec<u32> = more.iter().map(|c| c.control_cq().scale()).collect();
        assert_eq!(scales[..15], [1; 15]);
        assert_eq!(scales[15], 2);
        unregister_fabric(&name);
    }
}
