//! Translations between the pmd's verbs vocabulary and libibverbs' structs and errnos.

use std::os::raw::c_int;

use rdma_sys::{
    ibv_access_flags, ibv_device_attr, ibv_mtu, ibv_port_attr, ibv_port_state, ibv_qp_attr,
    ibv_qp_attr_mask, ibv_qp_state,
};

use crate::provider::VerbsError;
use crate::qp_state::QpState;
use crate::verbs::{Access, DeviceAttr, Mtu, PortAttr, PortState, QpAttr};

/// The largest inline payload the pmd accepts: a WQE has at most 63 units of 16 bytes, the
/// driver keeps 3 for the control, remote-address and atomic segments (`Qp::create`), and the
/// inline segment spends 4 bytes on its header. A ConnectX may grant less; `create_qp`
/// reports what it granted and refuses more with the device's error.
pub const MAX_INLINE_DATA: u32 = 60 * 16 - 4;

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

/// The pmd's device attributes of `ibv_device_attr`.
pub fn device_attr_from_ibv(d: &ibv_device_attr) -> DeviceAttr {
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
        max_inline_data: MAX_INLINE_DATA,
        max_qp_rd_atom: atom(d.max_qp_rd_atom),
        max_qp_init_rd_atom: atom(d.max_qp_init_rd_atom),
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

    #[test]
    fn the_inline_bound_is_the_largest_payload_of_sixty_units() {
        let units = |n: u32| hw_defs::mlx5::wqe::inline_ds(n as usize);
        assert_eq!(units(MAX_INLINE_DATA), 60);
        assert_eq!(units(MAX_INLINE_DATA + 1), 61);
    }
}
