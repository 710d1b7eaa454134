//! QP states, the verbs attributes `modify_qp` takes, and the transition table that names an
//! illegal transition or the attributes it is missing.

use std::net::IpAddr;

use thiserror::Error;

use crate::mr::Access;

/// A QP's state (SQD and SQE are not supported: see docs/softnic.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created or reset: rings at index 0, nothing processed.
    Reset,
    /// Initialised: receive WQEs may be posted, nothing is processed.
    Init,
    /// Ready to receive: the responder runs.
    Rtr,
    /// Ready to send: requester and responder run.
    Rts,
    /// Error: every WQE is flushed with WR_FLUSH_ERR.
    Err,
}

/// A QP's transport service (`ibv_qp_type`): reliable connected or unreliable datagram.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected: one peer QP, PSNs, ACKs, retransmission, RDMA and atomics.
    #[default]
    Rc,
    /// Unreliable datagram: each SEND names its destination (address, QPN, Q_Key) in its
    /// WQE's datagram segment and goes as one packet, never acknowledged nor resent; a receive
    /// gets the 40-byte GRH before the payload and the sender's QPN in its completion.
    Ud,
}

/// The path MTU (`ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathMtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl PathMtu {
    /// Payload bytes per packet.
    pub fn bytes(self) -> u32 {
        match self {
            PathMtu::Mtu256 => 256,
            PathMtu::Mtu512 => 512,
            PathMtu::Mtu1024 => 1024,
            PathMtu::Mtu2048 => 2048,
            PathMtu::Mtu4096 => 4096,
        }
    }

    /// The largest IB MTU whose RoCEv2 packets fit an Ethernet MTU (IPv4: 20 + UDP 8 + BTH 12
    /// + RETH 16 + ImmDt 4 + ICRC 4 bytes of overhead), as rxe derives the active MTU.
    pub fn for_ethernet_mtu(mtu: u32) -> Option<PathMtu> {
        let room = mtu.checked_sub(20 + 8 + 12 + 16 + 4 + 4)?;
        [
            PathMtu::Mtu4096,
            PathMtu::Mtu2048,
            PathMtu::Mtu1024,
            PathMtu::Mtu512,
            PathMtu::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() <= room)
    }
}

/// The attributes `modify_qp` and `query_qp` carry (`ibv_qp_attr`, the RC and UD subset). `None` means
/// "not given" in a modify and "not set yet" in a query.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QpAttrs {
    /// Remote access the responder allows (REMOTE_WRITE/READ/ATOMIC). Required for INIT.
    pub access: Option<Access>,
    /// Path MTU. Required for RTR.
    pub path_mtu: Option<PathMtu>,
    /// Peer's QP number. Required for RTR.
    pub dest_qpn: Option<u32>,
    /// Peer's address (its GID 0). Required for RTR.
    pub dest_addr: Option<IpAddr>,
    /// First PSN the responder expects. Required for RTR.
    pub rq_psn: Option<u32>,
    /// Incoming READ/atomic requests that may be outstanding (the replay cache size). Required
    /// for RTR.
    pub max_dest_rd_atomic: Option<u8>,
    /// RNR timer code (0..=31) sent in RNR NAKs. Required for RTR.
    pub min_rnr_timer: Option<u8>,
    /// Local ACK timeout code: 4.096 us x 2^timeout, 0 = infinite. Required for RTS.
    pub timeout: Option<u8>,
    /// Retries after a timeout or PSN-sequence NAK (0..=7; 7 is seven, not infinite). Required
    /// for RTS.
    pub retry_cnt: Option<u8>,
    /// Retries after RNR NAKs (0..=7; 7 = infinite, as the spec says). Required for RTS.
    pub rnr_retry: Option<u8>,
    /// First PSN the requester sends. Required for RTS.
    pub sq_psn: Option<u32>,
    /// Outgoing READ/atomic requests that may be outstanding. Required for RTS.
    pub max_rd_atomic: Option<u8>,
    /// A UD QP's queue key: it takes only datagrams that carry it. Required for a UD QP's
    /// INIT; an RC QP has none.
    pub qkey: Option<u32>,
}

