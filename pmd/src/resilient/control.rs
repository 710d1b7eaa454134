//! The control QP: the dedicated RC QP pair on the backup devices that carries the failover
//! protocol's own messages (`docs/failover.md` section 4), never the application's.
//!
//! Messages are 32-byte inline SENDs ([`ControlRepr`]). A ring of receives is kept posted and
//! each consumed one is posted again. The service lcore polls the channel (its CQ has
//! completion events, so an idle service sleeps until a message comes) and hands messages to
//! the resilient QP's mailbox; the QP's own lcore sends. Both take the channel's lock: control
//! messages are rare, and the lock never sits on the application's datapath.

use std::sync::{Arc, Mutex};

use crate::control::ModifyError;
use crate::control::{Cq, Pd, Qp, RegisteredBuffer};
use crate::datapath::wr::{RecvWr, SendOp, SendWr, WorkCompletion};
use crate::failover::{ControlMessage, ControlPacket, ControlRepr, Event, CONTROL_MESSAGE_LEN};
use crate::provider::VerbsError;
use crate::qp_state::QpState;
use crate::verbs::{Access, AddressVector, Gid, QpAttr, QpCaps};

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
    qp: Qp,
    cq: Cq,
    buf: RegisteredBuffer,
    depth: u32,
    /// The peer's default QPN: the destination every message names.
    peer_default_qpn: u32,
    /// Our default QPN: what messages for us name.
    local_default_qpn: u32,
    /// A send or receive failed: the channel is dead for good (it is never reset).
    broken: bool,
    wcs: [WorkCompletion; 16],
}

/// One end of a control QP pair.
pub(crate) struct ControlChannel {
    inner: Mutex<Inner>,
    qpn: u32,
}

impl std::fmt::Debug for ControlChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlChannel")
            .field("qpn", &self.qpn)
            .finish_non_exhaustive()
    }
}

/// wr_id of control sends (receives carry their slot number).
const SEND_WR_ID: u64 = u64::MAX;

