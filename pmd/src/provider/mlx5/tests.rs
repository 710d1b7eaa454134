//! The datapath over memory laid out as `mlx5dv_init_obj` describes a ConnectX's: ordinary
//! buffers stand in for the rings, the doorbell records, the BlueFlame register and the UAR
//! page, and go through the same `shapes` functions the provider uses on hardware. The tests
//! then read what the driver wrote into the "register", and write CQEs as the device would.

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use hw_defs::mlx5::{cqe, CqeOpcode, CqeRepr, SendOpcode};

use super::dv::{mlx5dv_bf, mlx5dv_cq, mlx5dv_qp, mlx5dv_wq};
use super::shapes;
use crate::datapath::wr::{PostError, RecvWr, Remote, SendOp, SendWr, WcOpcode, WorkCompletion};
use crate::memory::{Block, HugepagePolicy, MemoryPool};
use crate::name::DeviceName;
use crate::provider::testing::{FakeCq, FakeProvider, Shared};
use crate::provider::{CqRequest, Handle, Provider, QpRequest, RawCq, RawMr, RawQp, VerbsError};
use crate::qp_state::QpState;
use crate::verbs::{Access, AddressVector, DeviceAttr, Gid, Mtu, PortAttr, QpAttr, QpCaps};
use crate::{Context, ContextConfig, Cq, Qp, RegisteredBuffer};

/// One QP's device memory.
struct QpMemory {
    sq: Arc<Block>,
    /// The BlueFlame register: two halves of `bf_size` bytes (64 bytes when there is none).
    bf: Arc<Block>,
    _rq: Arc<Block>,
    _dbrec: Arc<Block>,
}

struct State {
    next: u64,
    qps: HashMap<u32, QpMemory>,
    cqs: Vec<FakeCq>,
    _keep: Vec<Arc<Block>>,
}

/// A provider that hands the datapath memory described by made-up `mlx5dv_qp`/`mlx5dv_cq`.
struct DvMemory {
    name: DeviceName,
    pool: MemoryPool,
    bf_size: u32,
    register: shapes::RegisterUse,
    state: Mutex<State>,
}

impl DvMemory {
    fn new(pool: &MemoryPool, bf_size: u32, register: shapes::RegisterUse) -> Arc<DvMemory> {
        Arc::new(DvMemory {
            name: "mlx5:dressed_up".parse().unwrap(),
            pool: pool.clone(),
            bf_size,
            register,
            state: Mutex::new(State {
                next: 0,
                qps: HashMap::new(),
                cqs: Vec::new(),
                _keep: Vec::new(),
            }),
        })
    }

    fn block(&self, len: usize) -> Arc<Block> {
        Arc::new(self.pool.alloc(len, 64).unwrap())
    }

    fn next(&self) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.next += 1;
        s.next
    }

    /// The bytes of `qpn`'s BlueFlame register.
    fn register(&self, qpn: u32) -> Vec<u8> {
        let s = self.state.lock().unwrap();
        let bf = &s.qps[&qpn].bf;
        // SAFETY: the block is `len` bytes, alive while the state holds it.
        unsafe { std::slice::from_raw_parts(bf.as_ptr(), bf.len()) }.to_vec()
    }

    /// Basic block `i` of `qpn`'s send ring.
    fn sq_bb(&self, qpn: u32, i: usize) -> Vec<u8> {
        let s = self.state.lock().unwrap();
        // SAFETY: tests read basic blocks inside the ring.
        unsafe { std::slice::from_raw_parts(s.qps[&qpn].sq.as_ptr().add(i * 64), 64) }.to_vec()
    }

    fn cq(&self, i: usize) -> FakeCq {
        self.state.lock().unwrap().cqs[i].clone()
    }
}

/// The fake provider for everything but CQs and QPs, whose memory comes dressed up.
struct Dressed {
    fake: Shared,
    dev: Arc<DvMemory>,
}

