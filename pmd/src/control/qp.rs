//! RC queue pairs: creation, state transitions through the table, saved bring-up attributes,
//! and the datapath entry points.

use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use crate::datapath::cq::Attachment;
use crate::datapath::gate::QpGate;
use crate::datapath::rq::{RecvQueue, RecvQueueParts};
use crate::datapath::sq::FastRequest;
use crate::datapath::sq::{DoorbellError, SendQueue, SendQueueParts};
use crate::datapath::track::{RecvTrack, SendTrack};
use crate::datapath::wr::{BatchPostError, PostError, RecvWr, SendOp, SendWr, Sge};
use crate::provider::{Handle, QpRequest, RawQp, VerbsError};
use crate::qp_state::{check_transition, check_transition_of, QpState, TransitionError};
use crate::verbs::{QpAttr, QpCaps, QpType, UdAddress};

use super::cq::CqShared;
use super::srq::SrqShared;
use super::{Cq, Pd, Srq};

/// The largest WQE is 63 units of 16 bytes; an atomic header takes 3 of them, a UD SEND's
/// control and datagram segments 4.
const MAX_DATA_UNITS: u32 = 63 - 3;
const MAX_UD_DATA_UNITS: u32 = 63 - 4;

/// Why a QP state change failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModifyError {
    /// The transition table refused it before the device saw it.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// The device refused it.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// A move to RESET asked of a [`QpHandle`]: the rings go back to index 0, which only the
    /// owner of the [`Qp`] may do.
    #[error("QP {qpn:#x}: a move to RESET needs the Qp itself (its rings reset), not a handle")]
    ResetNeedsQp {
        /// The QP.
        qpn: u32,
    },
    /// `bring_up_again` needs attributes of a transition the QP never went through.
    #[error(
        "QP {qpn:#x} has no saved attributes for the transition to {state}: bring it up once first"
    )]
    NotSaved {
        /// The QP.
        qpn: u32,
        /// The transition whose attributes are missing.
        state: QpState,
    },
}

/// The attributes a QP was brought up with, kept so it can be brought up again after a reset
/// without the application (what the failover layer does after moving traffic away).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedAttrs {
    /// RESET -> INIT (merged with later INIT -> INIT changes).
    pub init: Option<QpAttr>,
    /// INIT -> RTR.
    pub rtr: Option<QpAttr>,
    /// RTR -> RTS (merged with later RTS -> RTS changes).
    pub rts: Option<QpAttr>,
}

impl SavedAttrs {
    /// Records a transition the QP went through so that bringing it up again gives it the
    /// attributes it has now: a bring-up transition's attributes are kept, an INIT -> INIT
    /// or RTS -> RTS change is merged in, and remote access flags given on any transition
    /// replace those of every recorded one (INIT needs them; RTR and RTS take them), so a
    /// QP brought up again never holds, even between INIT and RTS, access that was cut.
    pub fn record(&mut self, from: QpState, to: QpState, attr: &QpAttr) {
        match (from, to) {
            (QpState::Reset, QpState::Init) => self.init = Some(attr.clone()),
            (QpState::Init, QpState::Init) => merge(&mut self.init, attr),
            (QpState::Init, QpState::Rtr) => self.rtr = Some(attr.clone()),
            (QpState::Rtr, QpState::Rts) => self.rts = Some(attr.clone()),
            (QpState::Rts, QpState::Rts) => merge(&mut self.rts, attr),
            _ => return,
        }
        if let Some(access) = attr.access {
            for saved in [&mut self.init, &mut self.rtr, &mut self.rts]
                .into_iter()
                .flatten()
            {
                saved.access = Some(access);
            }
        }
    }

    /// The remote access the QP was last given (what a bring-up again grants).
    pub fn access(&self) -> Option<crate::verbs::Access> {
        [&self.rts, &self.rtr, &self.init]
            .into_iter()
            .flatten()
            .find_map(|a| a.access)
    }
}

