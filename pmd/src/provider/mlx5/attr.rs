//! Translations between the pmd's verbs vocabulary and libibverbs' structs and errnos.

use std::os::raw::c_int;

use rdma_sys::{
    ibv_access_flags, ibv_cq, ibv_device_attr, ibv_mtu, ibv_pd, ibv_port_attr, ibv_port_state,
    ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_create_send_ops_flags, ibv_qp_init_attr_ex,
    ibv_qp_init_attr_mask, ibv_qp_state, ibv_qp_type,
};

use super::dv;
use crate::provider::VerbsError;
use crate::qp_state::QpState;
use crate::verbs::{Access, DeviceAttr, Mtu, PortAttr, PortState, QpAttr, QpCaps};

/// The largest inline payload the pmd's WQE layout allows: a WQE has at most 63 units of 16
/// bytes, the driver keeps 3 for the control, remote-address and atomic segments
/// (`Qp::create`), and the inline segment spends 4 bytes on its header. What a ConnectX grants
/// is less (its largest send WQE is smaller than 63 units): the provider reports the granted
/// size ([`largest_granted_inline`]), never this bound.
pub const MAX_INLINE_DATA: u32 = 60 * 16 - 4;

/// The operations the pmd posts, as `IBV_QP_EX_WITH_*` flags. Naming them at creation
/// (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`) lets libmlx5 size WQEs for them alone: without it, it
/// sizes every WQE for memory-window binds and local invalidates (a 192-byte UMR header), and
/// a one-entry QP's WQEs take 4 basic blocks instead of 1, its ring 4-5 times the memory, for
/// the same granted `max_send_wr`.
pub const SEND_OPS: u64 = {
    use ibv_qp_create_send_ops_flags as F;
    (F::IBV_QP_EX_WITH_RDMA_WRITE.0
        | F::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM.0
        | F::IBV_QP_EX_WITH_SEND.0
        | F::IBV_QP_EX_WITH_SEND_WITH_IMM.0
        | F::IBV_QP_EX_WITH_RDMA_READ.0
        | F::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP.0
        | F::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD.0) as u64
};

/// The attributes of an RC QP of `caps` on `send_cq`/`recv_cq` in `pd` (a parent domain when
/// the QP has a thread domain): the pmd's operations named ([`SEND_OPS`]), no `sq_sig_all`.
pub fn qp_init_attr(
    caps: QpCaps,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    pd: *mut ibv_pd,
) -> ibv_qp_init_attr_ex {
    // SAFETY: all-zero is a valid ibv_qp_init_attr_ex (null pointers, zero masks); we set
    // what an RC QP needs.
    let mut init: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    init.qp_type = ibv_qp_type::IBV_QPT_RC;
    init.send_cq = send_cq;
    init.recv_cq = recv_cq;
    init.cap.max_send_wr = caps.max_send_wr;
    init.cap.max_recv_wr = caps.max_recv_wr;
    init.cap.max_send_sge = caps.max_send_sge;
    init.cap.max_recv_sge = caps.max_recv_sge;
    init.cap.max_inline_data = caps.max_inline_data;
    init.sq_sig_all = 0;
    init.comp_mask = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0
        | ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
    init.pd = pd;
    init.send_ops_flags = SEND_OPS;
    init
}

/// The pmd drives RoCE: a port whose link layer is not Ethernet (InfiniBand, or unspecified,
/// which old kernels report for InfiniBand) has no RoCE v2 GIDs and would need LID routing the
/// pmd does not do. `link_layer` is `ibv_port_attr.link_layer`.
pub fn check_link_layer(device: &str, link_layer: u8) -> Result<(), VerbsError> {
    if link_layer == dv::IBV_LINK_LAYER_ETHERNET {
        return Ok(());
    }
    let what = match link_layer {
        dv::IBV_LINK_LAYER_INFINIBAND => "an InfiniBand port".to_string(),
        dv::IBV_LINK_LAYER_UNSPECIFIED => "a port of unspecified (InfiniBand) link layer".into(),
        other => format!("a port of link layer {other}"),
    };
    Err(VerbsError::Unsupported {
        device: device.to_string(),
        verb: "open_device",
        what: format!(
            "port 1 is {what}; railshift drives RoCE (Ethernet link layer) only: set the \
             port to Ethernet (mlxconfig LINK_TYPE_P1=2) or use a RoCE NIC"
        ),
    })
}