impl Provider for Dressed {
    fn name(&self) -> &DeviceName {
        &self.dev.name
    }
    fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        self.fake.query_device()
    }
    fn query_port(&self) -> Result<PortAttr, VerbsError> {
        self.fake.query_port()
    }
    fn query_gid(&self, index: u16) -> Result<Gid, VerbsError> {
        self.fake.query_gid(index)
    }
    fn alloc_pd(&self) -> Result<Handle, VerbsError> {
        self.fake.alloc_pd()
    }
    fn dealloc_pd(&self, pd: Handle) -> Result<(), VerbsError> {
        self.fake.dealloc_pd(pd)
    }
    unsafe fn reg_mr(
        &self,
        pd: Handle,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RawMr, VerbsError> {
        // SAFETY: forwarded from this method's contract.
        unsafe { self.fake.reg_mr(pd, addr, len, access) }
    }
    fn dereg_mr(&self, mr: Handle) -> Result<(), VerbsError> {
        self.fake.dereg_mr(mr)
    }
    fn create_cq(&self, req: &CqRequest) -> Result<RawCq, VerbsError> {
        let count = (req.entries + 1).next_power_of_two();
        let ring = self.dev.block(count as usize * 64);
        for i in 0..count as usize {
            // SAFETY: inside the ring: every CQE starts invalid with owner 0, as libmlx5
            // initialises a CQ.
            unsafe { *ring.as_ptr().add(i * 64 + cqe::OP_OWN_OFFSET) = 0xf0 };
        }
        let dbrec = self.dev.block(64);
        let uar = self.dev.block(4096);
        let cqn = self.dev.next() as u32;
        let dv = mlx5dv_cq {
            buf: ring.as_ptr().cast(),
            dbrec: dbrec.as_ptr().cast(),
            cqe_cnt: count,
            cqe_size: 64,
            cq_uar: uar.as_ptr().cast(),
            cqn,
            comp_mask: 0,
        };
        let shape = shapes::cq_shape(&dv).unwrap();
        let mut s = self.dev.state.lock().unwrap();
        s.cqs.push(FakeCq {
            ring,
            count,
            dbrec,
            produced: Arc::new(AtomicU32::new(0)),
        });
        s._keep.push(uar);
        Ok(RawCq {
            handle: Handle(u64::from(cqn)),
            cqn,
            buf: shape.buf,
            cqe_cnt: shape.cqe_cnt,
            cqe_size: shape.cqe_size,
            dbrec: shape.dbrec,
            events: None,
        })
    }
    fn destroy_cq(&self, _cq: Handle) -> Result<(), VerbsError> {
        Ok(())
    }
    fn create_qp(&self, req: &QpRequest) -> Result<RawQp, VerbsError> {
        let (bbs, granted) = libmlx5_send_queue(req.caps);
        let slots = req.caps.max_recv_wr.next_power_of_two();
        let stride = (req.caps.max_recv_sge * 16).next_power_of_two();
        let sq = self.dev.block(bbs as usize * 64);
        let rq = self.dev.block((slots * stride) as usize);
        let dbrec = self.dev.block(64);
        let bf = self.dev.block((2 * self.dev.bf_size).max(64) as usize);
        let qpn = 0x100 + self.dev.next() as u32;
        let wq = |buf: &Arc<Block>, wqe_cnt, stride| mlx5dv_wq {
            buf: buf.as_ptr().cast(),
            wqe_cnt,
            stride,
        };
        // SAFETY: all-zero is a valid mlx5dv_qp; the members the shape reads are set below.
        let mut dv: mlx5dv_qp = unsafe { std::mem::zeroed() };
        dv.dbrec = dbrec.as_ptr().cast();
        dv.sq = wq(&sq, bbs, 64);
        dv.rq = wq(&rq, slots, stride);
        dv.bf = mlx5dv_bf {
            reg: bf.as_ptr().cast(),
            size: self.dev.bf_size,
        };
        // SAFETY: every block stays alive in the state as long as the provider; the register
        // block is two halves of `bf_size` bytes (or 64) and only this QP writes it.
        let shape = unsafe { shapes::qp_shape(&dv, self.dev.register) }.unwrap();
        self.dev.state.lock().unwrap().qps.insert(
            qpn,
            QpMemory {
                sq,
                bf,
                _rq: rq,
                _dbrec: dbrec,
            },
        );
        Ok(RawQp {
            handle: Handle(u64::from(qpn)),
            qpn,
            sq: shape.sq,
            rq: shape.rq,
            dbrec: shape.dbrec,
            doorbell: shape.doorbell,
            caps: granted,
        })
    }
    fn modify_qp(&self, _qp: Handle, _to: QpState, _attr: &QpAttr) -> Result<(), VerbsError> {
        Ok(())
    }
    fn query_qp(&self, _qp: Handle) -> Result<QpState, VerbsError> {
        Ok(QpState::Rts)
    }
    fn destroy_qp(&self, _qp: Handle) -> Result<(), VerbsError> {
        Ok(())
    }
}

