//! Our mlx5 layouts as a table of C names, offsets, sizes and constants, taken from the same
//! `field` ranges and enums the views use. The `rdma-core-check` test compiles a C program
//! against `infiniband/mlx5dv.h` and compares every entry, so a wrong offset here is a wrong
//! offset in the views, and the check catches both.

use core::ops::Range;

use super::{
    atomic_seg, cqe, ctrl_seg, data_seg, datagram_seg, dbrec, err_cqe, inline_seg, raddr_seg,
    srq_wqe, wqe,
};
use crate::verbs::WcStatus;

/// One field of a mirrored C struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldLayout {
    /// The member name in `mlx5dv.h`.
    pub name: &'static str,
    /// Its byte offset.
    pub offset: usize,
    /// Its width in bytes.
    pub size: usize,
}

/// One mirrored C struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StructLayout {
    /// The struct tag in `mlx5dv.h` (`struct <c_name>`).
    pub c_name: &'static str,
    /// Its size in bytes.
    pub size: usize,
    /// The fields we read or write.
    pub fields: &'static [FieldLayout],
}

const fn range(name: &'static str, r: Range<usize>) -> FieldLayout {
    FieldLayout {
        name,
        offset: r.start,
        size: r.end - r.start,
    }
}

const fn byte(name: &'static str, offset: usize) -> FieldLayout {
    FieldLayout {
        name,
        offset,
        size: 1,
    }
}

/// Every struct this crate mirrors.
pub const STRUCTS: &[StructLayout] = &[
    StructLayout {
        c_name: "mlx5_wqe_ctrl_seg",
        size: ctrl_seg::SIZE,
        fields: &[
            range("opmod_idx_opcode", ctrl_seg::field::OPMOD_IDX_OPCODE),
            range("qpn_ds", ctrl_seg::field::QPN_DS),
            byte("signature", ctrl_seg::field::SIGNATURE),
            range(
                "dci_stream_channel_id",
                ctrl_seg::field::DCI_STREAM_CHANNEL_ID,
            ),
            byte("fm_ce_se", ctrl_seg::field::FM_CE_SE),
            range("imm", ctrl_seg::field::IMM),
        ],
    },
    StructLayout {
        c_name: "mlx5_wqe_raddr_seg",
        size: raddr_seg::SIZE,
        fields: &[
            range("raddr", raddr_seg::field::RADDR),
            range("rkey", raddr_seg::field::RKEY),
            range("reserved", raddr_seg::field::RESERVED),
        ],
    },
    StructLayout {
        c_name: "mlx5_wqe_datagram_seg",
        size: datagram_seg::SIZE,
        fields: &[
            range("av.key.qkey.qkey", datagram_seg::field::QKEY),
            range("av.key.qkey.reserved", datagram_seg::field::QKEY_RESERVED),
            range("av.dqp_dct", datagram_seg::field::DQP_DCT),
            byte("av.stat_rate_sl", datagram_seg::field::STAT_RATE_SL),
            byte("av.fl_mlid", datagram_seg::field::FL_MLID),
            range("av.rlid", datagram_seg::field::RLID),
            range("av.reserved0", datagram_seg::field::RESERVED0),
            range("av.rmac", datagram_seg::field::RMAC),
            byte("av.tclass", datagram_seg::field::TCLASS),
            byte("av.hop_limit", datagram_seg::field::HOP_LIMIT),
            range("av.grh_gid_fl", datagram_seg::field::GRH_GID_FL),
            range("av.rgid", datagram_seg::field::RGID),
        ],
    },
    StructLayout {
        c_name: "mlx5_wqe_atomic_seg",
        size: atomic_seg::SIZE,
        fields: &[
            range("swap_add", atomic_seg::field::SWAP_ADD),
            range("compare", atomic_seg::field::COMPARE),
        ],
    },
    StructLayout {
        c_name: "mlx5_wqe_data_seg",
        size: data_seg::SIZE,
        fields: &[
            range("byte_count", data_seg::field::BYTE_COUNT),
            range("lkey", data_seg::field::LKEY),
            range("addr", data_seg::field::ADDR),
        ],
    },
    StructLayout {
        c_name: "mlx5_wqe_srq_next_seg",
        size: srq_wqe::NEXT_SEG_SIZE,
        fields: &[
            range("next_wqe_index", srq_wqe::field::NEXT_WQE_INDEX),
            byte("signature", srq_wqe::field::SIGNATURE),
        ],
    },
    StructLayout {
        c_name: "mlx5_wqe_inl_data_seg",
        size: inline_seg::HEADER_SIZE,
        fields: &[range("byte_count", inline_seg::field::BYTE_COUNT)],
    },
    StructLayout {
        c_name: "mlx5_cqe64",
        size: cqe::SIZE,
        fields: &[
            range("wqe_id", cqe::field::WQE_ID),
            byte("ml_path", cqe::field::ML_PATH),
            range("slid", cqe::field::SLID),
            range("flags_rqpn", cqe::field::FLAGS_RQPN),
            byte("hds_ip_ext", cqe::field::HDS_IP_EXT),
            byte("l4_hdr_type_etc", cqe::field::L4_HDR_TYPE_ETC),
            range("vlan_info", cqe::field::VLAN_INFO),
            range("srqn_uidx", cqe::field::SRQN_UIDX),
            range("imm_inval_pkey", cqe::field::IMM_INVAL_PKEY),
            byte("app", cqe::field::APP),
            byte("app_op", cqe::field::APP_OP),
            range("app_info", cqe::field::APP_INFO),
            range("byte_cnt", cqe::field::BYTE_CNT),
            range("timestamp", cqe::field::TIMESTAMP),
            range("sop_drop_qpn", cqe::field::SOP_DROP_QPN),
            range("wqe_counter", cqe::field::WQE_COUNTER),
            byte("signature", cqe::field::SIGNATURE),
            byte("op_own", cqe::field::OP_OWN),
        ],
    },
    StructLayout {
        c_name: "mlx5_err_cqe",
        size: err_cqe::SIZE,
        fields: &[
            range("srqn", err_cqe::field::SRQN),
            byte("vendor_err_synd", err_cqe::field::VENDOR_ERR_SYND),
            byte("syndrome", err_cqe::field::SYNDROME),
            range("s_wqe_opcode_qpn", err_cqe::field::S_WQE_OPCODE_QPN),
            range("wqe_counter", err_cqe::field::WQE_COUNTER),
            byte("signature", err_cqe::field::SIGNATURE),
            byte("op_own", err_cqe::field::OP_OWN),
        ],
    },
];

