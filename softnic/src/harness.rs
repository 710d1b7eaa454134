//! A small mlx5 driver for softnic's own tests and for `benches`: it writes send and receive
//! WQEs with hw-defs' layouts, rings doorbells, polls CQEs, and runs deterministic simulations
//! on the in-memory fabric with a virtual clock. It is test tooling, not the pmd: no failover,
//! no hugepages, one thread.

#[path = "harness_netns.rs"]
pub mod netns;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hw_defs::mlx5::{
    cqe, srq_wqe, AtomicSegRepr, Cqe64, CqeOpcode, CqeRepr, CtrlSegRepr, DataSegRepr,
    DatagramSegRepr, ErrCqe, ErrCqeRepr, FenceMode, InlineData, RaddrSegRepr, RecvWqe, SendOpcode,
    SendRing, SendWqeRepr, Sges, SrqNextSeg, Syndrome, WqeData, SEND_WQE_BB,
};
use hw_defs::verbs::WcStatus;

use crate::qp::DoorbellRegister;
use crate::{
    Access, Clock, CompletionChannel, CqConfig, CqHandle, Device, DeviceConfig, DeviceError,
    Fabric, MrKeys, PathMtu, PdId, ProgressMode, QpAttrs, QpConfig, QpState, QpType, QueueMemory,
    SrqConfig, SrqId, Wire,
};

/// Registered memory owned by the harness.
pub struct Buffer {
    /// The memory.
    pub mem: QueueMemory,
    /// Its keys.
    pub keys: MrKeys,
}

impl Buffer {
    /// Allocates and registers `len` zeroed bytes.
    pub fn new(dev: &Device, pd: PdId, len: usize, access: Access) -> Result<Buffer, DeviceError> {
        let mem = QueueMemory::alloc(len);
        // SAFETY: `mem` is owned by the Buffer; tests deregister or drop the device before the
        // buffer (the device never touches an MR after it is dropped).
        let keys = unsafe { dev.reg_mr(pd, mem.as_ptr(), len, access)? };
        Ok(Buffer { mem, keys })
    }

    /// Address of byte `offset`.
    pub fn addr(&self, offset: usize) -> u64 {
        self.mem.as_ptr() as u64 + offset as u64
    }

    /// A gather/scatter element over `offset..offset+len`.
    pub fn sge(&self, offset: usize, len: u32) -> DataSegRepr {
        DataSegRepr {
            byte_count: len,
            lkey: self.keys.lkey,
            addr: self.addr(offset),
        }
    }

    /// Copies bytes out, byte-wise atomically: the device may be writing them (see
    /// `crate::dma`).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset + out.len() <= self.mem.len());
        // SAFETY: in bounds of our allocation.
        unsafe { crate::dma::load_shared(self.mem.as_ptr().add(offset), out) }
    }

    /// Copies bytes in, byte-wise atomically.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.mem.len());
        // SAFETY: in bounds of our allocation.
        unsafe { crate::dma::store_shared(data, self.mem.as_ptr().add(offset)) }
    }

    /// Reads a native-endian u64 (atomic targets).
    pub fn read_u64(&self, offset: usize) -> u64 {
        let mut b = [0u8; 8];
        self.read(offset, &mut b);
        u64::from_ne_bytes(b)
    }
}

/// A completion, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The CQE opcode.
    pub opcode: CqeOpcode,
    /// Success, or the status the error syndrome maps to.
    pub status: WcStatus,
    /// The raw syndrome of an error CQE.
    pub syndrome: Option<Syndrome>,
    /// WQE counter: SQ WQE index or RQ counter.
    pub wqe_counter: u16,
    /// Byte count.
    pub byte_count: u32,
    /// Immediate (0 if none).
    pub imm: u32,
    /// QP number.
    pub qpn: u32,
    /// A UD receive's sending QP (0 otherwise).
    pub src_qp: u32,
    /// A UD receive's buffer starts with the 40-byte GRH.
    pub grh: bool,
}

/// A CQ driven by the harness.
pub struct HarnessCq {
    /// The device's handle (arm it for events).
    pub handle: CqHandle,
    ring: QueueMemory,
    dbrec: QueueMemory,
    count: u32,
    ci: u32,
}