/// The largest inline payload a device grants, capped at `limit`: the largest request in
/// `0..=limit` that `try_grant` accepts, by bisection (`try_grant(n)` creates a QP asking for
/// `n` bytes and returns what the device granted, which rounds up to whole basic blocks, or
/// `None` if it refused), then what the device granted for it. 0 when even 0 is refused.
pub fn largest_granted_inline(limit: u32, mut try_grant: impl FnMut(u32) -> Option<u32>) -> u32 {
    let Some(mut granted) = try_grant(0) else {
        return 0;
    };
    // Requests up to `lo` are granted; none above `hi` is.
    let (mut lo, mut hi) = (0, limit);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        match try_grant(mid) {
            Some(g) => {
                lo = mid;
                granted = g;
            }
            None => hi = mid - 1,
        }
    }
    granted.min(limit)
}

/// A verbs call that failed with `errno`, as the pmd's error.
pub fn verbs_error(device: &str, verb: &'static str, errno: std::io::Error) -> VerbsError {
    let device = device.to_string();
    let what = format!("{errno}");
    match errno.raw_os_error() {
        Some(libc::ENOMEM) | Some(libc::ENOSPC) | Some(libc::EAGAIN) => {
            VerbsError::OutOfResources { device, verb, what }
        }
        Some(libc::EINVAL) | Some(libc::ERANGE) => {
            VerbsError::InvalidArgument { device, verb, what }
        }
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
            VerbsError::Unsupported { device, verb, what }
        }
        _ => VerbsError::Failed {
            device,
            verb,
            reason: what,
        },
    }
}

/// A verbs call that returned an errno directly (the `int` return of `ibv_modify_qp` and its
/// kind), as the pmd's error.
pub fn rc_error(device: &str, verb: &'static str, rc: c_int) -> VerbsError {
    let errno = if rc > 0 {
        std::io::Error::from_raw_os_error(rc)
    } else {
        std::io::Error::last_os_error()
    };
    verbs_error(device, verb, errno)
}

/// `enum ibv_access_flags` bits of `access`.
pub fn access_to_ibv(access: Access) -> u32 {
    let mut bits = 0;
    for (ours, theirs) in [
        (
            Access::LOCAL_WRITE,
            ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
        ),
        (
            Access::REMOTE_WRITE,
            ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
        ),
        (
            Access::REMOTE_READ,
            ibv_access_flags::IBV_ACCESS_REMOTE_READ,
        ),
        (
            Access::REMOTE_ATOMIC,
            ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC,
        ),
    ] {
        if access.contains(ours) {
            bits |= theirs.0;
        }
    }
    bits
}

fn mtu_to_ibv(mtu: Mtu) -> ibv_mtu::Type {
    match mtu {
        Mtu::Mtu256 => ibv_mtu::IBV_MTU_256,
        Mtu::Mtu512 => ibv_mtu::IBV_MTU_512,
        Mtu::Mtu1024 => ibv_mtu::IBV_MTU_1024,
        Mtu::Mtu2048 => ibv_mtu::IBV_MTU_2048,
        Mtu::Mtu4096 => ibv_mtu::IBV_MTU_4096,
    }
}