fn merge(into: &mut Option<QpAttr>, attr: &QpAttr) {
    let target = into.get_or_insert_with(QpAttr::default);
    macro_rules! take {
        ($($f:ident),*) => { $( if attr.$f.is_some() { target.$f = attr.$f; } )* };
    }
    take!(
        access,
        pkey_index,
        port,
        av,
        path_mtu,
        dest_qpn,
        rq_psn,
        max_dest_rd_atomic,
        min_rnr_timer,
        sq_psn,
        timeout,
        retry_cnt,
        rnr_retry,
        max_rd_atomic,
        qkey
    );
}

/// The control half of a QP: parents, attributes, state. Shared with [`QpHandle`]s; destroys
/// the QP when the last holder goes.
pub(crate) struct QpControl {
    pd: Arc<Pd>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    handle: Handle,
    qpn: u32,
    caps: QpCaps,
    /// RC or UD: which transition table its moves go through.
    qp_type: QpType,
    /// The QP's state, in the gate its queues' posts read.
    gate: Arc<QpGate>,
    saved: Mutex<SavedAttrs>,
    /// The SRQ it takes its receives from: held so that the SRQ outlives the QP.
    srq: Option<Arc<SrqShared>>,
}

impl QpControl {
    fn state(&self) -> QpState {
        QpState::from_ibv(self.gate.state()).unwrap_or(QpState::Err)
    }

    /// Checks, applies and records one transition. Serialised by the `saved` lock, so two
    /// threads cannot interleave transitions of one QP.
    fn modify(&self, to: QpState, attr: &QpAttr) -> Result<(), ModifyError> {
        let mut saved = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        let from = self.state();
        check_transition_of(self.qp_type, from, to, attr.mask())?;
        self.pd
            .context()
            .provider()
            .modify_qp(self.handle, to, attr)?;
        self.gate.set_state(to);
        saved.record(from, to, attr);
        tracing::debug!(device = %self.pd.context().name(), qpn = self.qpn, %from, %to, "QP state change");
        Ok(())
    }
}

impl QpControl {
    /// The QP no longer produces CQEs (the device reset or destroyed it): have its CQs drop
    /// the ones still in their rings, as libmlx5 does for the CQs it polls itself. Otherwise a
    /// stale CQE would complete a WQE posted after a reset at the same index.
    fn clean_cqs(&self) {
        self.send_cq.clean(self.qpn);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.clean(self.qpn);
        }
    }
}

impl Drop for QpControl {
    fn drop(&mut self) {
        self.send_cq.attachments.detach(self.qpn);
        self.recv_cq.attachments.detach(self.qpn);
        let ctx = self.pd.context();
        let destroyed = ctx.provider().destroy_qp(self.handle);
        if destroyed.is_ok() {
            // The device may give the QPN to a new QP of these CQs; none of ours may be left.
            self.clean_cqs();
        }
        ctx.released("destroy_qp", destroyed);
    }
}

/// A thread-safe handle to a QP's control half, for work that must not wait for the lcore
/// that owns the datapath (the service lcore moving a QP to ERR on link-down).
#[derive(Clone)]
pub struct QpHandle {
    ctl: Arc<QpControl>,
}

impl std::fmt::Debug for QpHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpHandle")
            .field("qpn", &self.ctl.qpn)
            .field("state", &self.ctl.state())
            .finish()
    }
}

