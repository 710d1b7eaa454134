//! What `mlx5dv_init_obj` says about a QP or CQ, as the shapes the datapath drives.
//!
//! Pure functions over the two structs, so the tests can hand in ordinary memory dressed up
//! as a device's and drive the real datapath over it.

use std::ptr::NonNull;

use super::dv::{mlx5dv_cq, mlx5dv_qp, mlx5dv_wq};
use crate::datapath::doorbell::{Doorbell, MmioDoorbell};
use crate::provider::RawWorkQueue;

/// A QP's rings, doorbell record and doorbell register.
#[derive(Debug)]
pub struct QpShape {
    /// Send queue (64-byte basic blocks).
    pub sq: RawWorkQueue,
    /// Receive queue.
    pub rq: RawWorkQueue,
    /// Doorbell record.
    pub dbrec: NonNull<u32>,
    /// Doorbell register.
    pub doorbell: Doorbell,
}

/// A CQ's ring and doorbell record, and the UAR page that arms it.
#[derive(Debug, Clone, Copy)]
pub struct CqShape {
    /// CQ number.
    pub cqn: u32,
    /// CQE ring.
    pub buf: NonNull<u8>,
    /// CQEs in the ring.
    pub cqe_cnt: u32,
    /// Bytes per CQE.
    pub cqe_size: u32,
    /// Doorbell record.
    pub dbrec: NonNull<u32>,
    /// The UAR page of the arm doorbell.
    pub uar: NonNull<u8>,
}

fn aligned<T>(ptr: *mut T, align: usize, what: &str) -> Result<NonNull<T>, String> {
    let p = NonNull::new(ptr).ok_or_else(|| format!("{what} is NULL"))?;
    if (p.as_ptr() as usize) % align != 0 {
        return Err(format!("{what} {p:p} is not {align}-byte aligned"));
    }
    Ok(p)
}

fn work_queue(wq: &mlx5dv_wq, what: &str) -> Result<RawWorkQueue, String> {
    Ok(RawWorkQueue {
        buf: aligned(wq.buf.cast::<u8>(), 16, what)?,
        wqe_cnt: wq.wqe_cnt,
        stride: wq.stride,
    })
}

/// The QP as the datapath sees it. `dedicated` says whether the QP's BlueFlame register is
/// its own (a thread domain's); a shared one gets plain 8-byte doorbells only, never
/// BlueFlame copies, which would interleave with another QP's.
///
/// # Safety
/// `dv` must describe a live QP (as `mlx5dv_init_obj` filled it), whose rings, record and
/// register stay mapped until the returned shape, and every doorbell made from it, is gone;
/// if `dedicated`, nothing else may write the register.
pub unsafe fn qp_shape(dv: &mlx5dv_qp, dedicated: bool) -> Result<QpShape, String> {
    let sq = work_queue(&dv.sq, "send queue")?;
    let rq = work_queue(&dv.rq, "receive queue")?;
    let dbrec = aligned(dv.dbrec, 8, "doorbell record")?;
    let reg = aligned(dv.bf.reg.cast::<u8>(), 8, "doorbell register")?;
    let bf_size = if dedicated { dv.bf.size } else { 0 };
    if bf_size % 64 != 0 {
        return Err(format!(
            "BlueFlame size {bf_size} is not whole basic blocks"
        ));
    }
    // SAFETY: the register is 8-byte aligned (checked); mlx5dv_init_obj's `bf.reg` points
    // at a BlueFlame register of two `bf.size` halves, mapped while the QP lives (the caller's
    // promise). With `dedicated` false we write only whole 8-byte doorbells (bf_size 0), which
    // another QP's equally whole doorbells to the same register cannot tear.
    let doorbell = Doorbell::Mmio(unsafe { MmioDoorbell::new(reg, bf_size) });
    Ok(QpShape {
        sq,
        rq,
        dbrec,
        doorbell,
    })
}

/// The CQ as the datapath sees it.
pub fn cq_shape(dv: &mlx5dv_cq) -> Result<CqShape, String> {
    Ok(CqShape {
        cqn: dv.cqn,
        buf: aligned(dv.buf.cast::<u8>(), 64, "CQE ring")?,
        cqe_cnt: dv.cqe_cnt,
        cqe_size: dv.cqe_size,
        dbrec: aligned(dv.dbrec, 8, "CQ doorbell record")?,
        uar: aligned(dv.cq_uar.cast::<u8>(), 8, "CQ UAR page")?,
    })
}