/// The send ring and the granted caps libmlx5 gives an RC QP created with the pmd's send
/// operations named (`mlx5_calc_sq_size`): WQEs of 48 bytes of header plus the larger of the
/// gather list and the inline segment, rounded to basic blocks; a ring of `max_send_wr` such
/// WQEs rounded up to a power of two; `max_send_wr` granted as the WQEs that ring holds
/// (`sq.max_post`) and the inline size as what the WQE leaves for it.
fn libmlx5_send_queue(caps: QpCaps) -> (u32, QpCaps) {
    let header = 48;
    let gather = header + caps.max_send_sge * 16;
    let inline = if caps.max_inline_data == 0 {
        0
    } else {
        header + (4 + caps.max_inline_data).div_ceil(16) * 16
    };
    let wqe = gather.max(inline).div_ceil(64) * 64;
    let ring = (caps.max_send_wr * wqe).next_power_of_two();
    let granted = QpCaps {
        max_send_wr: ring / wqe,
        max_inline_data: wqe - header - 4,
        ..caps
    };
    (ring / 64, granted)
}

struct Rig {
    dev: Arc<DvMemory>,
    _ctx: Arc<Context>,
    cq: Cq,
    qp: Qp,
    buf: RegisteredBuffer,
}

fn connect(qp: &mut Qp) {
    qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
        .unwrap();
    let av = AddressVector::to_gid(Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 2)));
    qp.modify(QpState::Rtr, &QpAttr::rtr(av, 0x99, 0, Mtu::Mtu1024))
        .unwrap();
    qp.modify(QpState::Rts, &QpAttr::rts(0)).unwrap();
}

fn rig(bf_size: u32, dedicated: bool) -> Rig {
    rig_with(
        bf_size,
        shapes::RegisterUse {
            dedicated,
            blueflame: true,
        },
    )
}

fn rig_with(bf_size: u32, register: shapes::RegisterUse) -> Rig {
    let pool = MemoryPool::new(HugepagePolicy::Never);
    let dev = DvMemory::new(&pool, bf_size, register);
    let dressed = Dressed {
        fake: Shared(FakeProvider::new(&pool)),
        dev: dev.clone(),
    };
    let ctx = Context::with_provider(Box::new(dressed), pool, &ContextConfig::default());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, false).unwrap();
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 4,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 256,
    };
    let mut qp = pd.create_qp(&cq, &cq, caps).unwrap();
    connect(&mut qp);
    let buf = pd.alloc_buffer(4096, Access::ALL).unwrap();
    Rig {
        dev,
        _ctx: ctx,
        cq,
        qp,
        buf,
    }
}

fn remote() -> Remote {
    Remote {
        addr: 0x7000_0000,
        rkey: 0xabcd,
    }
}

fn send_inline(qp: &mut Qp, wr_id: u64, data: &[u8]) -> u16 {
    qp.post_send(&SendWr::inline(wr_id, SendOp::Send, data).signaled())
        .unwrap()
}

