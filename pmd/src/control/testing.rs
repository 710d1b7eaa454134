//! A connected QP over the fake provider, for the tests of the control objects and of the
//! datapath: the test reads the WQEs the driver wrote and writes the CQEs it polls.

use std::sync::Arc;

use hw_defs::mlx5::{CtrlSeg, CtrlSegRepr};

use super::{Context, ContextConfig, Cq, Pd, Qp, RegisteredBuffer};
use crate::datapath::wr::Remote;
use crate::memory::{HugepagePolicy, MemoryPool};
use crate::provider::testing::{FakeProvider, Shared};
use crate::qp_state::QpState;
use crate::verbs::{Access, AddressVector, Gid, Mtu, QpAttr, QpCaps};

/// A device, a PD, one CQ, a QP in RTS and an 8 KiB registered buffer.
pub(crate) struct Rig {
    pub(crate) fake: Arc<FakeProvider>,
    pub(crate) ctx: Arc<Context>,
    pub(crate) pd: Arc<Pd>,
    pub(crate) cq: Cq,
    pub(crate) qp: Qp,
    pub(crate) buf: RegisteredBuffer,
}

/// The rig's QP capabilities: 8 sends, 4 receives, 64 bytes inline.
pub(crate) fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 8,
        max_recv_wr: 4,
        max_send_sge: 4,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

/// Brings `qp` up to RTS toward a made-up peer.
pub(crate) fn connect(qp: &mut Qp) {
    qp.modify(QpState::Init, &QpAttr::init(Access::ALL))
        .unwrap();
    let av = AddressVector::to_gid(Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 2)));
    qp.modify(QpState::Rtr, &QpAttr::rtr(av, 0x99, 100, Mtu::Mtu1024))
        .unwrap();
    qp.modify(QpState::Rts, &QpAttr::rts(200)).unwrap();
}

/// A rig whose QP has `caps`.
pub(crate) fn rig_with(caps: QpCaps) -> Rig {
    let pool = MemoryPool::new(HugepagePolicy::Never);
    let fake = FakeProvider::new(&pool);
    let ctx = Context::with_provider(
        Box::new(Shared(fake.clone())),
        pool,
        &ContextConfig::default(),
    );
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, false).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, caps).unwrap();
    connect(&mut qp);
    let buf = pd.alloc_buffer(8192, Access::ALL).unwrap();
    Rig {
        fake,
        ctx,
        pd,
        cq,
        qp,
        buf,
    }
}

/// A rig with [`caps`].
pub(crate) fn rig() -> Rig {
    rig_with(caps())
}

/// A remote address and rkey for the WQEs the tests post.
pub(crate) fn remote() -> Remote {
    Remote {
        addr: 0x7000_0000,
        rkey: 0xabcd,
    }
}

/// The control segment at the start of basic block `bb`.
pub(crate) fn ctrl_of(bb: &[u8]) -> CtrlSegRepr {
    CtrlSegRepr::parse(&CtrlSeg::new_checked(&bb[..16]).unwrap()).unwrap()
}
