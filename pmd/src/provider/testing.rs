//! A provider that hands out real pool memory and does nothing else: the tests play the
//! device by reading the WQEs the driver wrote and writing the CQEs it polls.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use hw_defs::mlx5::{
    cqe, req_cqe, Cqe64, CqeOpcode, CqeRepr, ErrCqe, ErrCqeRepr, SendOpcode, Syndrome,
};

use super::{
    CqRequest, Handle, Provider, QpRequest, RawCq, RawMr, RawQp, RawWorkQueue, VerbsError,
};
use crate::datapath::doorbell::{Doorbell, DoorbellMode, MmioDoorbell};
use crate::memory::{Block, MemoryPool};
use crate::name::DeviceName;
use crate::qp_state::QpState;
use crate::verbs::{Access, DeviceAttr, Gid, Mtu, PortAttr, PortState, QpAttr, QpCaps};

/// What the test can see of a QP the driver created.
#[derive(Clone)]
pub struct FakeQp {
    pub qpn: u32,
    pub sq: Arc<Block>,
    pub sq_bbs: u32,
    pub rq: Arc<Block>,
    pub rq_stride: u32,
    pub dbrec: Arc<Block>,
    pub doorbell: Arc<Block>,
    pub state: QpState,
}

impl FakeQp {
    pub fn dbrec_send(&self) -> u16 {
        // SAFETY: the record block is at least 8 bytes.
        let w =
            unsafe { (*(self.dbrec.as_ptr().add(4) as *const AtomicU32)).load(Ordering::Acquire) };
        u32::from_be(w) as u16
    }

    pub fn dbrec_recv(&self) -> u16 {
        // SAFETY: as above.
        let w = unsafe { (*(self.dbrec.as_ptr() as *const AtomicU32)).load(Ordering::Acquire) };
        u32::from_be(w) as u16
    }

    /// The 8 bytes last written to the doorbell register.
    pub fn doorbell_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        // SAFETY: the register block is at least 8 bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.doorbell.as_ptr(), b.as_mut_ptr(), 8) };
        b
    }

    /// Basic block `bb` of the send ring.
    pub fn sq_bb(&self, bb: u32) -> [u8; 64] {
        let mut b = [0u8; 64];
        let at = ((bb & (self.sq_bbs - 1)) * 64) as usize;
        // SAFETY: inside the ring.
        unsafe { std::ptr::copy_nonoverlapping(self.sq.as_ptr().add(at), b.as_mut_ptr(), 64) };
        b
    }

    /// The whole send ring.
    pub fn sq_bytes(&self) -> Vec<u8> {
        let len = self.sq_bbs as usize * 64;
        // SAFETY: the ring is `len` bytes.
        unsafe { std::slice::from_raw_parts(self.sq.as_ptr(), len) }.to_vec()
    }

    /// Receive slot `i`.
    pub fn rq_slot(&self, i: u32) -> Vec<u8> {
        let at = (i * self.rq_stride) as usize;
        // SAFETY: tests only read slots inside the ring.
        unsafe { std::slice::from_raw_parts(self.rq.as_ptr().add(at), self.rq_stride as usize) }
            .to_vec()
    }
}

/// What the test can see of a CQ, and how it writes CQEs into it.
#[derive(Clone)]
pub struct FakeCq {
    pub ring: Arc<Block>,
    pub count: u32,
    pub dbrec: Arc<Block>,
    /// How many CQEs the "device" has written.
    pub produced: Arc<AtomicU32>,
}

impl FakeCq {
    fn next_slot(&self) -> (*mut u8, bool) {
        let n = self.produced.fetch_add(1, Ordering::Relaxed);
        // SAFETY: inside the ring.
        let ptr = unsafe { self.ring.as_ptr().add(cqe::cqe_offset(n, self.count)) };
        (ptr, cqe::sw_owner_bit(n, self.count))
    }

    /// Writes a successful CQE, owner byte last with a release store, as a device does.
    pub fn push(&self, repr: CqeRepr) {
        self.push_with(repr, |_| {});
    }

    /// As [`FakeCq::push`], with `more` writing into the body before the owner byte.
    fn push_with(&self, repr: CqeRepr, more: impl FnOnce(&mut [u8])) {
        let (ptr, owner) = self.next_slot();
        // SAFETY: one CQE inside the ring, not yet owned by the driver.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, cqe::SIZE) };
        repr.emit_body(&mut Cqe64::new_unchecked(&mut bytes[..]));
        more(bytes);
        let op_own = repr.op_own(owner);
        // SAFETY: the owner byte is inside the CQE.
        unsafe {
            (*(ptr.add(cqe::OP_OWN_OFFSET) as *const std::sync::atomic::AtomicU8))
                .store(op_own, Ordering::Release)
        };
    }

    /// Writes an error CQE.
    pub fn push_error(&self, repr: ErrCqeRepr) {
        let (ptr, owner) = self.next_slot();
        // SAFETY: as in `push`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, cqe::SIZE) };
        repr.emit_body(&mut ErrCqe::new_unchecked(&mut bytes[..]));
        let op_own = repr.op_own(owner);
        // SAFETY: as in `push`.
        unsafe {
            (*(ptr.add(cqe::OP_OWN_OFFSET) as *const std::sync::atomic::AtomicU8))
                .store(op_own, Ordering::Release)
        };
    }