#[test]
fn a_one_block_wqe_is_copied_whole_into_the_blueflame_register_alternating_halves() {
    let mut r = rig(256, true);
    let qpn = r.qp.qpn();
    for (i, byte) in [0xa1u8, 0xb2, 0xc3].into_iter().enumerate() {
        send_inline(&mut r.qp, i as u64, &[byte; 16]);
        r.qp.ring_doorbell();
        // Doorbell i went to half i % 2: the whole basic block, byte for byte.
        let reg = r.dev.register(qpn);
        let half = &reg[(i % 2) * 256..][..64];
        assert_eq!(half, &r.dev.sq_bb(qpn, i)[..], "doorbell {i}");
    }
    // Nothing beyond one block was written into either half.
    let reg = r.dev.register(qpn);
    assert!(reg[64..256].iter().chain(&reg[256 + 64..]).all(|&b| b == 0));
}

#[test]
fn a_wqe_of_several_blocks_that_fits_a_half_is_copied_block_by_block() {
    let mut r = rig(256, true);
    let qpn = r.qp.qpn();
    // 16 control + 4 inline header + 100 bytes = 120 bytes: two basic blocks.
    send_inline(&mut r.qp, 1, &[0x5a; 100]);
    r.qp.ring_doorbell();
    let reg = r.dev.register(qpn);
    assert_eq!(&reg[..64], &r.dev.sq_bb(qpn, 0)[..]);
    assert_eq!(&reg[64..128], &r.dev.sq_bb(qpn, 1)[..]);
}

#[test]
fn a_batch_rings_the_plain_doorbell_of_its_last_wqe() {
    let mut r = rig(256, true);
    let qpn = r.qp.qpn();
    send_inline(&mut r.qp, 1, &[1; 8]);
    send_inline(&mut r.qp, 2, &[2; 8]);
    r.qp.ring_doorbell();
    let reg = r.dev.register(qpn);
    // First 8 bytes of the second WQE's control segment, nothing else.
    assert_eq!(&reg[..8], &r.dev.sq_bb(qpn, 1)[..8]);
    assert!(reg[8..].iter().all(|&b| b == 0));
}

#[test]
fn a_wqe_larger_than_a_blueflame_half_rings_the_plain_doorbell() {
    let mut r = rig(64, true);
    let qpn = r.qp.qpn();
    send_inline(&mut r.qp, 1, &[7; 100]);
    r.qp.ring_doorbell();
    let reg = r.dev.register(qpn);
    assert_eq!(&reg[..8], &r.dev.sq_bb(qpn, 0)[..8]);
    assert!(reg[8..].iter().all(|&b| b == 0));
}

#[test]
fn a_shared_register_gets_plain_doorbells_only() {
    let mut r = rig(256, false);
    let qpn = r.qp.qpn();
    for i in 0..2u64 {
        send_inline(&mut r.qp, i, &[9; 16]);
        r.qp.ring_doorbell();
        let reg = r.dev.register(qpn);
        // Always the first 8 bytes of the register: no BlueFlame, no half to alternate.
        assert_eq!(&reg[..8], &r.dev.sq_bb(qpn, i as usize)[..8]);
        assert!(reg[8..].iter().all(|&b| b == 0));
    }
}

#[test]
fn a_reset_qps_stale_cqes_are_cleaned_and_new_work_at_the_same_index_completes_once() {
    let mut r = rig(256, true);
    let sge = r.buf.sge(0, 8);
    let qpn = r.qp.qpn();
    let first =
        r.qp.post_send(&SendWr::new(1, SendOp::Send, &[sge]).signaled())
            .unwrap();
    r.qp.ring_doorbell();
    let cq = r.dev.cq(0);
    // The device completed it, but nobody polled before the failover layer reset the QP.
    cq.req(qpn, first, 8);
    r.qp.bring_up_again().unwrap();
    // New work lands at index 0 again. The stale CQE names that index, but must not
    // complete it: the device has not even fetched it.
    let again =
        r.qp.post_send(&SendWr::new(2, SendOp::Send, &[sge]).signaled())
            .unwrap();
    assert_eq!(again, first);
    r.qp.ring_doorbell();
    let mut wcs = [WorkCompletion::EMPTY; 4];
    assert_eq!(r.cq.poll(&mut wcs), 0);
    assert_eq!(r.cq.poller().stats().cleaned, 1);
    // Its own CQE completes it, once.
    cq.req(qpn, again, 8);
    assert_eq!(r.cq.poll(&mut wcs), 1);
    assert_eq!(wcs[0].wr_id, 2);
    assert_eq!(r.cq.poll(&mut wcs), 0);
    // The consumer index the device sees counts the cleaned slot as consumed.
    assert_eq!(cq.dbrec_ci(), 2);
}