impl QpAttrs {
    /// Copies every attribute `other` gives into `self`.
    pub(crate) fn merge(&mut self, other: &QpAttrs) {
        macro_rules! take {
            ($($f:ident),*) => { $( if other.$f.is_some() { self.$f = other.$f.clone(); } )* };
        }
        take!(
            access,
            path_mtu,
            dest_qpn,
            dest_addr,
            rq_psn,
            max_dest_rd_atomic,
            min_rnr_timer,
            timeout,
            retry_cnt,
            rnr_retry,
            sq_psn,
            max_rd_atomic,
            qkey
        );
    }
}

/// Why a `modify_qp` was refused.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ModifyError {
    /// The state machine has no such edge.
    #[error("illegal QP transition {from:?} -> {to:?}")]
    IllegalTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// The transition needs attributes that were not given.
    #[error("QP transition {from:?} -> {to:?} is missing {missing:?}")]
    MissingAttributes {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// Names of the missing `ibv_qp_attr` fields.
        missing: Vec<&'static str>,
    },
    /// An attribute is out of range.
    #[error("QP attribute {name} = {value} is out of range")]
    BadAttribute {
        /// The field.
        name: &'static str,
        /// The value given.
        value: u64,
    },
}

/// Checks the transition and its required attributes (as `ibv_modify_qp` on a QP of type
/// `qp_type`: a UD QP needs its Q_Key for INIT and its first PSN for RTS, nothing of a peer).
pub(crate) fn check_transition(
    qp_type: QpType,
    from: QpState,
    to: QpState,
    given: &QpAttrs,
) -> Result<(), ModifyError> {
    use QpState as S;
    let required: &[&'static str] = match (qp_type, from, to) {
        (QpType::Ud, _, S::Reset) | (QpType::Ud, _, S::Err) => &[],
        (QpType::Ud, S::Reset, S::Init) => &["qkey"],
        (QpType::Ud, S::Init, S::Init) | (QpType::Ud, S::Init, S::Rtr) => &[],
        (QpType::Ud, S::Rtr, S::Rts) => &["sq_psn"],
        (QpType::Ud, S::Rts, S::Rts) => &[],
        (QpType::Ud, ..) => return Err(ModifyError::IllegalTransition { from, to }),
        (QpType::Rc, from, to) => rc_required(from, to)?,
    };

    let missing: Vec<&'static str> = required
        .iter()
        .copied()
        .filter(|name| match *name {
            "qp_access_flags" => given.access.is_none(),
            "path_mtu" => given.path_mtu.is_none(),
            "dest_qp_num" => given.dest_qpn.is_none(),
            "ah_attr" => given.dest_addr.is_none(),
            "rq_psn" => given.rq_psn.is_none(),
            "max_dest_rd_atomic" => given.max_dest_rd_atomic.is_none(),
            "min_rnr_timer" => given.min_rnr_timer.is_none(),
            "timeout" => given.timeout.is_none(),
            "retry_cnt" => given.retry_cnt.is_none(),
            "rnr_retry" => given.rnr_retry.is_none(),
            "sq_psn" => given.sq_psn.is_none(),
            "max_rd_atomic" => given.max_rd_atomic.is_none(),
            "qkey" => given.qkey.is_none(),
            _ => false,
        })
        .collect();
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes { from, to, missing });
    }
    let ranges: [(&'static str, Option<u64>, u64); 7] = [
        ("dest_qp_num", given.dest_qpn.map(u64::from), 0xff_ffff),
        ("rq_psn", given.rq_psn.map(u64::from), 0xff_ffff),
        ("sq_psn", given.sq_psn.map(u64::from), 0xff_ffff),
        ("min_rnr_timer", given.min_rnr_timer.map(u64::from), 31),
        ("timeout", given.timeout.map(u64::from), 31),
        ("retry_cnt", given.retry_cnt.map(u64::from), 7),
        ("rnr_retry", given.rnr_retry.map(u64::from), 7),
    ];
    for (name, value, max) in ranges {
        if let Some(v) = value {
            if v > max {
                return Err(ModifyError::BadAttribute { name, value: v });
            }
        }
    }
    Ok(())
}

