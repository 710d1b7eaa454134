//! Raw WQEs: what only the failover layer uses, apart from the post and poll path. It reads
//! the WQEs a send queue holds ([`SendQueue::outstanding`], [`SendQueue::written_from`],
//! [`SendQueue::copy_wqe`]), writes a copied one into another ring ([`SendQueue::post_raw`]),
//! and rewrites the memory keys a copied WQE names for the other device of a pair
//! ([`rewrite_keys`] and the helpers built on it).

use hw_defs::mlx5::{
    ctrl_seg, data_seg, raddr_seg, wqe, CtrlSeg, DataSeg, InlineSeg, RaddrSeg, SendOpcode,
};

use super::{SendQueue, BB, DS_PER_BB, UNIT};
use crate::datapath::track::WqeInfo;
use crate::datapath::wr::{PostError, WcStatus};

/// A WQE that has been written and not yet completed, as the failover layer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutstandingWqe {
    /// The producer counter (in basic blocks) where it starts; its WQE index is the low 16 bits.
    pub counter: u32,
    /// The work request id.
    pub wr_id: u64,
    /// Size, opcode, signaled.
    pub info: WqeInfo,
    /// Whether a doorbell has published it to the device.
    pub published: bool,
}

impl OutstandingWqe {
    /// The WQE index written in its control segment.
    pub fn index(&self) -> u16 {
        self.counter as u16
    }
}

impl SendQueue {
    /// The WQEs written and not yet completed, oldest first.
    pub fn outstanding(&self) -> impl Iterator<Item = OutstandingWqe> + '_ {
        self.written_from(self.track.wqe_ci())
    }

    /// The WQEs written from producer counter `start` on, oldest first, whether completed or
    /// not. `start` must be where a WQE starts, at or after the oldest slot still holding one
    /// (the failover layer passes the consumer counter it read just before a flush retired
    /// WQEs that it is about to copy: their bytes and bookkeeping are still in the ring).
    pub fn written_from(&self, start: u32) -> impl Iterator<Item = OutstandingWqe> + '_ {
        let end = self.wqe_pi;
        let db = self.wqe_db_pi;
        let mut at = start;
        std::iter::from_fn(move || {
            if at == end {
                return None;
            }
            let info = self.wqe_info(at);
            let w = OutstandingWqe {
                counter: at,
                wr_id: self.track.wr_id(at),
                info,
                published: db.wrapping_sub(at) as i32 > 0,
            };
            at = at.wrapping_add(u32::from(info.bbs.max(1)));
            Some(w)
        })
    }

    /// Copies the bytes of the WQE starting at counter `at` (its basic blocks, unwrapped)
    /// into `out`; returns the length. `out` must hold `bbs * 64` bytes.
    pub fn copy_wqe(&self, at: u32, out: &mut [u8]) -> usize {
        let bbs = self.track.bbs(at) as usize;
        let len = bbs * BB;
        for b in 0..bbs {
            let index = (at.wrapping_add(b as u32) & self.wqe_m) as usize;
            // SAFETY: index <= wqe_m: a whole basic block inside the ring. The WQE is written
            // and the device only reads it, so copying out races with nothing.
            let src = unsafe { std::slice::from_raw_parts(self.ring.as_ptr().add(index * BB), BB) };
            out[b * BB..(b + 1) * BB].copy_from_slice(src);
        }
        len
    }

    /// Writes a WQE given as raw bytes (one copied from another ring, keys already rewritten)
    /// at the producer counter, renumbering its WQE index and QP number; returns the index.
    /// The bytes must be a whole WQE whose control segment's `ds` fits in them.
    pub fn post_raw(&mut self, bytes: &[u8], wr_id: u64) -> Result<u16, PostError> {
        let ctrl = CtrlSeg::new_unchecked(&bytes[..UNIT]);
        let ds = u32::from(ctrl.ds()).max(1);
        let bbs = ds.div_ceil(DS_PER_BB);
        self.reserve(bbs)?;
        let start = self.wqe_pi;
        for u in 0..ds {
            let src = &bytes[u as usize * UNIT..(u as usize + 1) * UNIT];
            self.unit(start, u).copy_from_slice(src);
        }
        let qpn = self.qpn;
        let mut ctrl = CtrlSeg::new_unchecked(&mut self.unit(start, 0)[..]);
        ctrl.set_wqe_index(start as u16);
        ctrl.set_qpn(qpn);
        Ok(self.commit(start, wr_id, bbs))
    }

    /// What the WQE starting at counter `at` is: its size from the track, its opcode and
    /// signaled flag from its control segment in the ring.
    fn wqe_info(&self, at: u32) -> WqeInfo {
        let i = (at & self.wqe_m) as usize;
        // SAFETY: i <= wqe_m: the control segment (16 bytes) lies inside the ring; the WQE was
        // written by this queue and the device only reads it.
        let bytes = unsafe { std::slice::from_raw_parts(self.ring.as_ptr().add(i * BB), UNIT) };
        let ctrl = CtrlSeg::new_unchecked(bytes);
        WqeInfo {
            bbs: self.track.bbs(at) as u8,
            opcode: ctrl.opcode(),
            signaled: ctrl.cq_update(),
        }
    }
}