impl QpHandle {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.ctl.qpn
    }

    /// The state the driver last moved the QP to.
    pub fn state(&self) -> QpState {
        self.ctl.state()
    }

    /// The state the device reports (it may have moved to ERR on its own).
    pub fn query_device_state(&self) -> Result<QpState, VerbsError> {
        self.ctl.pd.context().provider().query_qp(self.ctl.handle)
    }

    /// Moves the QP to ERR now: the device flushes its outstanding work with WR_FLUSH_ERR and
    /// new sends are refused at post time.
    pub fn set_error(&self) -> Result<(), ModifyError> {
        self.ctl.modify(QpState::Err, &QpAttr::default())
    }

    /// Moves every QP of `handles` to ERR now, as [`QpHandle::set_error`] does, one result per
    /// QP in order in `out`: the QPs of one device in one call to the device (softnic takes
    /// its lock once, not once per QP against an engine that holds it for whole rounds).
    /// What the link watch does to every default QP of a device that went down. QPs of
    /// different devices are moved one at a time.
    pub fn set_error_all(handles: &[&QpHandle], out: &mut Vec<Result<(), ModifyError>>) {
        out.clear();
        let Some(first) = handles.first() else {
            return;
        };
        let ctx = first.ctl.pd.context();
        if handles
            .iter()
            .any(|h| !Arc::ptr_eq(h.ctl.pd.context(), ctx))
        {
            out.extend(handles.iter().map(|h| h.set_error()));
            return;
        }
        let attr = QpAttr::default();
        // Each QP's `saved` lock is held from its check to its record, as `modify` does, so
        // no transition of the owner's can come between.
        let mut checked = Vec::with_capacity(handles.len());
        let mut raw = Vec::with_capacity(handles.len());
        for (i, h) in handles.iter().enumerate() {
            let saved = h.ctl.saved.lock().unwrap_or_else(|p| p.into_inner());
            let from = h.ctl.state();
            match check_transition(from, QpState::Err, attr.mask()) {
                Ok(()) => {
                    out.push(Ok(()));
                    raw.push(h.ctl.handle);
                    checked.push((i, from, saved));
                }
                Err(e) => out.push(Err(e.into())),
            }
        }
        let mut done = Vec::with_capacity(raw.len());
        ctx.provider().set_qps_error(&raw, &mut done);
        for ((i, from, mut saved), result) in checked.into_iter().zip(done) {
            match result {
                Ok(()) => {
                    handles[i].ctl.gate.set_state(QpState::Err);
                    saved.record(from, QpState::Err, &attr);
                }
                Err(e) => out[i] = Err(e.into()),
            }
        }
    }

    /// Moves the QP to `to` with `attr`, through the transition table, from any thread: what
    /// the service lcore uses to bring up a QP whose datapath belongs to another lcore. A
    /// move to RESET is refused ([`ModifyError::ResetNeedsQp`]): it resets ring indices that
    /// live in the [`Qp`].
    pub fn modify(&self, to: QpState, attr: &QpAttr) -> Result<(), ModifyError> {
        if to == QpState::Reset {
            return Err(ModifyError::ResetNeedsQp { qpn: self.ctl.qpn });
        }
        self.ctl.modify(to, attr)
    }
}

/// An RC queue pair: its send and receive queues (hot) and its control half.
pub struct Qp {
    sq: SendQueue,
    rq: RecvQueue,
    ctl: Arc<QpControl>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("device", &self.ctl.pd.context().name())
            .field("qpn", &self.ctl.qpn)
            .field("state", &self.ctl.state())
            .finish_non_exhaustive()
    }
}

fn invalid(pd: &Pd, verb: &'static str, what: String) -> VerbsError {
    VerbsError::InvalidArgument {
        device: pd.context().name().to_string(),
        verb,
        what,
    }
}

