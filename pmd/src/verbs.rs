//! Verbs-level vocabulary shared by the control objects and the providers: access flags,
//! GIDs, MTUs, QP attributes and capabilities, device and port attributes.
//!
//! Values match libibverbs where libibverbs defines them, so a provider over rdma-sys converts
//! with a cast and a ConnectX sees the same numbers the softnic does.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::qp_state::AttrMask;
pub use crate::qp_state::QpType;

/// Memory access rights of an MR or a QP; bits as in `enum ibv_access_flags`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read (which every MR has).
    pub const NONE: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: the device may write here for this host (receives, READ
    /// responses, atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// Everything: what benchmarks and tests usually register with.
    pub const ALL: Access = Access(0xf);

    /// The raw `ibv_access_flags` bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// From raw `ibv_access_flags` bits; unknown bits are dropped.
    pub fn from_bits_truncate(bits: u32) -> Access {
        Access(bits & Access::ALL.0)
    }

    /// Whether all rights of `other` are in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
            .collect();
        write!(
            f,
            "Access({})",
            if set.is_empty() {
                "NONE".to_string()
            } else {
                set.join("|")
            }
        )
    }
}

/// A 16-byte global identifier; for RoCEv2 an IPv6 address or an IPv4-mapped one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address (IPv4 as `::ffff:a.b.c.d`, as RoCEv2 does).
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for (IPv4 when it is IPv4-mapped).
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(ip))
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", self.to_ip())
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_ip())
    }
}

/// Path MTU; values as in `enum ibv_mtu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The largest path MTU whose RoCEv2 packets fit in a link MTU of `link_mtu` bytes
    /// (IPv4 + UDP + BTH + RETH + ICRC take 20 + 8 + 12 + 16 + 4 bytes).
    pub fn for_link_mtu(link_mtu: u32) -> Option<Mtu> {
        let room = link_mtu.checked_sub(60)?;
        [
            Mtu::Mtu4096,
            Mtu::Mtu2048,
            Mtu::Mtu1024,
            Mtu::Mtu512,
            Mtu::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() <= room)
    }
}

/// Where an RC QP sends to (RoCEv2: a GID, no LID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// The remote port's GID.
    pub dgid: Gid,
    /// Which local GID to send from.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (DSCP and ECN bits).
    pub traffic_class: u8,
}

impl AddressVector {
    /// An address vector to `dgid` from GID 0 with the usual hop limit of 64.
    pub fn to_gid(dgid: Gid) -> AddressVector {
        AddressVector {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
        }
    }
}

/// Attributes of a QP state transition. `None` means "not given"; which ones a transition
/// needs is decided by [`crate::qp_state::check_transition`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// What the peer may do to this side's memory through this QP.
    pub access: Option<Access>,
    /// Partition key index.
    pub pkey_index: Option<u16>,
    /// Port number (1-based, as verbs counts).
    pub port: Option<u8>,
    /// The address of the remote port.
    pub av: Option<AddressVector>,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// The remote QP number.
    pub dest_qpn: Option<u32>,
    /// First PSN expected from the peer (24 bits).
    pub rq_psn: Option<u32>,
    /// Reads/atomics the peer may have outstanding at this QP.
    pub max_dest_rd_atomic: Option<u8>,
    /// RNR NAK timer code sent to peers when no receive is posted.
    pub min_rnr_timer: Option<u8>,
    /// First PSN this QP sends (24 bits).
    pub sq_psn: Option<u32>,
    /// Local ACK timeout code: 4.096 us x 2^timeout.
    pub timeout: Option<u8>,
    /// Transport retries before RETRY_EXC_ERR.
    pub retry_cnt: Option<u8>,
    /// RNR retries before RNR_RETRY_EXC_ERR (7 = forever).
    pub rnr_retry: Option<u8>,
    /// Reads/atomics this QP may have outstanding.
    pub max_rd_atomic: Option<u8>,
    /// A UD QP's queue key: it takes only datagrams that carry it (`IBV_QP_QKEY`).
    pub qkey: Option<u32>,
}

impl QpAttr {
    /// Which attributes are given.
    pub fn mask(&self) -> AttrMask {
        let mut m = AttrMask::NONE;
        let mut set = |given: bool, bit: AttrMask| {
            if given {
                m |= bit;
            }
        };
        set(self.access.is_some(), AttrMask::ACCESS_FLAGS);
        set(self.pkey_index.is_some(), AttrMask::PKEY_INDEX);
        set(self.port.is_some(), AttrMask::PORT);
        set(self.av.is_some(), AttrMask::AV);
        set(self.path_mtu.is_some(), AttrMask::PATH_MTU);
        set(self.dest_qpn.is_some(), AttrMask::DEST_QPN);
        set(self.rq_psn.is_some(), AttrMask::RQ_PSN);
        set(
            self.max_dest_rd_atomic.is_some(),
            AttrMask::MAX_DEST_RD_ATOMIC,
        );
        set(self.min_rnr_timer.is_some(), AttrMask::MIN_RNR_TIMER);
        set(self.sq_psn.is_some(), AttrMask::SQ_PSN);
        set(self.timeout.is_some(), AttrMask::TIMEOUT);
        set(self.retry_cnt.is_some(), AttrMask::RETRY_CNT);
        set(self.rnr_retry.is_some(), AttrMask::RNR_RETRY);
        set(self.max_rd_atomic.is_some(), AttrMask::MAX_QP_RD_ATOMIC);
        set(self.qkey.is_some(), AttrMask::QKEY);
        m
    }