    /// A successful requester CQE for an RDMA WRITE (the opcode a device writes into byte 56).
    pub fn req(&self, qpn: u32, wqe_counter: u16, byte_count: u32) {
        self.req_op(qpn, wqe_counter, SendOpcode::RdmaWrite, byte_count);
    }

    /// A successful requester CQE for a WQE of `opcode`.
    pub fn req_op(&self, qpn: u32, wqe_counter: u16, opcode: SendOpcode, byte_count: u32) {
        let repr = CqeRepr {
            opcode: CqeOpcode::Req,
            wqe_counter,
            byte_count,
            imm: 0,
            qpn,
            solicited: false,
            timestamp: 0,
        };
        self.push_with(repr, |bytes| {
            req_cqe::set_req_wqe_opcode(bytes, opcode).expect("a whole CQE");
        });
    }

    pub fn req_err(&self, qpn: u32, wqe_counter: u16, syndrome: Syndrome) {
        self.push_error(ErrCqeRepr {
            opcode: CqeOpcode::ReqErr,
            syndrome,
            vendor_syndrome: 0x81,
            wqe_opcode: 0x08,
            qpn,
            wqe_counter,
        });
    }

    /// The consumer index the driver last wrote to the record.
    pub fn dbrec_ci(&self) -> u32 {
        // SAFETY: the record block is at least 4 bytes.
        let w = unsafe { (*(self.dbrec.as_ptr() as *const AtomicU32)).load(Ordering::Acquire) };
        u32::from_be(w)
    }
}

#[derive(Default)]
struct State {
    next: u64,
    qps: HashMap<u64, FakeQp>,
    cqs: HashMap<u64, FakeCq>,
    mrs: HashMap<u64, RawMr>,
    pds: u32,
}

/// The test provider.
pub struct FakeProvider {
    name: DeviceName,
    pool: MemoryPool,
    state: Mutex<State>,
    pub fail_destroy: AtomicBool,
    pub fail_modify: AtomicBool,
}

impl FakeProvider {
    pub fn new(pool: &MemoryPool) -> Arc<FakeProvider> {
        Arc::new(FakeProvider {
            name: "fabric:fake/0".parse().unwrap(),
            pool: pool.clone(),
            state: Mutex::new(State {
                next: 1,
                ..State::default()
            }),
            fail_destroy: AtomicBool::new(false),
            fail_modify: AtomicBool::new(false),
        })
    }

    pub fn qp(&self, qpn: u32) -> FakeQp {
        let s = self.state.lock().unwrap();
        s.qps
            .values()
            .find(|q| q.qpn == qpn)
            .cloned()
            .expect("no such QP")
    }

    pub fn cq(&self, index: usize) -> FakeCq {
        let s = self.state.lock().unwrap();
        let mut keys: Vec<_> = s.cqs.keys().copied().collect();
        keys.sort_unstable();
        s.cqs[&keys[index]].clone()
    }

    pub fn live_objects(&self) -> usize {
        let s = self.state.lock().unwrap();
        s.qps.len() + s.cqs.len() + s.mrs.len() + s.pds as usize
    }

    fn block(&self, len: usize) -> Arc<Block> {
        Arc::new(self.pool.alloc(len, 64).expect("pool"))
    }

    fn failed(&self, verb: &'static str) -> VerbsError {
        VerbsError::Failed {
            device: self.name.to_string(),
            verb,
            reason: "device is gone (test)".into(),
        }
    }
}

/// Forwards to a shared FakeProvider so the test keeps a handle to it.
pub struct Shared(pub Arc<FakeProvider>);