impl ControlChannel {
    /// Creates the control QP, its CQ (with completion events) and its receive buffers on the
    /// backup PD `pd`, and posts the receives.
    pub fn create(
        pd: &Arc<Pd>,
        depth: u32,
        local_default_qpn: u32,
    ) -> Result<ControlChannel, VerbsError> {
        let depth = depth.max(4);
        let ctx = pd.context();
        let cq = ctx.create_cq(2 * depth, true)?;
        let qp = pd.create_qp(
            &cq,
            &cq,
            QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: CONTROL_MESSAGE_LEN as u32,
            },
        )?;
        let buf = pd.alloc_buffer(depth as usize * CONTROL_MESSAGE_LEN, Access::LOCAL_WRITE)?;
        // Receives may be posted from INIT on: `init` posts the ring.
        let qpn = qp.qpn();
        Ok(ControlChannel {
            inner: Mutex::new(Inner {
                qp,
                cq,
                buf,
                depth,
                peer_default_qpn: 0,
                local_default_qpn,
                broken: false,
                wcs: [WorkCompletion::EMPTY; 16],
            }),
            qpn,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The control QP's number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// RESET -> INIT, then posts the receive ring.
    pub fn init(&self) -> Result<(), ModifyError> {
        let mut c = self.lock();
        c.qp.modify(QpState::Init, &QpAttr::init(Access::NONE))?;
        for slot in 0..c.depth {
            let sge = c.buf.sge(
                slot as usize * CONTROL_MESSAGE_LEN,
                CONTROL_MESSAGE_LEN as u32,
            );
            c.qp.post_recv(&RecvWr::new(u64::from(slot), &[sge]))
                .map_err(|e| {
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
    /// `peer_gid`; `template_rtr`/`template_rts` are the application's attributes (path MTU,
    /// timeout and retries carry over; PSNs start at 0, no reads or atomics).
    pub fn connect(
        &self,
        peer_gid: Gid,
        peer_qpn: u32,
        peer_default_qpn: u32,
        template_rtr: &QpAttr,
        template_rts: &QpAttr,
    ) -> Result<(), ModifyError> {
        let mut c = self.lock();
        c.peer_default_qpn = peer_default_qpn;
        let mut rtr = QpAttr::rtr(
            AddressVector::to_gid(peer_gid),
            peer_qpn,
            0,
            template_rtr.path_mtu.unwrap_or(crate::verbs::Mtu::Mtu1024),
        );
        rtr.max_dest_rd_atomic = Some(0);
        if let Some(t) = template_rtr.min_rnr_timer {
            rtr.min_rnr_timer = Some(t);
        }
        c.qp.modify(QpState::Rtr, &rtr)?;
        let mut rts = QpAttr::rts(0);
        rts.timeout = template_rts.timeout.or(rts.timeout);
        rts.retry_cnt = template_rts.retry_cnt.or(rts.retry_cnt);
        rts.max_rd_atomic = Some(0);
        c.qp.modify(QpState::Rts, &rts)
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
        let wr = SendWr::inline(SEND_WR_ID, SendOp::Send, &bytes).signaled();
        c.qp.post_send(&wr).map_err(|e| ControlError::Broken {
            qpn,
            reason: e.to_string(),
        })?;
        c.qp.ring_doorbell();
        Ok(())
    }

    /// Polls the channel: messages for us become [`Event::Control`], a failed completion
    /// becomes one [`Event::ControlSendFailed`] (the channel is then dead). Returns whether
    /// anything was polled.
    pub fn poll(&self, out: &mut Vec<Event>) -> bool {
        let mut c = self.lock();
        let mut any = false;
        loop {
            let c = &mut *c;
            let n = c.cq.poll(&mut c.wcs);
            if n == 0 {
                break;
            }
            any = true;
            for i in 0..n {
                let wc = c.wcs[i];
                if !wc.is_ok() {
                    if !c.broken {
                        tracing::warn!(control_qpn = self.qpn, status = ?wc.status, "failover: control QP failed; the backup path is gone");
                        c.broken = true;
                        out.push(Event::ControlSendFailed);
                    }
                    continue;
                }
                if wc.wr_id == SEND_WR_ID {
                    continue;
                }
                let slot = wc.wr_id as usize;
                let mut bytes = [0u8; CONTROL_MESSAGE_LEN];
                c.buf.read(slot * CONTROL_MESSAGE_LEN, &mut bytes);
                let len = (wc.byte_len as usize).min(CONTROL_MESSAGE_LEN);
                match ControlPacket::new_checked(&bytes[..len]).and_then(|p| ControlRepr::parse(&p))
                {
                    Ok(repr) if repr.dest_qpn == c.local_default_qpn => {
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
                let sge = c
                    .buf
                    .sge(slot * CONTROL_MESSAGE_LEN, CONTROL_MESSAGE_LEN as u32);
                if let Err(e) = c.qp.post_recv(&RecvWr::new(wc.wr_id, &[sge])) {
                    tracing::warn!(control_qpn = self.qpn, error = %e, "failover: control receive not reposted");
                }
            }
        }
        any
    }

    /// Arms the CQ's completion event: the next completion makes [`ControlChannel::event_fd`]
    /// readable. Poll again after arming, or a completion written just before is missed.
    pub fn arm(&self) {
        if let Err(e) = self.lock().cq.arm() {
            tracing::warn!(control_qpn = self.qpn, error = %e, "failover: cannot arm the control CQ");
        }
    }

    /// Consumes a pending completion event without waiting.
    pub fn clear_event(&self) {
        let _ = self.lock().cq.wait_event(Some(std::time::Duration::ZERO));
    }

    /// The descriptor that becomes readable on a completion event.
    pub fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.lock().cq.event_fd()
    }
}