impl Qp {
    pub(crate) fn create(
        pd: &Arc<Pd>,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        srq: Option<&Srq>,
        qp_type: QpType,
    ) -> Result<Qp, VerbsError> {
        let ctx = pd.context();
        if qp_type == QpType::Ud && (srq.is_some() || !ctx.provider().supports_ud()) {
            return Err(VerbsError::Unsupported {
                device: ctx.name().to_string(),
                verb: "create_qp",
                what: if srq.is_some() {
                    "a UD QP on a shared receive queue".into()
                } else {
                    "UD QPs (this provider makes RC QPs only)".into()
                },
            });
        }
        if let Some(srq) = srq {
            if !Arc::ptr_eq(srq.pd(), pd) {
                return Err(invalid(
                    pd,
                    "create_qp",
                    "the SRQ belongs to another protection domain".into(),
                ));
            }
        }
        if !Arc::ptr_eq(send_cq.context(), ctx) || !Arc::ptr_eq(recv_cq.context(), ctx) {
            return Err(invalid(
                pd,
                "create_qp",
                "the CQs belong to another device".into(),
            ));
        }
        let inline_units = if caps.max_inline_data == 0 {
            0
        } else {
            hw_defs::mlx5::wqe::inline_ds(caps.max_inline_data as usize) as u32
        };
        let max_data_units = match qp_type {
            QpType::Rc => MAX_DATA_UNITS,
            QpType::Ud => MAX_UD_DATA_UNITS,
        };
        if caps.max_send_sge > max_data_units || inline_units > max_data_units {
            return Err(invalid(
                pd,
                "create_qp",
                format!(
                    "max_send_sge {} / max_inline_data {} do not fit a 63-unit WQE",
                    caps.max_send_sge, caps.max_inline_data
                ),
            ));
        }
        let req = QpRequest {
            pd: pd.handle(),
            send_cq: send_cq.shared().handle,
            recv_cq: recv_cq.shared().handle,
            caps,
            qp_type,
        };
        let raw = match srq {
            Some(srq) => ctx.provider().create_qp_on_srq(&req, srq.handle())?,
            None => ctx.provider().create_qp(&req)?,
        };
        let RawQp {
            handle,
            qpn,
            sq,
            rq,
            dbrec,
            doorbell,
            caps: granted,
        } = raw;
        let gate = Arc::new(QpGate::new(QpState::Reset));
        ctx.keys().register_gate(&gate);
        let ctl = Arc::new(QpControl {
            pd: pd.clone(),
            send_cq: send_cq.shared().clone(),
            recv_cq: recv_cq.shared().clone(),
            handle,
            qpn,
            caps: granted,
            qp_type,
            gate: gate.clone(),
            saved: Mutex::new(SavedAttrs::default()),
            srq: srq.map(|s| s.shared().clone()),
        });
        // From here on `ctl`'s drop destroys the QP if anything below refuses the rings.
        if !sq.wqe_cnt.is_power_of_two() || sq.stride != 64 {
            return Err(invalid(
                pd,
                "create_qp",
                format!("send ring of {} x {} bytes", sq.wqe_cnt, sq.stride),
            ));
        }
        if !rq.wqe_cnt.is_power_of_two() || !rq.stride.is_power_of_two() || rq.stride < 16 {
            return Err(invalid(
                pd,
                "create_qp",
                format!("receive ring of {} x {} bytes", rq.wqe_cnt, rq.stride),
            ));
        }
        let send_track = Arc::new(SendTrack::new(sq.wqe_cnt));
        let recv_track = Arc::new(RecvTrack::new(rq.wqe_cnt));
        let ud = qp_type == QpType::Ud;
        send_cq.shared().attachments.attach(Attachment {
            qpn,
            send: Some(send_track.clone()),
            recv: None,
            srq: None,
            ud,
        });
        recv_cq.shared().attachments.attach(match srq {
            Some(srq) => Attachment {
                qpn,
                send: None,
                recv: None,
                srq: Some(srq.shared().queue.clone()),
                ud,
            },
            None => Attachment {
                qpn,
                send: None,
                recv: Some(recv_track.clone()),
                srq: None,
                ud,
            },
        });
        let device = ctx.device_arc();
        let recv_dbrec = dbrec.cast::<AtomicU32>();
        // SAFETY: the doorbell record is two 32-bit words; the send counter is the second.
        let send_dbrec = unsafe {
            NonNull::new_unchecked(recv_dbrec.as_ptr().add(hw_defs::mlx5::dbrec::SND_DBR))
        };
        let sq = SendQueue::new(SendQueueParts {
            ring: sq.buf,
            bbs: sq.wqe_cnt,
            max_wr: granted.max_send_wr,
            qpn,
            pd: pd.id(),
            max_inline: granted
                .max_inline_data
                .min(caps.max_inline_data.max(granted.max_inline_data)),
            max_sge: granted.max_send_sge,
            dbrec: send_dbrec,
            doorbell,
            track: send_track,
            keys: ctx.keys().clone(),
            gate: gate.clone(),
            device: device.clone(),
            ud,
        });
        let rq = RecvQueue::new(RecvQueueParts {
            ring: rq.buf,
            slots: rq.wqe_cnt,
            stride: rq.stride,
            max_sge: granted.max_recv_sge,
            qpn,
            pd: pd.id(),
            dbrec: recv_dbrec,
            track: recv_track,
            keys: ctx.keys().clone(),
            gate,
            device,
        });
        Ok(Qp { sq, rq, ctl })
    }

