//! The queue-pair state machine: which transitions exist and which attributes each needs.
//!
//! One table per QP type says it all (RC's, and UD's beside it) (it follows the verbs rules of `ibv_modify_qp`): a transition that is
//! not in the table is illegal; a required attribute that is missing, or an attribute that the
//! transition does not take, is an error that names the attributes. The provider only ever sees
//! requests that passed this check, so the softnic and a ConnectX reject the same things with
//! the same words.

use std::fmt;

/// The states of an RC QP that the driver uses. Values match `enum ibv_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum QpState {
    /// Just created, or reset: rings at index 0, nothing is processed.
    Reset = 0,
    /// Initialised: receive WQEs may be posted, nothing is sent.
    Init = 1,
    /// Ready to receive: connected to a remote QP, inbound requests are served.
    Rtr = 2,
    /// Ready to send: the normal working state.
    Rts = 3,
    /// Error: every outstanding and newly posted WQE completes with a flush error.
    Err = 6,
}

impl QpState {
    /// The state for an `ibv_qp_state` value, if it is one the driver uses.
    pub fn from_ibv(value: u8) -> Option<QpState> {
        Some(match value {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            6 => QpState::Err,
            _ => return None,
        })
    }

    /// The verbs name of the state, as `ibv_qp_state_str` prints it.
    pub fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Err => "ERR",
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of QP attributes, named as `enum ibv_qp_attr_mask` names them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(u32);

macro_rules! attr_bits {
    ($($(#[$doc:meta])* $name:ident = $bit:expr, $text:expr;)*) => {
        impl AttrMask {
            $($(#[$doc])* pub const $name: AttrMask = AttrMask(1 << $bit);)*
            const NAMES: &'static [(AttrMask, &'static str)] = &[$((AttrMask::$name, $text)),*];
        }
    };
}

attr_bits! {
    /// `IBV_QP_ACCESS_FLAGS`: what remote peers may do to this QP's memory.
    ACCESS_FLAGS = 0, "access_flags";
    /// `IBV_QP_PKEY_INDEX`.
    PKEY_INDEX = 1, "pkey_index";
    /// `IBV_QP_PORT`.
    PORT = 2, "port";
    /// `IBV_QP_AV`: the address vector (destination GID, source GID index, hop limit).
    AV = 3, "av";
    /// `IBV_QP_PATH_MTU`.
    PATH_MTU = 4, "path_mtu";
    /// `IBV_QP_DEST_QPN`.
    DEST_QPN = 5, "dest_qpn";
    /// `IBV_QP_RQ_PSN`: the first PSN expected from the peer.
    RQ_PSN = 6, "rq_psn";
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`: reads and atomics the peer may have outstanding here.
    MAX_DEST_RD_ATOMIC = 7, "max_dest_rd_atomic";
    /// `IBV_QP_MIN_RNR_TIMER`.
    MIN_RNR_TIMER = 8, "min_rnr_timer";
    /// `IBV_QP_SQ_PSN`: the first PSN this QP sends.
    SQ_PSN = 9, "sq_psn";
    /// `IBV_QP_TIMEOUT`: local ACK timeout, 4.096 us x 2^timeout.
    TIMEOUT = 10, "timeout";
    /// `IBV_QP_RETRY_CNT`.
    RETRY_CNT = 11, "retry_cnt";
    /// `IBV_QP_RNR_RETRY`.
    RNR_RETRY = 12, "rnr_retry";
    /// `IBV_QP_MAX_QP_RD_ATOMIC`: reads and atomics this QP may have outstanding.
    MAX_QP_RD_ATOMIC = 13, "max_rd_atomic";
    /// A UD QP's queue key.
    QKEY = 14, "qkey";
}

impl AttrMask {
    /// The empty set.
    pub const NONE: AttrMask = AttrMask(0);

    /// Whether every attribute of `other` is in `self`.
    pub fn contains(self, other: AttrMask) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The attributes in `self` and not in `other`.
    pub fn without(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 & !other.0)
    }

    /// The verbs names of the attributes in the set.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        AttrMask::NAMES
            .iter()
            .filter(move |(bit, _)| self.contains(*bit))
            .map(|(_, name)| *name)
    }
}

impl std::ops::BitOr for AttrMask {
    type Output = AttrMask;
    fn bitor(self, rhs: AttrMask) -> AttrMask {
        AttrMask(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for AttrMask {
    fn bitor_assign(&mut self, rhs: AttrMask) {
        self.0 |= rhs.0;
    }
}

impl fmt::Display for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for name in self.names() {
            if !first {
                f.write_str(", ")?;
            }
            f.write_str(name)?;
            first = false;
        }
        if first {
            f.write_str("(none)")?;
        }
        Ok(())
    }
}

impl fmt::Debug for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AttrMask({self})")
    }
}

/// One legal transition: what it must be given and what it may be given.
struct Transition {
    from: QpState,
    to: QpState,
    required: AttrMask,
    optional: AttrMask,
}

const fn mask(bits: &[AttrMask]) -> AttrMask {
    let mut m = 0;
    let mut i = 0;
    while i < bits.len() {
        m |= bits[i].0;
        i += 1;
    }
    AttrMask(m)
}

/// The RC transitions of `ibv_modify_qp`. Moving to RESET or ERR is legal from every state
/// and takes no attributes; those two are handled before the table is consulted.
const TABLE: &[Transition] = &[
    Transition {
        from: QpState::Reset,
        to: QpState::Init,
        required: mask(&[AttrMask::PKEY_INDEX, AttrMask::PORT, AttrMask::ACCESS_FLAGS]),
        optional: AttrMask::NONE,
    },
    Transition {
        from: QpState::Init,
        to: QpState::Init,
        required: AttrMask::NONE,
        optional: mask(&[AttrMask::PKEY_INDEX, AttrMask::PORT, AttrMask::ACCESS_FLAGS]),
    },
    Transition {
        from: QpState::Init,
        to: QpState::Rtr,
        required: mask(&[
            AttrMask::AV,
            AttrMask::PATH_MTU,
            AttrMask::DEST_QPN,
            AttrMask::RQ_PSN,
            AttrMask::MAX_DEST_RD_ATOMIC,
            AttrMask::MIN_RNR_TIMER,
        ]),
        optional: mask(&[AttrMask::ACCESS_FLAGS, AttrMask::PKEY_INDEX]),
    },
    Transition {
        from: QpState::Rtr,
        to: QpState::Rts,
        required: mask(&[
            AttrMask::SQ_PSN,
            AttrMask::TIMEOUT,
            AttrMask::RETRY_CNT,
            AttrMask::RNR_RETRY,
            AttrMask::MAX_QP_RD_ATOMIC,
        ]),
        optional: mask(&[AttrMask::ACCESS_FLAGS, AttrMask::MIN_RNR_TIMER]),
    },
    Transition {
        from: QpState::Rts,
        to: QpState::Rts,
        required: AttrMask::NONE,
        optional: mask(&[AttrMask::ACCESS_FLAGS, AttrMask::MIN_RNR_TIMER]),
    },
];

/// A UD QP's transitions (`ibv_modify_qp` on `IBV_QPT_UD`): no peer, no PSN the peer sends,
/// no timers; the queue key at INIT. RTR may take the path MTU, the largest datagram the QP
/// sends (railshift's: a ConnectX takes the port's), which a provider without it sets itself.
const UD_TABLE: &[Transition] = &[
    Transition {
        from: QpState::Reset,
        to: QpState::Init,
        required: mask(&[AttrMask::PKEY_INDEX, AttrMask::PORT, AttrMask::QKEY]),
        optional: AttrMask::NONE,
    },
    Transition {
        from: QpState::Init,
        to: QpState::Init,
        required: AttrMask::NONE,
        optional: mask(&[AttrMask::PKEY_INDEX, AttrMask::PORT, AttrMask::QKEY]),
    },
    Transition {
        from: QpState::Init,
        to: QpState::Rtr,
        required: AttrMask::NONE,
        optional: mask(&[AttrMask::PKEY_INDEX, AttrMask::QKEY, AttrMask::PATH_MTU]),
    },
    Transition {
        from: QpState::Rtr,
        to: QpState::Rts,
        required: AttrMask::SQ_PSN,
        optional: AttrMask::QKEY,
    },
    Transition {
        from: QpState::Rts,
        to: QpState::Rts,
        required: AttrMask::NONE,
        optional: AttrMask::QKEY,
    },
];

/// Why a QP state transition was refused before it reached the device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The transition does not exist for an RC QP.
    #[error("illegal QP transition {from} -> {to}")]
    Illegal {
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
    },
    /// The transition needs attributes that were not given.
    #[error("QP transition {from} -> {to} is missing required attributes: {missing}")]
    MissingAttributes {
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The attributes that must be given.
        missing: AttrMask,
    },
    /// Attributes were given that this transition does not take.
    #[error("QP transition {from} -> {to} does not take attributes: {unexpected}")]
    UnexpectedAttributes {
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The attributes that must not be given.
        unexpected: AttrMask,
    },
}

/// Checks an RC QP's transition against the table: `Ok` when `from -> to` is legal with exactly the
/// attributes in `given` (all required ones, no others than the optional ones).
pub fn check_transition(
    from: QpState,
    to: QpState,
    given: AttrMask,
) -> Result<(), TransitionError> {
    check_in(TABLE, from, to, given)
}

/// [`check_transition`] for a QP of `qp_type`: RC's table, or UD's.
pub fn check_transition_of(
    qp_type: QpType,
    from: QpState,
    to: QpState,
    given: AttrMask,
) -> Result<(), TransitionError> {
    match qp_type {
        QpType::Rc => check_in(TABLE, from, to, given),
        QpType::Ud => check_in(UD_TABLE, from, to, given),
    }
}

fn check_in(
    table: &[Transition],
    from: QpState,
    to: QpState,
    given: AttrMask,
) -> Result<(), TransitionError> {
    if to == QpState::Reset || to == QpState::Err {
        if !given.is_empty() {
            return Err(TransitionError::UnexpectedAttributes {
                from,
                to,
                unexpected: given,
            });
        }
        return Ok(());
    }
    let Some(t) = table.iter().find(|t| t.from == from && t.to == to) else {
        return Err(TransitionError::Illegal { from, to });
    };
    let missing = t.required.without(given);
    if !missing.is_empty() {
        return Err(TransitionError::MissingAttributes { from, to, missing });
    }
    let unexpected = given.without(t.required | t.optional);
    if !unexpected.is_empty() {
        return Err(TransitionError::UnexpectedAttributes {
            from,
            to,
            unexpected,
        });
    }
    Ok(())
}

/// A QP's transport service (`ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QpType {
    /// Reliable connected: one peer QP; RDMA, atomics, acknowledged and resent SENDs.
    #[default]
    Rc,
    /// Unreliable datagram: each SEND names its destination (a `verbs::UdAddress`) and goes once,
    /// unacknowledged; a receive gets the 40-byte GRH before the payload and the sender's QPN
    /// in its completion. Only on providers with [`crate::provider::Provider::supports_ud`].
    Ud,
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [QpState; 5] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Err,
    ];

    fn required(from: QpState, to: QpState) -> AttrMask {
        TABLE
            .iter()
            .find(|t| t.from == from && t.to == to)
            .map(|t| t.required)
            .unwrap_or(AttrMask::NONE)
    }

    #[test]
    fn bring_up_path_is_legal_with_its_required_attributes() {
        let path = [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts];
        for pair in path.windows(2) {
            let given = required(pair[0], pair[1]);
            assert_eq!(check_transition(pair[0], pair[1], given), Ok(()));
        }
    }

    #[test]
    fn a_ud_qp_comes_up_with_its_queue_key_and_first_psn_and_takes_no_peer() {
        use QpType::{Rc, Ud};
        let init = mask(&[AttrMask::PKEY_INDEX, AttrMask::PORT, AttrMask::QKEY]);
        assert_eq!(
            check_transition_of(Ud, QpState::Reset, QpState::Init, init),
            Ok(())
        );
        assert_eq!(
            check_transition_of(Ud, QpState::Init, QpState::Rtr, AttrMask::NONE),
            Ok(())
        );
        assert_eq!(
            check_transition_of(Ud, QpState::Rtr, QpState::Rts, AttrMask::SQ_PSN),
            Ok(())
        );
        // RC's INIT (access flags, no queue key) is not UD's, nor is a peer at RTR.
        let rc_init = mask(&[AttrMask::PKEY_INDEX, AttrMask::PORT, AttrMask::ACCESS_FLAGS]);
        assert!(check_transition_of(Ud, QpState::Reset, QpState::Init, rc_init).is_err());
        let peer = mask(&[AttrMask::AV, AttrMask::DEST_QPN]);
        assert!(matches!(
            check_transition_of(Ud, QpState::Init, QpState::Rtr, peer),
            Err(TransitionError::UnexpectedAttributes { .. })
        ));
        // And an RC QP takes no queue key.
        assert!(check_transition_of(Rc, QpState::Reset, QpState::Init, init).is_err());
        assert_eq!(
            check_transition_of(Rc, QpState::Reset, QpState::Init, rc_init),
            check_transition(QpState::Reset, QpState::Init, rc_init)
        );
    }

    #[test]
    fn reset_and_error_are_reachable_from_every_state_without_attributes() {
        for from in ALL {
            assert_eq!(
                check_transition(from, QpState::Reset, AttrMask::NONE),
                Ok(())
            );
            assert_eq!(check_transition(from, QpState::Err, AttrMask::NONE), Ok(()));
        }
    }

    #[test]
    fn skipping_a_state_is_illegal_and_named() {
        let err = check_transition(QpState::Reset, QpState::Rts, AttrMask::NONE).unwrap_err();
        assert_eq!(err.to_string(), "illegal QP transition RESET -> RTS");
        for (from, to) in [
            (QpState::Reset, QpState::Rtr),
            (QpState::Init, QpState::Rts),
            (QpState::Rts, QpState::Rtr),
            (QpState::Err, QpState::Init),
            (QpState::Err, QpState::Rts),
        ] {
            assert_eq!(
                check_transition(from, to, required(from, to)),
                Err(TransitionError::Illegal { from, to })
            );
        }
    }

    #[test]
    fn missing_attributes_are_named() {
        let given = AttrMask::AV | AttrMask::PATH_MTU | AttrMask::RQ_PSN | AttrMask::MIN_RNR_TIMER;
        let err = check_transition(QpState::Init, QpState::Rtr, given).unwrap_err();
        assert_eq!(
            err.to_string(),
            "QP transition INIT -> RTR is missing required attributes: dest_qpn, max_dest_rd_atomic"
        );
    }

    #[test]
    fn attributes_a_transition_does_not_take_are_named() {
        let given = required(QpState::Rtr, QpState::Rts) | AttrMask::DEST_QPN;
        let err = check_transition(QpState::Rtr, QpState::Rts, given).unwrap_err();
        assert_eq!(
            err,
            TransitionError::UnexpectedAttributes {
                from: QpState::Rtr,
                to: QpState::Rts,
                unexpected: AttrMask::DEST_QPN
            }
        );
        let err = check_transition(QpState::Rts, QpState::Err, AttrMask::TIMEOUT).unwrap_err();
        assert!(err
            .to_string()
            .contains("does not take attributes: timeout"));
    }

    #[test]
    fn ibv_state_values_round_trip() {
        for s in ALL {
            assert_eq!(QpState::from_ibv(s as u8), Some(s));
        }
        assert_eq!(QpState::from_ibv(4), None);
    }
}