/// Why [`rewrite_keys`] could not rewrite a raw WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    /// The bytes end before the control segment, or before the `ds` units it announces.
    #[error(
        "a raw WQE of {len} bytes is shorter than its control segment's {ds} units of 16 bytes"
    )]
    Truncated {
        /// The length of the bytes given.
        len: usize,
        /// The WQE's size in 16-byte units, as its control segment says (0 when the bytes do
        /// not hold a control segment).
        ds: usize,
    },
    /// An opcode the driver never posts, so it does not know where its keys are.
    #[error("opcode {0:?} is not one the driver posts")]
    Opcode(SendOpcode),
}

/// Rewrites the local lkeys (through `lkey`) and the remote rkey (through `rkey`) that a raw
/// send WQE names, so that a copy can be posted on another device.
pub fn rewrite_keys(
    wqe_bytes: &mut [u8],
    mut lkey: impl FnMut(u32) -> u32,
    mut rkey: impl FnMut(u32) -> u32,
) -> Result<(), RewriteError> {
    let len = wqe_bytes.len();
    let ctrl =
        CtrlSeg::new_checked(&wqe_bytes[..]).map_err(|_| RewriteError::Truncated { len, ds: 0 })?;
    let opcode = ctrl.opcode();
    let ds = usize::from(ctrl.ds());
    if matches!(opcode, SendOpcode::Unknown(_) | SendOpcode::Nop) {
        return Err(RewriteError::Opcode(opcode));
    }
    // Every segment below lies inside the `ds` units, so none of the checks after this one
    // can fail.
    let truncated = RewriteError::Truncated { len, ds };
    if ds * UNIT > len {
        return Err(truncated);
    }
    let header = wqe::header_ds(opcode);
    if opcode.has_raddr_seg() {
        let mut raddr =
            RaddrSeg::new_checked(&mut wqe_bytes[UNIT..2 * UNIT]).map_err(|_| truncated)?;
        let k = raddr.rkey();
        raddr.set_rkey(rkey(k));
    }
    if header < ds {
        let first = &wqe_bytes[header * UNIT..];
        if InlineSeg::new_checked(first)
            .map_err(|_| truncated)?
            .is_inline()
        {
            return Ok(());
        }
        for u in header..ds {
            let mut seg = DataSeg::new_checked(&mut wqe_bytes[u * UNIT..(u + 1) * UNIT])
                .map_err(|_| truncated)?;
            let k = seg.lkey();
            seg.set_lkey(lkey(k));
        }
    }
    Ok(())
}

/// Rewrites the lkeys of a receive WQE's data segments (up to the terminator) through `map`;
/// the first lkey without a mapping is the error.
pub fn rewrite_recv_keys(bytes: &mut [u8], map: impl Fn(u32) -> Option<u32>) -> Result<(), u32> {
    for seg in bytes.chunks_exact_mut(data_seg::SIZE) {
        let mut seg = DataSeg::new_unchecked(seg);
        if seg.is_terminator() {
            break;
        }
        if seg.byte_count() == 0 {
            continue;
        }
        let k = seg.lkey();
        seg.set_lkey(map(k).ok_or(k)?);
    }
    Ok(())
}