impl Provider for Shared {
    fn name(&self) -> &DeviceName {
        &self.0.name
    }
    fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        Ok(DeviceAttr {
            fw_ver: "fake".into(),
            max_qp_wr: 4096,
            max_sge: 16,
            max_cqe: 1 << 16,
            max_mr_size: u64::MAX,
            max_inline_data: 256,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_srq: 0,
            max_srq_wr: 0,
            max_srq_sge: 0,
        })
    }
    fn query_port(&self) -> Result<PortAttr, VerbsError> {
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu1024,
            gid_tbl_len: 1,
        })
    }
    fn query_gid(&self, _index: u16) -> Result<Gid, VerbsError> {
        Ok(Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 1)))
    }
    fn alloc_pd(&self) -> Result<Handle, VerbsError> {
        let mut s = self.0.state.lock().unwrap();
        s.pds += 1;
        s.next += 1;
        Ok(Handle(s.next))
    }
    fn dealloc_pd(&self, _pd: Handle) -> Result<(), VerbsError> {
        if self.0.fail_destroy.load(Ordering::Relaxed) {
            return Err(self.0.failed("dealloc_pd"));
        }
        self.0.state.lock().unwrap().pds -= 1;
        Ok(())
    }
    unsafe fn reg_mr(
        &self,
        _pd: Handle,
        _addr: *mut u8,
        _len: usize,
        _access: Access,
    ) -> Result<RawMr, VerbsError> {
        let mut s = self.0.state.lock().unwrap();
        s.next += 1;
        let n = s.next as u32;
        let mr = RawMr {
            handle: Handle(s.next),
            lkey: (n << 8) | 0x11,
            rkey: (n << 8) | 0x22,
        };
        let id = s.next;
        s.mrs.insert(id, mr);
        Ok(mr)
    }
    fn dereg_mr(&self, mr: Handle) -> Result<(), VerbsError> {
        if self.0.fail_destroy.load(Ordering::Relaxed) {
            return Err(self.0.failed("dereg_mr"));
        }
        self.0.state.lock().unwrap().mrs.remove(&mr.0);
        Ok(())
    }
    fn create_cq(&self, req: &CqRequest) -> Result<RawCq, VerbsError> {
        let count = req.entries.max(2).next_power_of_two();
        let ring = self.0.block(count as usize * 64);
        for i in 0..count as usize {
            // SAFETY: inside the ring: every CQE starts invalid (opcode 15), owner 0.
            unsafe { *ring.as_ptr().add(i * 64 + cqe::OP_OWN_OFFSET) = 0xf0 };
        }
        let dbrec = self.0.block(64);
        let mut s = self.0.state.lock().unwrap();
        s.next += 1;
        let handle = Handle(s.next);
        let id = s.next;
        s.cqs.insert(
            id,
            FakeCq {
                ring: ring.clone(),
                count,
                dbrec: dbrec.clone(),
                produced: Arc::new(AtomicU32::new(0)),
            },
        );
        Ok(RawCq {
            handle,
            cqn: s.next as u32,
            buf: NonNull::new(ring.as_ptr()).unwrap(),
            cqe_cnt: count,
            cqe_size: 64,
            dbrec: NonNull::new(dbrec.as_ptr().cast()).unwrap(),
            events: None,
        })
    }
    fn destroy_cq(&self, cq: Handle) -> Result<(), VerbsError> {
        if self.0.fail_destroy.load(Ordering::Relaxed) {
            return Err(self.0.failed("destroy_cq"));
        }
        self.0.state.lock().unwrap().cqs.remove(&cq.0);
        Ok(())
    }
    fn create_qp(&self, req: &QpRequest) -> Result<RawQp, VerbsError> {
        let caps = QpCaps { ..req.caps };
        let sq_bbs = (caps.max_send_wr.max(1) * 2).next_power_of_two();
        let rq_slots = caps.max_recv_wr.max(1).next_power_of_two();
        let rq_stride = (caps.max_recv_sge.max(1) * 16).next_power_of_two();
        let sq = self.0.block(sq_bbs as usize * 64);
        let rq = self.0.block((rq_slots * rq_stride) as usize);
        let dbrec = self.0.block(64);
        let doorbell = self.0.block(64);
        let mut s = self.0.state.lock().unwrap();
        s.next += 1;
        let qpn = 0x100 + s.next as u32;
        let id = s.next;
        s.qps.insert(
            id,
            FakeQp {
                qpn,
                sq: sq.clone(),
                sq_bbs,
                rq: rq.clone(),
                rq_stride,
                dbrec: dbrec.clone(),
                doorbell: doorbell.clone(),
                state: QpState::Reset,
            },
        );
        Ok(RawQp {
            handle: Handle(s.next),
            qpn,
            sq: RawWorkQueue {
                buf: NonNull::new(sq.as_ptr()).unwrap(),
                wqe_cnt: sq_bbs,
                stride: 64,
            },
            rq: RawWorkQueue {
                buf: NonNull::new(rq.as_ptr()).unwrap(),
                wqe_cnt: rq_slots,
                stride: rq_stride,
            },
            dbrec: NonNull::new(dbrec.as_ptr().cast()).unwrap(),
            // SAFETY: the 64-byte block outlives the QP (the fake keeps it until destroy and
            // the test's FakeQp clone keeps it after); plain doorbells only.
            doorbell: Doorbell::Mmio(unsafe {
                MmioDoorbell::new(
                    NonNull::new(doorbell.as_ptr()).unwrap(),
                    DoorbellMode::Plain,
                )
            }),
            caps,
        })
    }
    fn modify_qp(&self, qp: Handle, to: QpState, _attr: &QpAttr) -> Result<(), VerbsError> {
        if self.0.fail_modify.load(Ordering::Relaxed) {
            return Err(self.0.failed("modify_qp"));
        }
        let mut s = self.0.state.lock().unwrap();
        s.qps.get_mut(&qp.0).expect("qp").state = to;
        Ok(())
    }
    fn query_qp(&self, qp: Handle) -> Result<QpState, VerbsError> {
        Ok(self.0.state.lock().unwrap().qps[&qp.0].state)
    }
    fn destroy_qp(&self, qp: Handle) -> Result<(), VerbsError> {
        if self.0.fail_destroy.load(Ordering::Relaxed) {
            return Err(self.0.failed("destroy_qp"));
        }
        self.0.state.lock().unwrap().qps.remove(&qp.0);
        Ok(())
    }
}