fn mtu_from_ibv(mtu: ibv_mtu::Type) -> Option<Mtu> {
    Some(match mtu {
        ibv_mtu::IBV_MTU_256 => Mtu::Mtu256,
        ibv_mtu::IBV_MTU_512 => Mtu::Mtu512,
        ibv_mtu::IBV_MTU_1024 => Mtu::Mtu1024,
        ibv_mtu::IBV_MTU_2048 => Mtu::Mtu2048,
        ibv_mtu::IBV_MTU_4096 => Mtu::Mtu4096,
        _ => return None,
    })
}

fn state_to_ibv(state: QpState) -> ibv_qp_state::Type {
    match state {
        QpState::Reset => ibv_qp_state::IBV_QPS_RESET,
        QpState::Init => ibv_qp_state::IBV_QPS_INIT,
        QpState::Rtr => ibv_qp_state::IBV_QPS_RTR,
        QpState::Rts => ibv_qp_state::IBV_QPS_RTS,
        QpState::Err => ibv_qp_state::IBV_QPS_ERR,
    }
}

/// The pmd state of an `ibv_qp_state`. SQE (send queue error, which RC QPs reach on a failed
/// send when the device keeps receiving) is an error state for the driver; SQD and UNKNOWN
/// are states the driver never asks for and cannot drive, so they are errors.
pub fn state_from_ibv(state: ibv_qp_state::Type) -> Result<QpState, String> {
    match state {
        ibv_qp_state::IBV_QPS_SQE => Ok(QpState::Err),
        s => u8::try_from(s)
            .ok()
            .and_then(QpState::from_ibv)
            .ok_or_else(|| format!("the device reports QP state {s}, which the pmd does not use")),
    }
}

/// `ibv_qp_attr` and its attribute mask for a move to `to` with `attr`. `sgid_index` maps the
/// pmd's GID index to the device's (see `GidMap`).
pub fn qp_attr_to_ibv(
    to: QpState,
    attr: &QpAttr,
    sgid_index: impl Fn(u8) -> u8,
) -> (ibv_qp_attr, c_int) {
    // SAFETY: ibv_qp_attr is a plain C struct of integers (and an ah_attr of integers and a
    // byte union); all-zero is a valid value, the one libibverbs users start from.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    let mut mask = ibv_qp_attr_mask::IBV_QP_STATE.0;
    a.qp_state = state_to_ibv(to);
    let mut set = |bit: ibv_qp_attr_mask| mask |= bit.0;
    if let Some(access) = attr.access {
        a.qp_access_flags = access_to_ibv(access);
        set(ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS);
    }
    if let Some(pkey_index) = attr.pkey_index {
        a.pkey_index = pkey_index;
        set(ibv_qp_attr_mask::IBV_QP_PKEY_INDEX);
    }
    if let Some(port) = attr.port {
        a.port_num = port;
        set(ibv_qp_attr_mask::IBV_QP_PORT);
    }
    if let Some(av) = attr.av {
        // RoCE: always global (a GRH carries the GIDs), no LID, service level 0.
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = attr.port.unwrap_or(1);
        a.ah_attr.grh.dgid.raw = av.dgid.0;
        a.ah_attr.grh.sgid_index = sgid_index(av.sgid_index);
        a.ah_attr.grh.hop_limit = av.hop_limit;
        a.ah_attr.grh.traffic_class = av.traffic_class;
        set(ibv_qp_attr_mask::IBV_QP_AV);
    }
    if let Some(mtu) = attr.path_mtu {
        a.path_mtu = mtu_to_ibv(mtu);
        set(ibv_qp_attr_mask::IBV_QP_PATH_MTU);
    }
    if let Some(qpn) = attr.dest_qpn {
        a.dest_qp_num = qpn;
        set(ibv_qp_attr_mask::IBV_QP_DEST_QPN);
    }
    if let Some(psn) = attr.rq_psn {
        a.rq_psn = psn;
        set(ibv_qp_attr_mask::IBV_QP_RQ_PSN);
    }
    if let Some(n) = attr.max_dest_rd_atomic {
        a.max_dest_rd_atomic = n;
        set(ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC);
    }
    if let Some(t) = attr.min_rnr_timer {
        a.min_rnr_timer = t;
        set(ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER);
    }
    if let Some(psn) = attr.sq_psn {
        a.sq_psn = psn;
        set(ibv_qp_attr_mask::IBV_QP_SQ_PSN);
    }
    if let Some(t) = attr.timeout {
        a.timeout = t;
        set(ibv_qp_attr_mask::IBV_QP_TIMEOUT);
    }
    if let Some(n) = attr.retry_cnt {
        a.retry_cnt = n;
        set(ibv_qp_attr_mask::IBV_QP_RETRY_CNT);
    }
    if let Some(n) = attr.rnr_retry {
        a.rnr_retry = n;
        set(ibv_qp_attr_mask::IBV_QP_RNR_RETRY);
    }
    if let Some(n) = attr.max_rd_atomic {
        a.max_rd_atomic = n;
        set(ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC);
    }
    (a, mask as c_int)
}