/// The peer's rkey of a raw send WQE as `map` gives it for the other device of the pair
/// (`toward`, named in the error): `None` when the WQE names no remote memory (a WRITE
/// without data needs no mapping), the rkey as it is when it has none to map.
pub fn mapped_peer_rkey(
    wqe: &[u8],
    map: impl FnOnce(u32) -> Option<u32>,
    toward: &str,
) -> Result<Option<u32>, (WcStatus, String)> {
    match wqe_rkey(wqe) {
        Some((rkey, true)) => map(rkey).map(Some).ok_or_else(|| {
            (
                WcStatus::LocProtErr,
                format!("no {toward} rkey for the peer's rkey {rkey:#x}"),
            )
        }),
        Some((rkey, false)) => Ok(Some(rkey)),
        None => Ok(None),
    }
}

/// Rewrites a raw send WQE for the other device of the pair (`toward`, named in the error):
/// its lkeys through `lkey`, its remote-address segment's rkey to `rkey` (from
/// [`mapped_peer_rkey`]). Fails with the status of the local error it amounts to: an lkey
/// with no counterpart, or a WQE [`rewrite_keys`] refuses.
pub fn rewrite_send_keys(
    wqe: &mut [u8],
    rkey: Option<u32>,
    lkey: impl Fn(u32) -> Option<u32>,
    toward: &str,
) -> Result<(), (WcStatus, String)> {
    let mut missing = None;
    let rewritten = rewrite_keys(
        wqe,
        |k| match lkey(k) {
            Some(mapped) => mapped,
            None => {
                missing.get_or_insert(k);
                k
            }
        },
        |k| rkey.unwrap_or(k),
    );
    if let Err(e) = rewritten {
        return Err((WcStatus::LocQpOpErr, e.to_string()));
    }
    match missing {
        Some(k) => Err((
            WcStatus::LocProtErr,
            format!("no {toward} lkey for lkey {k:#x}"),
        )),
        None => Ok(()),
    }
}

/// The rkey of a raw send WQE that has a remote-address segment, and whether the WQE names
/// remote memory (it carries data, or is an atomic): a zero-length WRITE does not.
pub fn wqe_rkey(wqe: &[u8]) -> Option<(u32, bool)> {
    let ctrl = CtrlSeg::new_checked(wqe).ok()?;
    let opcode = ctrl.opcode();
    if !opcode.has_raddr_seg() {
        return None;
    }
    // The remote-address segment follows the control segment.
    let raddr = wqe.get(ctrl_seg::SIZE..ctrl_seg::SIZE + raddr_seg::SIZE)?;
    let raddr = RaddrSeg::new_checked(raddr).ok()?;
    let names_memory = opcode.has_atomic_seg() || usize::from(ctrl.ds()) > wqe::header_ds(opcode);
    Some((raddr.rkey(), names_memory))
}

#[cfg(test)]
mod tests {
    use hw_defs::mlx5::{CtrlSeg, DataSeg, RaddrSeg, SendOpcode};

    use super::{rewrite_keys, RewriteError, UNIT};
    use crate::control::testing::{caps, connect, ctrl_of, remote, rig};
    use crate::datapath::wr::{SendOp, SendWr, WorkCompletion};

    /// A WRITE of one gather entry: control, remote address, data segment.
    fn write_wqe(rkey: u32, lkey: u32) -> Vec<u8> {
        let mut bytes = vec![0u8; 4 * UNIT];
        let mut ctrl = CtrlSeg::new_unchecked(&mut bytes[..UNIT]);
        ctrl.set_opcode(SendOpcode::RdmaWrite);
        ctrl.set_ds(3);
        RaddrSeg::new_unchecked(&mut bytes[UNIT..2 * UNIT]).set_rkey(rkey);
        let mut data = DataSeg::new_unchecked(&mut bytes[2 * UNIT..3 * UNIT]);
        data.set_byte_count(64);
        data.set_lkey(lkey);
        bytes
    }

