//! What `mlx5dv_init_obj` says about a QP or CQ, as the shapes the datapath drives.
//!
//! Pure functions over the two structs, so the tests can hand in ordinary memory dressed up
//! as a device's and drive the real datapath over it.

use std::ptr::NonNull;

use super::dv::{mlx5dv_cq, mlx5dv_qp, mlx5dv_wq};
use crate::datapath::doorbell::{Doorbell, DoorbellMode, MmioDoorbell};
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

/// Who else writes a QP's doorbell register, and whether the host lets us combine writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterUse {
    /// The register is the QP's alone (a thread domain's): BlueFlame copies cannot
    /// interleave with another QP's.
    pub dedicated: bool,
    /// BlueFlame is allowed on this host: not when `MLX5_SHUT_UP_BF` says write-combining is
    /// off or broken (VMs, some hypervisors), where libmlx5 maps the UAR uncached and never
    /// copies WQEs into it.
    pub blueflame: bool,
}

/// How the register of a QP whose `mlx5dv_qp.bf.size` is `bf_size` may be written.
pub fn doorbell_mode(bf_size: u32, register: RegisterUse) -> Result<DoorbellMode, String> {
    if !(register.dedicated && register.blueflame) || bf_size == 0 {
        return Ok(DoorbellMode::Plain);
    }
    if bf_size % 64 != 0 {
        return Err(format!(
            "BlueFlame size {bf_size} is not whole basic blocks"
        ));
    }
    Ok(DoorbellMode::BlueFlame { half: bf_size })
}

/// The QP as the datapath sees it, its register written as `register` allows: a shared
/// register, or a host without write-combining, gets plain 8-byte doorbells only, never
/// BlueFlame copies.
///
/// # Safety
/// `dv` must describe a live QP (as `mlx5dv_init_obj` filled it), whose rings, record and
/// register stay mapped until the returned shape, and every doorbell made from it, is gone;
/// if `register.dedicated`, nothing else may write the register.
pub unsafe fn qp_shape(dv: &mlx5dv_qp, register: RegisterUse) -> Result<QpShape, String> {
    let sq = work_queue(&dv.sq, "send queue")?;
    let rq = work_queue(&dv.rq, "receive queue")?;
    let dbrec = aligned(dv.dbrec, 8, "doorbell record")?;
    let mode = doorbell_mode(dv.bf.size, register)?;
    // A BlueFlame chunk is one 64-byte store on aarch64 (and one write-combined line on x86).
    let align = if mode == DoorbellMode::Plain { 8 } else { 64 };
    let reg = aligned(dv.bf.reg.cast::<u8>(), align, "doorbell register")?;
    // SAFETY: the register is aligned as the mode needs (checked); mlx5dv_init_obj's `bf.reg`
    // points at a BlueFlame register of two `bf.size` halves, mapped while the QP lives (the
    // caller's promise), the QP's alone for BlueFlame (`dedicated`). Plain writes only whole
    // 8-byte doorbells, which another QP's equally whole doorbells cannot tear.
    let doorbell = Doorbell::Mmio(unsafe { MmioDoorbell::new(reg, mode) });
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