/// Every constant this crate mirrors, by its C name in `mlx5dv.h` or `verbs.h`, with our
/// value, read from the enums and constants the views use.
pub fn constants() -> Vec<(&'static str, u64)> {
    use super::cqe::CqeOpcode as C;
    use super::ctrl_seg::SendOpcode as O;
    use super::err_cqe::Syndrome as S;
    let opcode = |o: O| u64::from(u8::from(o));
    let cqe_opcode = |c: C| u64::from(u8::from(c));
    let syndrome = |s: S| u64::from(u8::from(s));
    let status = |s: WcStatus| u64::from(u8::from(s));
    vec![
        ("MLX5_OPCODE_NOP", opcode(O::Nop)),
        (
            "MLX5_EXTENDED_UD_AV",
            u64::from(datagram_seg::EXTENDED_UD_AV),
        ),
        ("MLX5_OPCODE_RDMA_WRITE", opcode(O::RdmaWrite)),
        ("MLX5_OPCODE_RDMA_WRITE_IMM", opcode(O::RdmaWriteImm)),
        ("MLX5_OPCODE_SEND", opcode(O::Send)),
        ("MLX5_OPCODE_SEND_IMM", opcode(O::SendImm)),
        ("MLX5_OPCODE_RDMA_READ", opcode(O::RdmaRead)),
        ("MLX5_OPCODE_ATOMIC_CS", opcode(O::AtomicCs)),
        ("MLX5_OPCODE_ATOMIC_FA", opcode(O::AtomicFa)),
        ("MLX5_CQE_REQ", cqe_opcode(C::Req)),
        ("MLX5_CQE_RESP_WR_IMM", cqe_opcode(C::RespWrImm)),
        ("MLX5_CQE_RESP_SEND", cqe_opcode(C::RespSend)),
        ("MLX5_CQE_RESP_SEND_IMM", cqe_opcode(C::RespSendImm)),
        ("MLX5_CQE_RESP_SEND_INV", cqe_opcode(C::RespSendInv)),
        ("MLX5_CQE_REQ_ERR", cqe_opcode(C::ReqErr)),
        ("MLX5_CQE_RESP_ERR", cqe_opcode(C::RespErr)),
        ("MLX5_CQE_INVALID", cqe_opcode(C::Invalid)),
        ("MLX5_CQE_OWNER_MASK", u64::from(cqe::OWNER_MASK)),
        (
            "MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR",
            syndrome(S::LocalLengthErr),
        ),
        (
            "MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR",
            syndrome(S::LocalQpOpErr),
        ),
        (
            "MLX5_CQE_SYNDROME_LOCAL_PROT_ERR",
            syndrome(S::LocalProtErr),
        ),
        ("MLX5_CQE_SYNDROME_WR_FLUSH_ERR", syndrome(S::WrFlushErr)),
        ("MLX5_CQE_SYNDROME_MW_BIND_ERR", syndrome(S::MwBindErr)),
        ("MLX5_CQE_SYNDROME_BAD_RESP_ERR", syndrome(S::BadRespErr)),
        (
            "MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR",
            syndrome(S::LocalAccessErr),
        ),
        (
            "MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR",
            syndrome(S::RemoteInvalReqErr),
        ),
        (
            "MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR",
            syndrome(S::RemoteAccessErr),
        ),
        ("MLX5_CQE_SYNDROME_REMOTE_OP_ERR", syndrome(S::RemoteOpErr)),
        (
            "MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR",
            syndrome(S::TransportRetryExcErr),
        ),
        (
            "MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR",
            syndrome(S::RnrRetryExcErr),
        ),
        (
            "MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR",
            syndrome(S::RemoteAbortedErr),
        ),
        (
            "MLX5_WQE_CTRL_CQ_UPDATE",
            u64::from(ctrl_seg::CTRL_CQ_UPDATE),
        ),
        (
            "MLX5_WQE_CTRL_SOLICITED",
            u64::from(ctrl_seg::CTRL_SOLICITED),
        ),
        ("MLX5_WQE_CTRL_FENCE", u64::from(ctrl_seg::CTRL_FENCE)),
        (
            "MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE",
            u64::from(ctrl_seg::CTRL_INITIATOR_SMALL_FENCE),
        ),
        ("MLX5_SEND_WQE_BB", wqe::SEND_WQE_BB as u64),
        ("MLX5_SEND_WQE_SHIFT", u64::from(wqe::SEND_WQE_SHIFT)),
        ("MLX5_INLINE_SEG", u64::from(inline_seg::INLINE_SEG)),
        ("MLX5_INVALID_LKEY", u64::from(data_seg::INVALID_LKEY)),
        ("MLX5_RCV_DBR", dbrec::RCV_DBR as u64),
        ("MLX5_SND_DBR", dbrec::SND_DBR as u64),
        ("MLX5_CQ_DOORBELL", dbrec::CQ_DOORBELL_UAR_OFFSET as u64),
        (
            "MLX5_CQ_DB_REQ_NOT_SOL",
            u64::from(dbrec::CQ_DB_REQ_NOT_SOL),
        ),
        ("MLX5_CQ_DB_REQ_NOT", u64::from(dbrec::CQ_DB_REQ_NOT)),
        ("IBV_WC_SUCCESS", status(WcStatus::Success)),
        ("IBV_WC_LOC_LEN_ERR", status(WcStatus::LocLenErr)),
        ("IBV_WC_LOC_QP_OP_ERR", status(WcStatus::LocQpOpErr)),
        ("IBV_WC_LOC_EEC_OP_ERR", status(WcStatus::LocEecOpErr)),
        ("IBV_WC_LOC_PROT_ERR", status(WcStatus::LocProtErr)),
        ("IBV_WC_WR_FLUSH_ERR", status(WcStatus::WrFlushErr)),
        ("IBV_WC_MW_BIND_ERR", status(WcStatus::MwBindErr)),
        ("IBV_WC_BAD_RESP_ERR", status(WcStatus::BadRespErr)),
        ("IBV_WC_LOC_ACCESS_ERR", status(WcStatus::LocAccessErr)),
        ("IBV_WC_REM_INV_REQ_ERR", status(WcStatus::RemInvReqErr)),
        ("IBV_WC_REM_ACCESS_ERR", status(WcStatus::RemAccessErr)),
        ("IBV_WC_REM_OP_ERR", status(WcStatus::RemOpErr)),
        ("IBV_WC_RETRY_EXC_ERR", status(WcStatus::RetryExcErr)),
        ("IBV_WC_RNR_RETRY_EXC_ERR", status(WcStatus::RnrRetryExcErr)),
        ("IBV_WC_LOC_RDD_VIOL_ERR", status(WcStatus::LocRddViolErr)),
        (
            "IBV_WC_REM_INV_RD_REQ_ERR",
            status(WcStatus::RemInvRdReqErr),
        ),
        ("IBV_WC_REM_ABORT_ERR", status(WcStatus::RemAbortErr)),
        ("IBV_WC_INV_EECN_ERR", status(WcStatus::InvEecnErr)),
        ("IBV_WC_INV_EEC_STATE_ERR", status(WcStatus::InvEecStateErr)),
        ("IBV_WC_FATAL_ERR", status(WcStatus::FatalErr)),
        ("IBV_WC_RESP_TIMEOUT_ERR", status(WcStatus::RespTimeoutErr)),
        ("IBV_WC_GENERAL_ERR", status(WcStatus::GeneralErr)),
        ("IBV_WC_TM_ERR", status(WcStatus::TmErr)),
        (
            "IBV_WC_TM_RNDV_INCOMPLETE",
            status(WcStatus::TmRndvIncomplete),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_lie_inside_their_struct_and_do_not_overlap() {
        for s in STRUCTS {
            let mut taken = vec![false; s.size];
            for f in s.fields {
                assert!(f.offset + f.size <= s.size, "{}.{}", s.c_name, f.name);
                for slot in &mut taken[f.offset..f.offset + f.size] {
                    assert!(!*slot, "{}.{} overlaps another field", s.c_name, f.name);
                    *slot = true;
                }
            }
        }
    }

    #[test]
    fn constant_names_are_unique() {
        let constants = constants();
        let mut names: Vec<_> = constants.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), constants.len());
    }
}