    /// RC or UD.
    pub fn qp_type(&self) -> QpType {
        self.ctl.qp_type
    }

    /// Whether the QP takes its receives from a shared receive queue.
    pub fn on_srq(&self) -> bool {
        self.ctl.srq.is_some()
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.ctl.qpn
    }

    /// The capabilities the device granted.
    pub fn caps(&self) -> QpCaps {
        self.ctl.caps
    }

    /// The state the driver last moved the QP to.
    pub fn state(&self) -> QpState {
        self.ctl.state()
    }

    /// The PD.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.ctl.pd
    }

    /// A thread-safe handle to the control half.
    pub fn handle(&self) -> QpHandle {
        QpHandle {
            ctl: self.ctl.clone(),
        }
    }

    /// Moves the QP to `to` with `attr`, through the transition table. Moving to RESET
    /// returns both rings to index 0, and the QP's CQEs still in its CQs are dropped at their
    /// next poll (they are stale; poll them before the reset to see them).
    pub fn modify(&mut self, to: QpState, attr: &QpAttr) -> Result<(), ModifyError> {
        self.ctl.modify(to, attr)?;
        if to == QpState::Reset {
            self.sq.reset();
            self.rq.reset();
            self.ctl.clean_cqs();
        }
        Ok(())
    }

    /// The attributes the QP was brought up with.
    pub fn saved_attributes(&self) -> SavedAttrs {
        self.ctl
            .saved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Changes the saved attributes (new PSNs or a new peer QPN after the peer reset too).
    pub fn update_saved_attributes(&mut self, change: impl FnOnce(&mut SavedAttrs)) {
        change(&mut self.ctl.saved.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// RESET, then INIT, RTR and RTS again with the saved attributes: a QP that failed (or was
    /// moved away from) works again without the application.
    pub fn bring_up_again(&mut self) -> Result<(), ModifyError> {
        let saved = self.saved_attributes();
        let qpn = self.qpn();
        let init = saved.init.ok_or(ModifyError::NotSaved {
            qpn,
            state: QpState::Init,
        })?;
        let rtr = saved.rtr.ok_or(ModifyError::NotSaved {
            qpn,
            state: QpState::Rtr,
        })?;
        let rts = saved.rts.ok_or(ModifyError::NotSaved {
            qpn,
            state: QpState::Rts,
        })?;
        self.modify(QpState::Reset, &QpAttr::default())?;
        self.modify(QpState::Init, &init)?;
        self.modify(QpState::Rtr, &rtr)?;
        self.modify(QpState::Rts, &rts)
    }

    /// Validates `wr` and writes its WQE; returns its WQE index. Nothing reaches the device
    /// until [`Qp::ring_doorbell`].
    #[inline]
    pub fn post_send(&mut self, wr: &SendWr<'_>) -> Result<u16, PostError> {
        self.sq.post(wr)
    }

    /// Validates a UD SEND (`SendOp::Send` or `SendOp::SendImm`) to `dest` and writes its
    /// WQE, with the datagram segment; returns its WQE index. Only on a UD QP: an RC QP refuses
    /// it, and a UD QP refuses [`Qp::post_send`] (a UD SEND needs its destination).
    pub fn post_send_ud(&mut self, wr: &SendWr<'_>, dest: &UdAddress) -> Result<u16, PostError> {
        self.sq.post_ud(wr, dest)
    }

    /// The fast path alone for a one-entry WRITE, WRITE with immediate, SEND or SEND with
    /// immediate given by its parts; `None` (nothing written) sends the caller to
    /// [`Qp::post_send`] with the whole request, which checks everything
    /// (`SendQueue::post_fast_parts`).
    #[inline(always)]
    pub fn post_send_fast_parts(
        &mut self,
        wr: &impl FastRequest,
        op: SendOp,
        sge: &Sge,
    ) -> Option<u16> {
        self.sq.post_fast_parts(wr, op, sge)
    }

    /// Posts `wrs` in order as one batch (`ibv_post_send` with a list): runs of one-entry
    /// RDMA WRITEs take the burst path, which checks the QP once per run. Stops at the first
    /// refused work request; nothing is published until a doorbell.
    #[inline]
    pub fn post_send_batch(&mut self, wrs: &[SendWr<'_>]) -> Result<(), BatchPostError> {
        self.sq.post_batch(wrs)
    }

    /// Publishes every WQE written so far with one doorbell.
    #[inline]
    pub fn ring_doorbell(&mut self) {
        self.sq.ring_doorbell()
    }

    /// Asks the device to cover the next transmission with a short ACK timeout, once
    /// ([`crate::provider::Provider::arm_short_retransmit`]).
    pub fn arm_short_retransmit(&self, timeout: std::time::Duration) -> Result<(), VerbsError> {
        self.ctl
            .pd
            .context()
            .provider()
            .arm_short_retransmit(self.ctl.handle, timeout)
    }

    /// Gives the QP a retransmit probe from `first` doubling to `cap`
    /// ([`crate::provider::Provider::set_retransmit_probe`]).
    pub fn set_retransmit_probe(
        &self,
        first: std::time::Duration,
        cap: std::time::Duration,
    ) -> Result<(), VerbsError> {
        self.ctl
            .pd
            .context()
            .provider()
            .set_retransmit_probe(self.ctl.handle, first, cap)
    }

    /// Resends what the QP has unacknowledged now
    /// ([`crate::provider::Provider::retransmit_now`]).
    pub fn retransmit_now(&self) -> Result<(), VerbsError> {
        self.ctl
            .pd
            .context()
            .provider()
            .retransmit_now(self.ctl.handle)
    }

    /// Publishes the WQEs up to and including the one at `index`; later ones stay withheld.
    pub fn ring_doorbell_through(&mut self, index: u16) -> Result<(), DoorbellError> {
        self.sq.ring_doorbell_through(index)
    }

    /// Writes and publishes a receive.
    #[inline]
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        if self.ctl.srq.is_some() {
            return Err(PostError::OnSharedReceiveQueue { qpn: self.ctl.qpn });
        }
        self.rq.post(wr)
    }

    /// The send queue: counters, outstanding WQEs, raw WQE copy-in and copy-out.
    pub fn send_queue(&mut self) -> &mut SendQueue {
        &mut self.sq
    }

    /// The receive queue.
    pub fn recv_queue(&mut self) -> &mut RecvQueue {
        &mut self.rq
    }
}

impl Pd {
    /// Creates an RC QP (in RESET) whose sends complete in `send_cq` and receives in
    /// `recv_cq` (which may be the same CQ).
    pub fn create_qp(
        self: &Arc<Self>,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
    ) -> Result<Qp, VerbsError> {
        Qp::create(self, send_cq, recv_cq, caps, None, QpType::Rc)
    }

    /// Creates a UD QP (in RESET) whose sends complete in `send_cq` and receives in
    /// `recv_cq`: its sends go with [`Qp::post_send_ud`], each receive buffer gets the 40-byte
    /// GRH before the payload ([`crate::UD_GRH_LEN`]) and each receive completion the sender's
    /// QPN (`WorkCompletion::src_qp`). Refused by a provider without UD
    /// ([`crate::provider::Provider::supports_ud`]: softnic has it, mlx5 not yet).
    pub fn create_ud_qp(
        self: &Arc<Self>,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
    ) -> Result<Qp, VerbsError> {
        Qp::create(self, send_cq, recv_cq, caps, None, QpType::Ud)
    }

    /// Creates an RC QP (in RESET) that takes its receives from `srq` (of this PD); its
    /// receive completions, in `recv_cq`, name the QP.
    pub fn create_qp_on_srq(
        self: &Arc<Self>,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        srq: &Srq,
    ) -> Result<Qp, VerbsError> {
        Qp::create(self, send_cq, recv_cq, caps, Some(srq), QpType::Rc)
    }
}