impl HarnessCq {
    /// Creates a CQ of `count` entries, initialised as libmlx5 does (opcode invalid).
    pub fn new(
        dev: &Device,
        count: u32,
        channel: Option<Arc<CompletionChannel>>,
    ) -> Result<HarnessCq, DeviceError> {
        let ring = QueueMemory::alloc(count as usize * cqe::SIZE);
        for i in 0..count as usize {
            ring.write(
                i * cqe::SIZE + cqe::OP_OWN_OFFSET,
                &[u8::from(CqeOpcode::Invalid) << 4],
            );
        }
        let dbrec = QueueMemory::alloc(8);
        let handle = dev.create_cq(CqConfig {
            ring: ring.clone(),
            cqe_count: count,
            dbrec: dbrec.clone(),
            channel,
        })?;
        Ok(HarnessCq {
            handle,
            ring,
            dbrec,
            count,
            ci: 0,
        })
    }

    /// Takes the next CQE, if the device has written one.
    pub fn poll(&mut self) -> Option<Completion> {
        let off = cqe::cqe_offset(self.ci, self.count);
        // SAFETY: in bounds; the device stores this byte with release ordering after the rest.
        let op_own =
            unsafe { AtomicU8::from_ptr(self.ring.as_ptr().add(off + cqe::OP_OWN_OFFSET)) }
                .load(Ordering::Acquire);
        if !cqe::is_sw_owned(op_own, self.ci, self.count) {
            return None;
        }
        let mut bytes = [0u8; cqe::SIZE];
        // SAFETY: in bounds; the device finished this entry (owner bit observed with acquire).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ring.as_ptr().add(off),
                bytes.as_mut_ptr(),
                cqe::SIZE,
            )
        };
        let opcode = CqeOpcode::from(op_own >> 4);
        let c = if opcode.is_error() {
            let e = ErrCqeRepr::parse(&ErrCqe::new_checked(&bytes[..]).ok()?).ok()?;
            Completion {
                opcode,
                status: e.wc_status(),
                syndrome: Some(e.syndrome),
                wqe_counter: e.wqe_counter,
                byte_count: 0,
                imm: 0,
                qpn: e.qpn,
                src_qp: 0,
                grh: false,
            }
        } else {
            let cqe = Cqe64::new_checked(&bytes[..]).ok()?;
            let r = CqeRepr::parse(&cqe).ok()?;
            Completion {
                opcode,
                status: WcStatus::Success,
                syndrome: None,
                wqe_counter: r.wqe_counter,
                byte_count: r.byte_count,
                imm: r.imm,
                qpn: r.qpn,
                src_qp: cqe.remote_qpn(),
                grh: cqe.has_grh(),
            }
        };
        self.ci = self.ci.wrapping_add(1);
        // The consumer index tells the device the entry may be reused.
        self.dbrec.store_be32(0, self.ci & 0x00ff_ffff);
        Some(c)
    }
}