#[test]
fn a_cq_shape_refuses_null_or_misaligned_memory() {
    #[repr(C, align(64))]
    struct Page([u8; 512]);
    let mut page = Page([0; 512]);
    let base = page.0.as_mut_ptr();
    let mut dv = mlx5dv_cq {
        buf: base.cast(),
        dbrec: base.cast(),
        cqe_cnt: 4,
        cqe_size: 64,
        cq_uar: std::ptr::null_mut(),
        cqn: 1,
        comp_mask: 0,
    };
    assert!(shapes::cq_shape(&dv)
        .unwrap_err()
        .contains("UAR page is NULL"));
    dv.cq_uar = base.cast();
    // One byte into the page: a misaligned pointer we only inspect.
    dv.dbrec = base.wrapping_add(1).cast();
    assert!(shapes::cq_shape(&dv)
        .unwrap_err()
        .contains("not 8-byte aligned"));
    dv.dbrec = base.cast();
    assert_eq!(shapes::cq_shape(&dv).unwrap().cqe_cnt, 4);
}

// ---- what a review of the provider found ----

#[test]
fn outstanding_work_requests_count_against_the_granted_max_send_wr_not_the_ring() {
    let mut r = rig(256, true);
    // 8 asked, 5-block WQEs (256 bytes inline): a ring of 64 blocks, 12 WQEs granted.
    let granted = r.qp.caps().max_send_wr;
    assert_eq!(granted, 12);
    assert_eq!(r.qp.send_queue().capacity(), 64);
    let sge = r.buf.sge(0, 8);
    let write = |id| SendWr::new(id, SendOp::Write { remote: remote() }, &[sge]);
    // One-block WQEs would fit 64 times in the ring; the QP takes what it was granted.
    let mut last = 0;
    for id in 0..u64::from(granted) {
        last = r.qp.post_send(&write(id)).unwrap();
    }
    let e = r.qp.post_send(&write(99)).unwrap_err();
    assert_eq!(
        e,
        PostError::QueueFull {
            queue: "send",
            outstanding: granted,
            capacity: granted,
            needed: 1
        }
    );
    // The batch path counts the same way.
    assert_eq!(r.qp.post_send_batch(&[write(99)]).unwrap_err().posted, 0);
    // A completion of the last (signaled or not, it retires everything before it) frees
    // them all.
    r.qp.ring_doorbell();
    r.dev.cq(0).req(r.qp.qpn(), last, 0);
    let mut wcs = [WorkCompletion::EMPTY; 4];
    assert_eq!(r.cq.poll(&mut wcs), 1);
    let wrs: Vec<SendWr<'_>> = (0..u64::from(granted)).map(write).collect();
    r.qp.post_send_batch(&wrs).unwrap();
}