/// The pmd's port attributes of `ibv_port_attr`.
pub fn port_attr_from_ibv(p: &ibv_port_attr) -> Result<PortAttr, String> {
    let state = match p.state {
        ibv_port_state::IBV_PORT_INIT => PortState::Init,
        ibv_port_state::IBV_PORT_ARMED => PortState::Armed,
        ibv_port_state::IBV_PORT_ACTIVE | ibv_port_state::IBV_PORT_ACTIVE_DEFER => {
            PortState::Active
        }
        // DOWN and NOP (no state yet): not forwarding.
        _ => PortState::Down,
    };
    let mtu = |m| mtu_from_ibv(m).ok_or_else(|| format!("port reports MTU code {m}"));
    Ok(PortAttr {
        state,
        max_mtu: mtu(p.max_mtu)?,
        active_mtu: mtu(p.active_mtu)?,
        gid_tbl_len: u16::try_from(p.gid_tbl_len).unwrap_or(u16::MAX),
    })
}

/// The pmd's device attributes of `ibv_device_attr`, with the inline size the device grants
/// (`max_inline_data`, see [`largest_granted_inline`]).
pub fn device_attr_from_ibv(d: &ibv_device_attr, max_inline_data: u32) -> DeviceAttr {
    let fw: Vec<u8> = d
        .fw_ver
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let count = |n: c_int| u32::try_from(n).unwrap_or(0);
    let atom = |n: c_int| u8::try_from(n).unwrap_or(u8::MAX);
    DeviceAttr {
        fw_ver: String::from_utf8_lossy(&fw).into_owned(),
        max_qp_wr: count(d.max_qp_wr),
        max_sge: count(d.max_sge),
        max_cqe: count(d.max_cqe),
        max_mr_size: d.max_mr_size,
        max_inline_data,
        max_qp_rd_atom: atom(d.max_qp_rd_atom),
        max_qp_init_rd_atom: atom(d.max_qp_init_rd_atom),
        // The mlx5 provider makes no SRQs (it refuses them), whatever the device could.
        max_srq: 0,
        max_srq_wr: 0,
        max_srq_sge: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{AddressVector, Gid};
    use std::net::Ipv4Addr;

    fn has(mask: c_int, bit: ibv_qp_attr_mask) -> bool {
        mask as u32 & bit.0 != 0
    }

    #[test]
    fn access_bits_are_libibverbs_bits() {
        assert_eq!(access_to_ibv(Access::NONE), 0);
        assert_eq!(access_to_ibv(Access::ALL), Access::ALL.bits());
        assert_eq!(
            access_to_ibv(Access::REMOTE_READ | Access::LOCAL_WRITE),
            ibv_access_flags::IBV_ACCESS_REMOTE_READ.0 | ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
        );
    }

    #[test]
    fn rtr_attributes_become_a_global_route_and_their_mask_bits() {
        let dgid = Gid::from(Ipv4Addr::new(198, 18, 0, 2));
        let attr = QpAttr::rtr(AddressVector::to_gid(dgid), 0x123, 77, Mtu::Mtu1024);
        let (a, mask) = qp_attr_to_ibv(QpState::Rtr, &attr, |i| i + 3);
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_RTR);
        assert_eq!((a.dest_qp_num, a.rq_psn), (0x123, 77));
        assert_eq!(a.path_mtu, ibv_mtu::IBV_MTU_1024);
        assert_eq!((a.ah_attr.is_global, a.ah_attr.port_num), (1, 1));
        // SAFETY: the GID was written as bytes.
        assert_eq!(unsafe { a.ah_attr.grh.dgid.raw }, dgid.0);
        assert_eq!(a.ah_attr.grh.sgid_index, 3, "the GID map was applied");
        assert_eq!(a.ah_attr.grh.hop_limit, 64);
        for bit in [
            ibv_qp_attr_mask::IBV_QP_STATE,
            ibv_qp_attr_mask::IBV_QP_AV,
            ibv_qp_attr_mask::IBV_QP_PATH_MTU,
            ibv_qp_attr_mask::IBV_QP_DEST_QPN,
            ibv_qp_attr_mask::IBV_QP_RQ_PSN,
            ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC,
            ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER,
        ] {
            assert!(has(mask, bit), "bit {:#x} missing", bit.0);
        }
        assert!(!has(mask, ibv_qp_attr_mask::IBV_QP_SQ_PSN));
        assert!(!has(mask, ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS));
    }

    #[test]
    fn every_given_attribute_sets_exactly_one_mask_bit() {
        let init = qp_attr_to_ibv(QpState::Init, &QpAttr::init(Access::ALL), |i| i).1;
        let rts = qp_attr_to_ibv(QpState::Rts, &QpAttr::rts(5), |i| i).1;
        let reset = qp_attr_to_ibv(QpState::Reset, &QpAttr::default(), |i| i).1;
        assert_eq!(reset, ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int);
        assert_eq!((init as u32).count_ones(), 1 + 3);
        assert_eq!((rts as u32).count_ones(), 1 + 5);
    }

    #[test]
    fn sqe_is_an_error_state_and_sqd_is_refused() {
        assert_eq!(
            state_from_ibv(ibv_qp_state::IBV_QPS_RTS).unwrap(),
            QpState::Rts
        );
        assert_eq!(
            state_from_ibv(ibv_qp_state::IBV_QPS_SQE).unwrap(),
            QpState::Err
        );
        assert!(state_from_ibv(ibv_qp_state::IBV_QPS_SQD)
            .unwrap_err()
            .contains("state 4"));
    }

    #[test]
    fn errnos_become_typed_errors() {
        let e = |n| rc_error("mlx5:mlx5_0", "ibv_create_qp", n);
        assert!(matches!(e(libc::ENOMEM), VerbsError::OutOfResources { .. }));
        assert!(matches!(
            e(libc::EINVAL),
            VerbsError::InvalidArgument { .. }
        ));
        assert!(matches!(
            e(libc::EOPNOTSUPP),
            VerbsError::Unsupported { .. }
        ));
        let text = e(libc::EIO).to_string();
        assert!(
            text.contains("ibv_create_qp on mlx5:mlx5_0 failed"),
            "{text}"
        );
    }

    /// A ConnectX as libmlx5 sizes its send WQEs (`mlx5_calc_send_wqe`): the pmd's operations
    /// cost 48 bytes of header, one data segment 16, an inline segment 4 bytes plus the
    /// payload rounded to 16; a WQE may not exceed `max_sq_desc_sz`; the granted inline size
    /// is the WQE rounded to basic blocks, less the header and the inline segment's 4.
    fn connectx(max_sq_desc_sz: u32) -> impl FnMut(u32) -> Option<u32> {
        move |inline: u32| {
            let header = 48;
            let gather = header + 16;
            let inl = if inline == 0 {
                0
            } else {
                header + (4 + inline).div_ceil(16) * 16
            };
            let total = gather.max(inl);
            (total <= max_sq_desc_sz).then(|| total.div_ceil(64) * 64 - header - 4)
        }
    }

    #[test]
    fn the_granted_inline_size_is_what_the_device_grants_not_the_layouts_bound() {
        // A ConnectX-5 (512-byte send WQEs): 460 bytes, not 956.
        assert_eq!(largest_granted_inline(MAX_INLINE_DATA, connectx(512)), 460);
        // A larger WQE than the layout's bound: the bound.
        assert_eq!(
            largest_granted_inline(MAX_INLINE_DATA, connectx(1024)),
            MAX_INLINE_DATA
        );
        // A device that refuses everything grants nothing.
        assert_eq!(largest_granted_inline(MAX_INLINE_DATA, |_| None), 0);
        // Never more than it would grant for the largest request it takes.
        let mut asked = Vec::new();
        let mut dev = connectx(512);
        largest_granted_inline(MAX_INLINE_DATA, |n| {
            asked.push(n);
            dev(n)
        });
        assert!(asked.len() <= 12, "bisection, not a scan: {asked:?}");
    }

    #[test]
    fn qps_are_created_naming_only_the_operations_the_pmd_posts() {
        use ibv_qp_create_send_ops_flags as F;
        let caps = QpCaps::default();
        let a = qp_init_attr(
            caps,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let mask = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
        assert_eq!(a.comp_mask & mask, mask);
        assert_eq!(a.qp_type, ibv_qp_type::IBV_QPT_RC);
        assert_eq!(a.cap.max_send_wr, caps.max_send_wr);
        let want = [
            F::IBV_QP_EX_WITH_RDMA_WRITE,
            F::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
            F::IBV_QP_EX_WITH_SEND,
            F::IBV_QP_EX_WITH_SEND_WITH_IMM,
            F::IBV_QP_EX_WITH_RDMA_READ,
            F::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
            F::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        ];
        assert_eq!(
            a.send_ops_flags,
            want.iter().fold(0u64, |m, f| m | u64::from(f.0))
        );
        // None of what makes libmlx5 reserve a UMR header in every WQE.
        for f in [
            F::IBV_QP_EX_WITH_LOCAL_INV,
            F::IBV_QP_EX_WITH_BIND_MW,
            F::IBV_QP_EX_WITH_SEND_WITH_INV,
            F::IBV_QP_EX_WITH_TSO,
        ] {
            assert_eq!(a.send_ops_flags & u64::from(f.0), 0, "{:#x}", f.0);
        }
    }

    #[test]
    fn only_ethernet_ports_open() {
        assert!(check_link_layer("mlx5:mlx5_0", dv::IBV_LINK_LAYER_ETHERNET).is_ok());
        for (ll, says) in [
            (dv::IBV_LINK_LAYER_INFINIBAND, "InfiniBand port"),
            (dv::IBV_LINK_LAYER_UNSPECIFIED, "unspecified"),
            (7, "link layer 7"),
        ] {
            let e = check_link_layer("mlx5:mlx5_0", ll).unwrap_err();
            assert!(matches!(e, VerbsError::Unsupported { .. }), "{e}");
            let text = e.to_string();
            assert!(text.contains(says), "{text}");
            assert!(text.contains("RoCE (Ethernet link layer) only"), "{text}");
            assert!(text.contains("mlx5:mlx5_0"), "{text}");
        }
    }

    #[test]
    fn the_inline_bound_is_the_largest_payload_of_sixty_units() {
        let units = |n: u32| hw_defs::mlx5::wqe::inline_ds(n as usize);
        assert_eq!(units(MAX_INLINE_DATA), 60);
        assert_eq!(units(MAX_INLINE_DATA + 1), 61);
    }
}