/// What a send WQE asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RDMA WRITE.
    Write {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate.
    WriteImm {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate.
        imm: u32,
    },
    /// SEND.
    Send,
    /// SEND with immediate.
    SendImm {
        /// Immediate.
        imm: u32,
    },
    /// RDMA READ into the local list.
    Read {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Compare and swap; the original value lands in the local list.
    CompareSwap {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// Fetch and add.
    FetchAdd {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
    /// No operation.
    Nop,
}

/// Where a send WQE's data comes from.
#[derive(Clone, Copy, Debug)]
pub enum Data<'a> {
    /// A gather (or, for READ and atomics, scatter) list.
    Sges(&'a [DataSegRepr]),
    /// Inline payload.
    Inline(&'a [u8]),
}

/// Sizes of a harness QP.
#[derive(Clone, Copy, Debug)]
pub struct QpSizes {
    /// Send ring basic blocks.
    pub sq_bbs: u32,
    /// Receive WQEs.
    pub rq_wqes: u32,
    /// Receive scatter elements per WQE.
    pub rq_sges: u32,
    /// Max inline bytes.
    pub max_inline: u32,
    /// Max send SGEs.
    pub max_send_sge: u32,
}

impl Default for QpSizes {
    fn default() -> Self {
        QpSizes {
            sq_bbs: 256,
            rq_wqes: 256,
            rq_sges: 4,
            max_inline: 256,
            max_send_sge: 4,
        }
    }
}

/// A QP driven by the harness.
pub struct HarnessQp {
    /// QP number.
    pub qpn: u32,
    doorbell: DoorbellRegister,
    sq: QueueMemory,
    /// BBs in the send ring (a power of two, as `create_qp` checked): a counter's BB is
    /// `counter & (sq_bbs - 1)`.
    sq_bbs: u32,
    /// Send producer counter in BBs.
    pub sq_pi: u32,
    rq: QueueMemory,
    /// Receive WQEs in the ring (a power of two, as `create_qp` checked).
    rq_wqes: u32,
    rq_stride: u32,
    /// Receive producer counter.
    pub rq_pi: u32,
    dbrec: QueueMemory,
    last_ctrl: u64,
}

impl HarnessQp {
    /// Creates an RC QP in RESET.
    pub fn new(
        dev: &Device,
        pd: PdId,
        send_cq: &HarnessCq,
        recv_cq: &HarnessCq,
        sizes: QpSizes,
    ) -> Result<HarnessQp, DeviceError> {
        Self::new_of_type(dev, pd, send_cq, recv_cq, sizes, QpType::Rc)
    }

    /// Creates a QP of `qp_type` in RESET (a UD QP's sends go with [`HarnessQp::post_ud`]).
    pub fn new_of_type(
        dev: &Device,
        pd: PdId,
        send_cq: &HarnessCq,
        recv_cq: &HarnessCq,
        sizes: QpSizes,
        qp_type: QpType,
    ) -> Result<HarnessQp, DeviceError> {
        let rq_stride = (sizes.rq_sges.max(1) * 16).next_power_of_two();
        let sq = QueueMemory::alloc(sizes.sq_bbs as usize * SEND_WQE_BB);
        let rq = QueueMemory::alloc(sizes.rq_wqes as usize * rq_stride as usize);
        let dbrec = QueueMemory::alloc(8);
        let h = dev.create_qp(QpConfig {
            pd,
            send_cq: send_cq.handle.id,
            recv_cq: recv_cq.handle.id,
            sq: sq.clone(),
            sq_bbs: sizes.sq_bbs,
            rq: rq.clone(),
            rq_wqes: sizes.rq_wqes,
            rq_stride,
            dbrec: dbrec.clone(),
            max_inline: sizes.max_inline,
            max_send_sge: sizes.max_send_sge,
            qp_type,
        })?;
        Ok(HarnessQp {
            qpn: h.qpn,
            doorbell: h.doorbell,
            sq,
            sq_bbs: sizes.sq_bbs,
            sq_pi: 0,
            rq,
            rq_wqes: sizes.rq_wqes,
            rq_stride,
            rq_pi: 0,
            dbrec,
            last_ctrl: 0,
        })
    }

    fn ring_bytes(&mut self) -> &mut [u8] {
        // SAFETY: the send ring is ours; the device only reads WQEs published by a doorbell,
        // and we never rewrite a WQE before its completion (tests keep within the ring).
        unsafe { std::slice::from_raw_parts_mut(self.sq.as_ptr(), self.sq.len()) }
    }

    /// Creates a QP in RESET that takes its receives from `srq`.
    pub fn new_on_srq(
        dev: &Device,
        pd: PdId,
        send_cq: &HarnessCq,
        recv_cq: &HarnessCq,
        sizes: QpSizes,
        srq: &HarnessSrq,
    ) -> Result<HarnessQp, DeviceError> {
        let sq = QueueMemory::alloc(sizes.sq_bbs as usize * SEND_WQE_BB);
        // The QP's own receive ring stays empty: the smallest one.
        let rq = QueueMemory::alloc(16);
        let dbrec = QueueMemory::alloc(8);
        let h = dev.create_qp_with_srq(
            QpConfig {
                pd,
                send_cq: send_cq.handle.id,
                recv_cq: recv_cq.handle.id,
                sq: sq.clone(),
                sq_bbs: sizes.sq_bbs,
                rq: rq.clone(),
                rq_wqes: 1,
                rq_stride: 16,
                dbrec: dbrec.clone(),
                max_inline: sizes.max_inline,
                max_send_sge: sizes.max_send_sge,
                qp_type: QpType::Rc,
            },
            srq.id,
        )?;
        Ok(HarnessQp {
            qpn: h.qpn,
            doorbell: h.doorbell,
            sq,
            sq_bbs: sizes.sq_bbs,
            sq_pi: 0,
            rq,
            rq_wqes: 1,
            rq_stride: 16,
            rq_pi: 0,
            dbrec,
            last_ctrl: 0,
        })
    }

    /// Writes a send WQE (not yet rung); returns its WQE index.
    pub fn post(&mut self, op: Op, data: Data<'_>, signaled: bool) -> u16 {
        self.post_with(op, data, signaled, FenceMode::None)
    }

    /// Writes a send WQE with a fence mode.
    pub fn post_with(&mut self, op: Op, data: Data<'_>, signaled: bool, fence: FenceMode) -> u16 {
        self.post_wqe(op, data, signaled, fence, None)
    }

    /// Writes a UD QP's send WQE (a SEND, SEND with immediate or NOP) to `dest`, with the
    /// datagram segment a UD WQE carries; `None` leaves the segment out (a malformed UD WQE).
    pub fn post_ud(
        &mut self,
        dest: Option<DatagramSegRepr>,
        op: Op,
        data: Data<'_>,
        signaled: bool,
    ) -> u16 {
        self.post_wqe(op, data, signaled, FenceMode::None, dest)
    }

    fn post_wqe(
        &mut self,
        op: Op,
        data: Data<'_>,
        signaled: bool,
        fence: FenceMode,
        datagram: Option<DatagramSegRepr>,
    ) -> u16 {
        let (opcode, raddr, atomic, imm) = match op {
            Op::Write { raddr, rkey } => (
                SendOpcode::RdmaWrite,
                Some(RaddrSegRepr { raddr, rkey }),
                None,
                0,
            ),
            Op::WriteImm { raddr, rkey, imm } => (
                SendOpcode::RdmaWriteImm,
                Some(RaddrSegRepr { raddr, rkey }),
                None,
                imm,
            ),
            Op::Send => (SendOpcode::Send, None, None, 0),
            Op::SendImm { imm } => (SendOpcode::SendImm, None, None, imm),
            Op::Read { raddr, rkey } => (
                SendOpcode::RdmaRead,
                Some(RaddrSegRepr { raddr, rkey }),
                None,
                0,
            ),
            Op::CompareSwap {
                raddr,
                rkey,
                compare,
                swap,
            } => (
                SendOpcode::AtomicCs,
                Some(RaddrSegRepr { raddr, rkey }),
                Some(AtomicSegRepr {
                    swap_add: swap,
                    compare,
                }),
                0,
            ),
            Op::FetchAdd { raddr, rkey, add } => (
                SendOpcode::AtomicFa,
                Some(RaddrSegRepr { raddr, rkey }),
                Some(AtomicSegRepr {
                    swap_add: add,
                    compare: 0,
                }),
                0,
            ),
            Op::Nop => (SendOpcode::Nop, None, None, 0),
        };
        let index = (self.sq_pi & 0xffff) as u16;
        let wqe = SendWqeRepr {
            datagram,
            ctrl: CtrlSegRepr {
                opcode,
                opmod: 0,
                wqe_index: index,
                qpn: self.qpn,
                ds: 0,
                signature: 0,
                fence,
                signaled,
                solicited: false,
                imm,
            },
            raddr,
            atomic,
            data: match data {
                Data::Sges(s) => WqeData::Gather(Sges::from_slice(s)),
                Data::Inline(b) => WqeData::Inline(InlineData::new(b)),
            },
        };
        let bbs = {
            let ring = self.ring_bytes();
            let mut ring = SendRing::new_checked(ring).expect("send ring geometry");
            wqe.emit(&mut ring).expect("WQE fits the ring")
        };
        let off = (u32::from(index) & (self.sq_bbs - 1)) as usize * SEND_WQE_BB;
        let mut first8 = [0u8; 8];
        self.sq.read(off, &mut first8);
        self.last_ctrl = u64::from_be_bytes(first8);
        self.sq_pi = self.sq_pi.wrapping_add(bbs as u32);
        index
    }

    /// Fills the send and receive rings with `noise` (cycled) and publishes the given counters
    /// with a doorbell: what a buggy or hostile driver could hand the device.
    pub fn post_garbage(&mut self, noise: &[u8], send_counter: u16, recv_counter: u16) {
        let ring = self.ring_bytes();
        for (b, n) in ring.iter_mut().zip(noise.iter().cycle()) {
            *b = *n;
        }
        // SAFETY: the receive ring is ours; the device reads it only after the counter below.
        let rq = unsafe { std::slice::from_raw_parts_mut(self.rq.as_ptr(), self.rq.len()) };
        for (b, n) in rq.iter_mut().zip(noise.iter().rev().cycle()) {
            *b = *n;
        }
        self.dbrec.store_be32(0, u32::from(recv_counter));
        self.dbrec.store_be32(4, u32::from(send_counter));
        self.doorbell
            .ring(u64::from_ne_bytes(noise[..8].try_into().unwrap_or([0; 8])));
    }

    /// Overwrites the `ds` of the WQE at `index` (tests of malformed WQEs).
    pub fn corrupt_ds(&mut self, index: u16, ds: u8) {
        let off = (u32::from(index) & (self.sq_bbs - 1)) as usize * SEND_WQE_BB;
        let ring = self.ring_bytes();
        let mut ctrl = hw_defs::mlx5::CtrlSeg::new_unchecked(&mut ring[off..off + 16]);
        ctrl.set_ds(ds);
    }

    /// Publishes every WQE written so far: doorbell record, then doorbell register.
    pub fn ring(&self) {
        // The WQEs must be visible before the counter; store_be32 is a release store.
        self.dbrec.store_be32(4, self.sq_pi & 0xffff);
        self.doorbell.ring(self.last_ctrl);
    }

    /// Posts a receive WQE with this scatter list and publishes it.
    pub fn post_recv(&mut self, sges: &[DataSegRepr]) {
        let off = (self.rq_pi & (self.rq_wqes - 1)) as usize * self.rq_stride as usize;
        // SAFETY: the receive ring is ours; the device reads this slot only after the counter
        // below publishes it.
        let slot = unsafe {
            std::slice::from_raw_parts_mut(self.rq.as_ptr().add(off), self.rq_stride as usize)
        };
        RecvWqe::new_checked(slot)
            .expect("stride")
            .write(sges)
            .expect("SGEs fit the stride");
        self.rq_pi = self.rq_pi.wrapping_add(1);
        self.dbrec.store_be32(0, self.rq_pi & 0xffff);
    }

    /// Basic blocks free in the send ring, assuming everything up to `completed_pi` is done.
    pub fn sq_free(&self, completed_pi: u32) -> u32 {
        self.sq_bbs - self.sq_pi.wrapping_sub(completed_pi)
    }

    /// Resets the producer counters (after the QP went to RESET), as libmlx5 does.
    pub fn reset_counters(&mut self) {
        self.sq_pi = 0;
        self.rq_pi = 0;
        self.dbrec.store_be32(0, 0);
        self.dbrec.store_be32(4, 0);
    }
}

/// A shared receive queue driven by the harness, as libmlx5 drives one: its free slots
/// linked through their next segments from `head` to `tail`, one slot always free.
pub struct HarnessSrq {
    /// The device's id for it.
    pub id: SrqId,
    ring: QueueMemory,
    dbrec: QueueMemory,
    stride: usize,
    head: u16,
    tail: u16,
    /// Receives posted.
    pub posted: u32,
}

impl HarnessSrq {
    /// Creates an SRQ of `wqes` slots (a power of two) of `sges` scatter entries, its limit
    /// armed at `limit` when non-zero.
    pub fn new(
        dev: &Device,
        pd: PdId,
        wqes: u32,
        sges: u32,
        limit: u32,
    ) -> Result<HarnessSrq, DeviceError> {
        let stride = ((sges.max(1) + 1) * 16).next_power_of_two() as usize;
        let ring = QueueMemory::alloc(wqes as usize * stride);
        for i in 0..wqes {
            let mut b = [0u8; srq_wqe::NEXT_SEG_SIZE];
            SrqNextSeg::new_unchecked(&mut b[..]).set_next_wqe_index(((i + 1) % wqes) as u16);
            ring.write(i as usize * stride, &b);
        }
        let dbrec = QueueMemory::alloc(4);
        let id = dev.create_srq(SrqConfig {
            pd,
            ring: ring.clone(),
            wqes,
            stride: stride as u32,
            dbrec: dbrec.clone(),
            limit,
        })?;
        Ok(HarnessSrq {
            id,
            ring,
            dbrec,
            stride,
            head: 0,
            tail: (wqes - 1) as u16,
            posted: 0,
        })
    }

    /// Posts a receive into the slot at the head of the free list and publishes it; returns
    /// the slot, or `None` when only the tail is free.
    pub fn post(&mut self, sges: &[DataSegRepr]) -> Option<u16> {
        if self.head == self.tail {
            return None;
        }
        let slot = self.head;
        let off = slot as usize * self.stride;
        // SAFETY: the ring is ours; the device reads this slot only after the count below
        // publishes it.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(self.ring.as_ptr().add(off), self.stride) };
        self.head = SrqNextSeg::new_unchecked(&bytes[..srq_wqe::NEXT_SEG_SIZE]).next_wqe_index();
        RecvWqe::new_checked(&mut bytes[srq_wqe::NEXT_SEG_SIZE..])
            .expect("stride")
            .write(sges)
            .expect("SGEs fit the stride");
        self.posted = self.posted.wrapping_add(1);
        self.dbrec.store_be32(0, self.posted);
        Some(slot)
    }

    /// Returns a completed receive's slot to the free list, at its tail.
    pub fn free(&mut self, slot: u16) {
        let mut b = [0u8; srq_wqe::NEXT_SEG_SIZE];
        let off = self.tail as usize * self.stride;
        self.ring.read(off, &mut b);
        SrqNextSeg::new_unchecked(&mut b[..]).set_next_wqe_index(slot);
        self.ring.write(off, &b);
        self.tail = slot;
    }
}

/// Connection parameters for [`connect`].
#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions {
    /// Path MTU.
    pub mtu: PathMtu,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// RNR timer code the responder advertises.
    pub min_rnr_timer: u8,
    /// max_rd_atomic and max_dest_rd_atomic.
    pub rd_atomic: u8,
    /// First PSN each side sends.
    pub psn: u32,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            mtu: PathMtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            rd_atomic: 16,
            psn: 0x00ff_fff0,
        }
    }
}

impl ConnectOptions {
    /// INIT attributes: every access right.
    pub fn init_attrs(&self) -> QpAttrs {
        QpAttrs {
            access: Some(Access::ALL),
            ..Default::default()
        }
    }

    /// RTR attributes towards `peer_qpn` at `peer_addr`.
    pub fn rtr_attrs(&self, peer_addr: IpAddr, peer_qpn: u32) -> QpAttrs {
        QpAttrs {
            path_mtu: Some(self.mtu),
            dest_qpn: Some(peer_qpn),
            dest_addr: Some(peer_addr),
            rq_psn: Some(self.psn),
            max_dest_rd_atomic: Some(self.rd_atomic),
            min_rnr_timer: Some(self.min_rnr_timer),
            ..Default::default()
        }
    }

    /// RTS attributes.
    pub fn rts_attrs(&self) -> QpAttrs {
        QpAttrs {
            timeout: Some(self.timeout),
            retry_cnt: Some(self.retry_cnt),
            rnr_retry: Some(self.rnr_retry),
            sq_psn: Some(self.psn),
            max_rd_atomic: Some(self.rd_atomic),
            ..Default::default()
        }
    }
}

/// Takes a QP from RESET to RTS towards a peer QP.
pub fn bring_up(
    dev: &Device,
    qpn: u32,
    peer_addr: IpAddr,
    peer_qpn: u32,
    o: &ConnectOptions,
) -> Result<(), DeviceError> {
    dev.modify_qp(qpn, QpState::Init, &o.init_attrs())?;
    dev.modify_qp(qpn, QpState::Rtr, &o.rtr_attrs(peer_addr, peer_qpn))?;
    dev.modify_qp(qpn, QpState::Rts, &o.rts_attrs())
}

/// Takes a UD QP from RESET to RTS with queue key `qkey` (and no peer: each send names one).
pub fn bring_up_ud(dev: &Device, qpn: u32, qkey: u32) -> Result<(), DeviceError> {
    let init = QpAttrs {
        qkey: Some(qkey),
        ..Default::default()
    };
    dev.modify_qp(qpn, QpState::Init, &init)?;
    dev.modify_qp(qpn, QpState::Rtr, &QpAttrs::default())?;
    let rts = QpAttrs {
        sq_psn: Some(0),
        ..Default::default()
    };
    dev.modify_qp(qpn, QpState::Rts, &rts)
}

/// The datagram segment of a UD SEND to QP `qpn` with queue key `qkey` at `addr` (its GID
/// IPv4-mapped for an IPv4 address; the MAC left zero, which softnic does not read).
pub fn ud_dest(addr: IpAddr, qpn: u32, qkey: u32) -> DatagramSegRepr {
    let v6 = match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    DatagramSegRepr {
        qkey,
        dqp: qpn,
        rmac: [0; 6],
        tclass: 0,
        hop_limit: 64,
        rgid: v6.octets(),
    }
}

/// Connects two QPs to each other.
pub fn connect(
    a: &Device,
    qa: &HarnessQp,
    b: &Device,
    qb: &HarnessQp,
    o: &ConnectOptions,
) -> Result<(), DeviceError> {
    bring_up(a, qa.qpn, b.addr(), qb.qpn, o)?;
    bring_up(b, qb.qpn, a.addr(), qa.qpn, o)
}

/// One side of a simple two-node setup.
pub struct Node {
    /// The device.
    pub dev: Device,
    /// Its PD.
    pub pd: PdId,
    /// Send CQ.
    pub scq: HarnessCq,
    /// Receive CQ.
    pub rcq: HarnessCq,
    /// The QP.
    pub qp: HarnessQp,
    /// A registered buffer with all access rights.
    pub buf: Buffer,
}

impl Node {
    /// A device with one QP, two CQs and a buffer of `buf_len` bytes.
    pub fn new(dev: Device, buf_len: usize, sizes: QpSizes) -> Result<Node, DeviceError> {
        let pd = dev.alloc_pd();
        let scq = HarnessCq::new(&dev, 4096, None)?;
        let rcq = HarnessCq::new(&dev, 4096, None)?;
        let qp = HarnessQp::new(&dev, pd, &scq, &rcq, sizes)?;
        let buf = Buffer::new(&dev, pd, buf_len, Access::ALL)?;
        Ok(Node {
            dev,
            pd,
            scq,
            rcq,
            qp,
            buf,
        })
    }
}

/// A deterministic simulation: devices in manual progress on one fabric and one virtual clock.
pub struct Sim {
    /// The shared virtual clock.
    pub clock: Clock,
    /// The fabric.
    pub fabric: Fabric,
    /// The devices' memory keys come from it too, so a run replays byte for byte.
    seed: u64,
}

impl Sim {
    /// A simulation whose faults (and memory keys) come from `seed`.
    pub fn new(seed: u64, latency: Duration) -> Sim {
        Sim {
            clock: Clock::new_virtual(),
            fabric: Fabric::new(seed, latency),
            seed,
        }
    }

    /// Adds a port with address 198.18.0.`n` and opens a manual-progress device on it.
    pub fn device(&self, name: &str, n: u8) -> Result<Device, DeviceError> {
        self.device_traced(name, n, None)
    }

    /// As [`Sim::device`], writing a pcap trace of the device's packets to `pcap`.
    pub fn device_traced(
        &self,
        name: &str,
        n: u8,
        pcap: Option<std::path::PathBuf>,
    ) -> Result<Device, DeviceError> {
        let port = self
            .fabric
            .add_port(IpAddr::V4(Ipv4Addr::new(198, 18, 0, n)));
        Device::open(DeviceConfig {
            name: name.into(),
            wire: Wire::Fabric {
                fabric: self.fabric.clone(),
                port,
            },
            progress: ProgressMode::Manual,
            clock: self.clock.clone(),
            pcap,
            key_seed: Some(self.seed ^ u64::from(n)),
            send_path: crate::SendPath::Frames,
        })
    }

    /// Runs rounds on `devices` until `done` says so or `limit` of virtual time passes; jumps
    /// the clock to the next timer whenever every device is idle. Returns whether `done` held.
    pub fn run_until(
        &self,
        devices: &[&Device],
        limit: Duration,
        mut done: impl FnMut() -> bool,
    ) -> bool {
        let end = self.clock.now() + limit;
        loop {
            if done() {
                return true;
            }
            let now = self.clock.now();
            let mut busy = false;
            let mut next: Option<Duration> = self.fabric.next_event(now);
            for d in devices {
                let a = d.progress(now);
                busy |= a.busy;
                if let Some(t) = a.next_deadline {
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            }
            if busy {
                continue;
            }
            if done() {
                return true;
            }
            match next {
                Some(t) if t <= end => self.clock.advance_to(t.max(now + Duration::from_nanos(1))),
                _ => {
                    self.clock.advance_to(end);
                    for d in devices {
                        d.progress(end);
                    }
                    return done();
                }
            }
        }
    }
}