    /// The attributes of RESET -> INIT: port 1, pkey index 0, the given access rights.
    pub fn init(access: Access) -> QpAttr {
        QpAttr {
            access: Some(access),
            pkey_index: Some(0),
            port: Some(1),
            ..QpAttr::default()
        }
    }

    /// The attributes of INIT -> RTR towards a remote QP.
    pub fn rtr(av: AddressVector, dest_qpn: u32, rq_psn: u32, path_mtu: Mtu) -> QpAttr {
        QpAttr {
            av: Some(av),
            dest_qpn: Some(dest_qpn),
            rq_psn: Some(rq_psn),
            path_mtu: Some(path_mtu),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(12),
            ..QpAttr::default()
        }
    }

    /// The attributes of a UD QP's RESET -> INIT: port 1, pkey index 0, queue key `qkey`.
    pub fn init_ud(qkey: u32) -> QpAttr {
        QpAttr {
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(qkey),
            ..QpAttr::default()
        }
    }

    /// The attributes of a UD QP's RTR -> RTS: its first PSN (nothing of a peer: each send
    /// names its destination).
    pub fn rts_ud(sq_psn: u32) -> QpAttr {
        QpAttr {
            sq_psn: Some(sq_psn),
            ..QpAttr::default()
        }
    }

    /// The attributes of RTR -> RTS: timeout 14 (67 ms), 7 retries, infinite RNR retry.
    pub fn rts(sq_psn: u32) -> QpAttr {
        QpAttr {
            sq_psn: Some(sq_psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
            ..QpAttr::default()
        }
    }
}

/// Where a UD SEND goes: the destination's GID, QP number and queue key (the address vector
/// a UD send WQE carries in its datagram segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdAddress {
    /// The destination port's GID.
    pub gid: Gid,
    /// The destination QP.
    pub qpn: u32,
    /// The queue key the destination QP must have.
    pub qkey: u32,
}

/// Bytes of the Global Route Header at the start of every UD receive's buffer, before the
/// payload (RoCEv2 over IPv4: 20 zero bytes, then the IPv4 header).
pub const UD_GRH_LEN: u32 = 40;

/// Sizes of a QP's queues, as requested and as the provider granted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send work requests that may be outstanding (a WQE of several basic blocks counts for
    /// as many).
    pub max_send_wr: u32,
    /// Receive work requests that may be outstanding.
    pub max_recv_wr: u32,
    /// Gather entries per send work request.
    pub max_send_sge: u32,
    /// Scatter entries per receive work request.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send work request.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> QpCaps {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// Limits of a device, as `ibv_query_device` reports the ones the driver uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware or implementation version string.
    pub fw_ver: String,
    /// Largest send or receive queue in work requests.
    pub max_qp_wr: u32,
    /// Largest gather/scatter list.
    pub max_sge: u32,
    /// Largest CQ in entries.
    pub max_cqe: u32,
    /// Largest MR in bytes.
    pub max_mr_size: u64,
    /// Largest inline payload.
    pub max_inline_data: u32,
    /// Outstanding reads/atomics per QP, as responder.
    pub max_qp_rd_atom: u8,
    /// Outstanding reads/atomics per QP, as requester.
    pub max_qp_init_rd_atom: u8,
    /// Shared receive queues the device makes (0: none).
    pub max_srq: u32,
    /// Largest shared receive queue in receives.
    pub max_srq_wr: u32,
    /// Largest scatter list of a shared receive queue's receive.
    pub max_srq_sge: u32,
}

/// The state of a port, as in `enum ibv_port_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PortState {
    /// The link is down.
    Down = 1,
    /// Link up, not yet configured.
    Init = 2,
    /// Link up and configured, not yet forwarding.
    Armed = 3,
    /// Forwarding.
    Active = 4,
}

/// What `ibv_query_port` says about the device's (single) port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Port state.
    pub state: PortState,
    /// Largest path MTU the port supports.
    pub max_mtu: Mtu,
    /// Path MTU the link currently allows.
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_tbl_len: u16,
}

/// A random initial PSN (24 bits), as each end of an RC connection picks one (perftest draws
/// one per QP too): from the kernel's random source (`getrandom(2)`); should that fail, from
/// the clock and the process id, which still differ from run to run.
pub fn random_psn() -> u32 {
    let mut bytes = [0u8; 4];
    // SAFETY: `bytes` is valid for writes of its length for the duration of the call.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    let value = if n == bytes.len() as isize {
        u32::from_ne_bytes(bytes)
    } else {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        nanos ^ std::process::id().rotate_left(13)
    };
    value & 0x00ff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_gid_is_ipv4_mapped_and_round_trips() {
        let gid = Gid::from(Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(&gid.0[10..], &[0xff, 0xff, 198, 18, 0, 1]);
        assert_eq!(gid.to_ip(), IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)));
    }

    #[test]
    fn path_mtu_fits_inside_link_mtu() {
        assert_eq!(Mtu::for_link_mtu(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_link_mtu(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_link_mtu(65536), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_link_mtu(200), None);
    }

    #[test]
    fn helper_attributes_satisfy_the_transition_table() {
        use crate::qp_state::{check_transition, QpState};
        let av = AddressVector::to_gid(Gid::default());
        assert!(check_transition(
            QpState::Reset,
            QpState::Init,
            QpAttr::init(Access::ALL).mask()
        )
        .is_ok());
        assert!(check_transition(
            QpState::Init,
            QpState::Rtr,
            QpAttr::rtr(av, 5, 0, Mtu::Mtu1024).mask()
        )
        .is_ok());
        assert!(check_transition(QpState::Rtr, QpState::Rts, QpAttr::rts(0).mask()).is_ok());
    }
}