#[test]
fn a_send_with_invalidate_completes_its_receive_like_a_send() {
    let mut r = rig(256, true);
    let qpn = r.qp.qpn();
    for id in [1, 2] {
        r.qp.post_recv(&RecvWr::new(id, &[r.buf.sge(0, 64)]))
            .unwrap();
    }
    let resp = |opcode, imm| CqeRepr {
        opcode,
        wqe_counter: 0,
        byte_count: 12,
        imm,
        qpn,
        solicited: false,
        timestamp: 0,
    };
    let cq = r.dev.cq(0);
    // SEND with invalidate: the immediate field holds the invalidated rkey.
    cq.push(resp(CqeOpcode::RespSendInv, 0xdead_beef));
    cq.push(resp(CqeOpcode::RespSend, 0));
    let mut wcs = [WorkCompletion::EMPTY; 4];
    assert_eq!(r.cq.poll(&mut wcs), 2);
    let got: Vec<_> = wcs[..2]
        .iter()
        .map(|w| (w.wr_id, w.opcode, w.imm, w.byte_len))
        .collect();
    assert_eq!(
        got,
        [(1, WcOpcode::Recv, None, 12), (2, WcOpcode::Recv, None, 12)]
    );
    assert_eq!(r.cq.poller().stats().stale, 0);
}

#[test]
fn requester_byte_len_is_set_for_read_and_atomics_only() {
    let mut r = rig(256, true);
    let qpn = r.qp.qpn();
    let sge = r.buf.sge(0, 8);
    let ops = [
        (SendOp::Write { remote: remote() }, SendOpcode::RdmaWrite, 0),
        (SendOp::Send, SendOpcode::Send, 0),
        (SendOp::Read { remote: remote() }, SendOpcode::RdmaRead, 64),
        (
            SendOp::FetchAdd {
                remote: remote(),
                add: 1,
            },
            SendOpcode::AtomicFa,
            8,
        ),
        (
            SendOp::CompareSwap {
                remote: remote(),
                compare: 0,
                swap: 1,
            },
            SendOpcode::AtomicCs,
            8,
        ),
    ];
    let cq = r.dev.cq(0);
    let mut wcs = [WorkCompletion::EMPTY; 1];
    for (i, (op, opcode, want)) in ops.into_iter().enumerate() {
        let idx =
            r.qp.post_send(&SendWr::new(i as u64, op, &[sge]).signaled())
                .unwrap();
        r.qp.ring_doorbell();
        // A ConnectX writes a byte count into every requester CQE; libmlx5 reports it only
        // for what brought data back.
        cq.req_op(qpn, idx, opcode, 64);
        assert_eq!(r.cq.poll(&mut wcs), 1);
        assert_eq!(wcs[0].byte_len, want, "{op:?}");
        assert_eq!(wcs[0].opcode, op.wc_opcode(), "{op:?}");
    }
}

#[test]
fn shut_up_bf_gives_plain_doorbells_only() {
    let mut r = rig_with(
        256,
        shapes::RegisterUse {
            dedicated: true,
            blueflame: false,
        },
    );
    let qpn = r.qp.qpn();
    for i in 0..2u64 {
        send_inline(&mut r.qp, i, &[3; 16]);
        r.qp.ring_doorbell();
        let reg = r.dev.register(qpn);
        // A one-block WQE alone would be a BlueFlame copy; here only its first 8 bytes, at
        // offset 0 every time.
        assert_eq!(&reg[..8], &r.dev.sq_bb(qpn, i as usize)[..8]);
        assert!(reg[8..].iter().all(|&b| b == 0));
    }
}

#[test]
fn the_doorbell_mode_follows_the_register_and_the_host() {
    use crate::datapath::doorbell::DoorbellMode;
    let use_ = |dedicated, blueflame| shapes::RegisterUse {
        dedicated,
        blueflame,
    };
    assert_eq!(
        shapes::doorbell_mode(256, use_(true, true)),
        Ok(DoorbellMode::BlueFlame { half: 256 })
    );
    for (dedicated, blueflame) in [(false, true), (true, false), (false, false)] {
        assert_eq!(
            shapes::doorbell_mode(256, use_(dedicated, blueflame)),
            Ok(DoorbellMode::Plain)
        );
    }
    assert_eq!(
        shapes::doorbell_mode(0, use_(true, true)),
        Ok(DoorbellMode::Plain)
    );
    assert!(shapes::doorbell_mode(100, use_(true, true))
        .unwrap_err()
        .contains("not whole basic blocks"));
}