    #[test]
    fn a_write_gets_both_keys_rewritten() {
        let mut bytes = write_wqe(0x20, 0x10);
        rewrite_keys(&mut bytes, |l| l + 1, |r| r + 2).unwrap();
        assert_eq!(RaddrSeg::new_unchecked(&bytes[UNIT..2 * UNIT]).rkey(), 0x22);
        assert_eq!(
            DataSeg::new_unchecked(&bytes[2 * UNIT..3 * UNIT]).lkey(),
            0x11
        );
    }

    #[test]
    fn an_opcode_the_driver_does_not_post_is_refused_by_name() {
        let mut bytes = write_wqe(0x20, 0x10);
        CtrlSeg::new_unchecked(&mut bytes[..UNIT]).set_opcode(SendOpcode::Nop);
        let error = rewrite_keys(&mut bytes, |l| l, |r| r).unwrap_err();
        assert_eq!(error, RewriteError::Opcode(SendOpcode::Nop));
        assert!(error.to_string().contains("Nop"), "{error}");
    }

    #[test]
    fn a_wqe_shorter_than_its_ds_is_refused_and_left_alone() {
        let mut bytes = write_wqe(0x20, 0x10);
        let mut short = bytes[..2 * UNIT].to_vec();
        let error = rewrite_keys(&mut short, |l| l + 1, |r| r + 2).unwrap_err();
        assert_eq!(error, RewriteError::Truncated { len: 32, ds: 3 });
        assert_eq!(short, bytes[..2 * UNIT], "nothing rewritten");
        let error = rewrite_keys(&mut bytes[..8], |l| l, |r| r).unwrap_err();
        assert_eq!(error, RewriteError::Truncated { len: 8, ds: 0 });
    }

    #[test]
    fn an_outstanding_wqe_copies_into_another_qp_with_keys_index_and_qpn_rewritten() {
        let mut r = rig();
        let mut backup = r.pd.create_qp(&r.cq, &r.cq, caps()).unwrap();
        connect(&mut backup);
        // Move the backup's producer index so the copy must be renumbered.
        let sge = r.buf.sge(0, 8);
        let i = backup
            .post_send(&SendWr::new(0, SendOp::Send, &[sge]).signaled())
            .unwrap();
        r.fake.cq(0).req(backup.qpn(), i, 0);
        let mut wcs = [WorkCompletion::EMPTY; 2];
        r.cq.poll(&mut wcs);

        r.qp.post_send(&SendWr::new(42, SendOp::Write { remote: remote() }, &[sge]).signaled())
            .unwrap();
        let w = r.qp.send_queue().outstanding().next().unwrap();
        assert_eq!(
            (w.wr_id, w.info.opcode, w.published),
            (42, SendOpcode::RdmaWrite, false)
        );
        let mut bytes = [0u8; 64];
        r.qp.send_queue().copy_wqe(w.counter, &mut bytes);
        rewrite_keys(&mut bytes, |l| l + 1, |k| k + 2).unwrap();
        let idx = backup.send_queue().post_raw(&bytes, w.wr_id).unwrap();
        assert_eq!(idx, 1);
        let bb = r.fake.qp(backup.qpn()).sq_bb(1);
        let ctrl = ctrl_of(&bb);
        assert_eq!(
            (ctrl.wqe_index, ctrl.qpn, ctrl.opcode),
            (1, backup.qpn(), SendOpcode::RdmaWrite)
        );
        assert_eq!(
            RaddrSeg::new_checked(&bb[16..32]).unwrap().rkey(),
            0xabcd + 2
        );
        assert_eq!(
            DataSeg::new_checked(&bb[32..48]).unwrap().lkey(),
            r.buf.lkey() + 1
        );
        backup.ring_doorbell();
        r.fake.cq(0).req(backup.qpn(), idx, 8);
        assert_eq!(r.cq.poll(&mut wcs), 1);
        assert_eq!(wcs[0].wr_id, 42);
    }
}