/// The attributes an RC QP's transition needs, or why it has no such edge.
fn rc_required(from: QpState, to: QpState) -> Result<&'static [&'static str], ModifyError> {
    use QpState as S;
    Ok(match (from, to) {
        (_, S::Reset) | (_, S::Err) => &[],
        (S::Reset, S::Init) => &["qp_access_flags"],
        (S::Init, S::Init) => &[],
        (S::Init, S::Rtr) => &[
            "path_mtu",
            "dest_qp_num",
            "ah_attr",
            "rq_psn",
            "max_dest_rd_atomic",
            "min_rnr_timer",
        ],
        (S::Rtr, S::Rts) => &[
            "timeout",
            "retry_cnt",
            "rnr_retry",
            "sq_psn",
            "max_rd_atomic",
        ],
        (S::Rts, S::Rts) => &[],
        _ => return Err(ModifyError::IllegalTransition { from, to }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn rtr_attrs() -> QpAttrs {
        QpAttrs {
            path_mtu: Some(PathMtu::Mtu1024),
            dest_qpn: Some(7),
            dest_addr: Some(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2))),
            rq_psn: Some(0),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(1),
            ..Default::default()
        }
    }

    #[test]
    fn reset_to_rts_directly_is_illegal() {
        assert_eq!(
            check_transition(
                QpType::Rc,
                QpState::Reset,
                QpState::Rts,
                &QpAttrs::default()
            ),
            Err(ModifyError::IllegalTransition {
                from: QpState::Reset,
                to: QpState::Rts
            })
        );
    }

    #[test]
    fn rtr_names_the_missing_attributes() {
        let mut a = rtr_attrs();
        a.dest_qpn = None;
        a.rq_psn = None;
        match check_transition(QpType::Rc, QpState::Init, QpState::Rtr, &a) {
            Err(ModifyError::MissingAttributes { missing, .. }) => {
                assert_eq!(missing, vec!["dest_qp_num", "rq_psn"])
            }
            other => panic!("{other:?}"),
        }
        assert!(check_transition(QpType::Rc, QpState::Init, QpState::Rtr, &rtr_attrs()).is_ok());
    }

    #[test]
    fn any_state_may_go_to_error_or_reset() {
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Err,
        ] {
            assert!(check_transition(QpType::Rc, s, QpState::Err, &QpAttrs::default()).is_ok());
            assert!(check_transition(QpType::Rc, s, QpState::Reset, &QpAttrs::default()).is_ok());
        }
    }

    #[test]
    fn out_of_range_retry_count_is_refused() {
        let a = QpAttrs {
            retry_cnt: Some(8),
            ..Default::default()
        };
        assert_eq!(
            check_transition(QpType::Rc, QpState::Rts, QpState::Rts, &a),
            Err(ModifyError::BadAttribute {
                name: "retry_cnt",
                value: 8
            })
        );
    }

    #[test]
    fn a_ud_qp_needs_its_q_key_and_first_psn_and_no_peer() {
        use QpState as S;
        let ud = QpType::Ud;
        match check_transition(ud, S::Reset, S::Init, &QpAttrs::default()) {
            Err(ModifyError::MissingAttributes { missing, .. }) => assert_eq!(missing, ["qkey"]),
            other => panic!("{other:?}"),
        }
        let qkey = QpAttrs {
            qkey: Some(7),
            ..Default::default()
        };
        assert!(check_transition(ud, S::Reset, S::Init, &qkey).is_ok());
        assert!(check_transition(ud, S::Init, S::Rtr, &QpAttrs::default()).is_ok());
        assert!(matches!(
            check_transition(ud, S::Rtr, S::Rts, &QpAttrs::default()),
            Err(ModifyError::MissingAttributes { .. })
        ));
        assert_eq!(
            check_transition(ud, S::Reset, S::Rtr, &QpAttrs::default()),
            Err(ModifyError::IllegalTransition {
                from: S::Reset,
                to: S::Rtr
            })
        );
        // An RC QP still needs its peer for RTR, and takes no Q_Key in its place.
        assert!(check_transition(QpType::Rc, S::Init, S::Rtr, &qkey).is_err());
    }

    #[test]
    fn ethernet_mtu_maps_to_the_largest_ib_mtu_that_fits() {
        assert_eq!(PathMtu::for_ethernet_mtu(1500), Some(PathMtu::Mtu1024));
        assert_eq!(PathMtu::for_ethernet_mtu(9000), Some(PathMtu::Mtu4096));
        assert_eq!(PathMtu::for_ethernet_mtu(100), None);
    }
}
