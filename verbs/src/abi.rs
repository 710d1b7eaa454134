//! The libibverbs ABI as Debian's `infiniband/verbs.h` (rdma-core 44) lays it out: the structs
//! a verbs program reads and writes directly, and the constants the shim needs.
//!
//! Only what the shim touches is named; the rest of a struct is kept as opaque padding of the
//! right size. `tests/layouts.rs` compiles a C program against the real header that asserts
//! every size and offset in [`LAYOUTS`], so a mismatch fails the build of that test, not a
//! stock binary at run time.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `__VERBS_ABI_IS_EXTENDED`: what `ibv_context.abi_compat` holds when a `verbs_context`
/// lies in front of the `ibv_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// `IBV_NODE_CA`.
pub const IBV_NODE_CA: c_int = 1;
/// `IBV_TRANSPORT_IB` (RoCE devices report the IB transport).
pub const IBV_TRANSPORT_IB: c_int = 0;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_ATOMIC_HCA`.
pub const IBV_ATOMIC_HCA: c_uint = 1;
/// `IBV_GID_TYPE_ROCE_V2` (`enum ibv_gid_type`, what `ibv_query_gid_ex` reports).
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `IBV_GID_TYPE_SYSFS_ROCE_V2` (`enum ibv_gid_type_sysfs`, what the private
/// `ibv_query_gid_type` reports).
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_int = 1;
/// `IBV_QPT_RC`.
pub const IBV_QPT_RC: c_int = 2;

/// `IBV_SEND_FENCE`.
pub const IBV_SEND_FENCE: c_uint = 1;
/// `IBV_SEND_SIGNALED`.
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
/// `IBV_SEND_SOLICITED`.
pub const IBV_SEND_SOLICITED: c_uint = 1 << 2;
/// `IBV_SEND_INLINE`.
pub const IBV_SEND_INLINE: c_uint = 1 << 3;

/// `IBV_WR_RDMA_WRITE`.
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
/// `IBV_WR_RDMA_WRITE_WITH_IMM`.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
/// `IBV_WR_SEND`.
pub const IBV_WR_SEND: c_uint = 2;
/// `IBV_WR_SEND_WITH_IMM`.
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
/// `IBV_WR_RDMA_READ`.
pub const IBV_WR_RDMA_READ: c_uint = 4;
/// `IBV_WR_ATOMIC_CMP_AND_SWP`.
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
/// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;

/// `IBV_WC_WITH_IMM`.
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;

/// `enum ibv_qp_attr_mask` bits the shim reads.
pub mod qp_mask {
    use std::ffi::c_int;
    /// `IBV_QP_STATE`.
    pub const STATE: c_int = 1;
    /// `IBV_QP_CUR_STATE`.
    pub const CUR_STATE: c_int = 1 << 1;
    /// `IBV_QP_ACCESS_FLAGS`.
    pub const ACCESS_FLAGS: c_int = 1 << 3;
    /// `IBV_QP_PKEY_INDEX`.
    pub const PKEY_INDEX: c_int = 1 << 4;
    /// `IBV_QP_PORT`.
    pub const PORT: c_int = 1 << 5;
    /// `IBV_QP_QKEY`.
    pub const QKEY: c_int = 1 << 6;
    /// `IBV_QP_AV`.
    pub const AV: c_int = 1 << 7;
    /// `IBV_QP_PATH_MTU`.
    pub const PATH_MTU: c_int = 1 << 8;
    /// `IBV_QP_TIMEOUT`.
    pub const TIMEOUT: c_int = 1 << 9;
    /// `IBV_QP_RETRY_CNT`.
    pub const RETRY_CNT: c_int = 1 << 10;
    /// `IBV_QP_RNR_RETRY`.
    pub const RNR_RETRY: c_int = 1 << 11;
    /// `IBV_QP_RQ_PSN`.
    pub const RQ_PSN: c_int = 1 << 12;
    /// `IBV_QP_MAX_QP_RD_ATOMIC`.
    pub const MAX_QP_RD_ATOMIC: c_int = 1 << 13;
    /// `IBV_QP_ALT_PATH`.
    pub const ALT_PATH: c_int = 1 << 14;
    /// `IBV_QP_MIN_RNR_TIMER`.
    pub const MIN_RNR_TIMER: c_int = 1 << 15;
    /// `IBV_QP_SQ_PSN`.
    pub const SQ_PSN: c_int = 1 << 16;
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
    pub const MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
    /// `IBV_QP_PATH_MIG_STATE`.
    pub const PATH_MIG_STATE: c_int = 1 << 18;
    /// `IBV_QP_CAP`.
    pub const CAP: c_int = 1 << 19;
    /// `IBV_QP_DEST_QPN`.
    pub const DEST_QPN: c_int = 1 << 20;
}

/// `union ibv_gid`: 16 bytes, aligned as its two `__be64` halves.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid {
    /// The bytes, network order.
    pub raw: [u8; 16],
}

/// `struct _ibv_device_ops`: two pointers nobody calls any more.
#[repr(C)]
pub struct _ibv_device_ops {
    /// `_dummy1`.
    pub _dummy1: *mut c_void,
    /// `_dummy2`.
    pub _dummy2: *mut c_void,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    /// Unused by callers.
    pub _ops: _ibv_device_ops,
    /// `enum ibv_node_type`.
    pub node_type: c_int,
    /// `enum ibv_transport_type`.
    pub transport_type: c_int,
    /// The device's name (what `-d` names).
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    /// The uverbs device's name.
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    /// The uverbs device's sysfs path.
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    /// The infiniband class device's sysfs path.
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// A function of the ops table the shim does not provide.
pub type Unused = *mut c_void;

/// `poll_cq` of the ops table (what the inline `ibv_poll_cq` calls).
pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `req_notify_cq`.
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `post_send`.
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `post_recv`.
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `post_srq_recv`.
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `alloc_mw`.
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut c_void;
/// `bind_mw`.
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut c_void, *mut c_void) -> c_int;
/// `dealloc_mw`.
pub type DeallocMwFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `struct ibv_context_ops`: the table the inline data-path verbs call through.
#[repr(C)]
pub struct ibv_context_ops {
    /// `_compat_query_device`.
    pub _compat_query_device: Unused,
    /// `_compat_query_port`.
    pub _compat_query_port: Unused,
    /// `_compat_alloc_pd` to `_compat_dereg_mr`.
    pub _compat_pd_mr: [Unused; 5],
    /// `alloc_mw` (the inline `ibv_alloc_mw`).
    pub alloc_mw: Option<AllocMwFn>,
    /// `bind_mw` (the inline `ibv_bind_mw`).
    pub bind_mw: Option<BindMwFn>,
    /// `dealloc_mw` (the inline `ibv_dealloc_mw`).
    pub dealloc_mw: Option<DeallocMwFn>,
    /// `_compat_create_cq`.
    pub _compat_create_cq: Unused,
    /// `poll_cq`.
    pub poll_cq: Option<PollCqFn>,
    /// `req_notify_cq`.
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    /// `_compat_cq_event` to `_compat_destroy_srq`.
    pub _compat_cq_srq: [Unused; 7],
    /// `post_srq_recv`.
    pub post_srq_recv: Option<PostSrqRecvFn>,
    /// `_compat_create_qp` to `_compat_destroy_qp`.
    pub _compat_qp: [Unused; 4],
    /// `post_send`.
    pub post_send: Option<PostSendFn>,
    /// `post_recv`.
    pub post_recv: Option<PostRecvFn>,
    /// `_compat_create_ah` to `_compat_async_event`.
    pub _compat_tail: [Unused; 5],
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    /// The device it was opened on.
    pub device: *mut ibv_device,
    /// The data-path ops.
    pub ops: ibv_context_ops,
    /// The uverbs command descriptor (-1: there is no kernel device).
    pub cmd_fd: c_int,
    /// The async event descriptor.
    pub async_fd: c_int,
    /// Completion vectors.
    pub num_comp_vectors: c_int,
    /// Callers do not touch it; kept initialised.
    pub mutex: libc::pthread_mutex_t,
    /// [`VERBS_ABI_IS_EXTENDED`].
    pub abi_compat: *mut c_void,
}

/// `query_port` of `struct verbs_context`.
pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
/// `query_device_ex` of `struct verbs_context`.
pub type QueryDeviceExFn =
    unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut c_void, usize) -> c_int;

/// `struct verbs_context`: the extended ops in front of the `ibv_context`, which is its last
/// field. A null op makes the inline wrappers fall back or fail with `EOPNOTSUPP`.
#[repr(C)]
pub struct verbs_context {
    /// `query_port` (the inline `ibv_query_port` calls it).
    pub query_port: Option<QueryPortFn>,
    /// `advise_mr` to `create_cq_ex`, then `priv`: not provided.
    pub _ops_to_priv: [Unused; 26],
    /// `query_device_ex` (the inline `ibv_query_device_ex`): not provided, so the inline
    /// falls back to `ibv_query_device`.
    pub query_device_ex: Option<QueryDeviceExFn>,
    /// `ibv_destroy_flow` to `_ABI_placeholder3`: not provided.
    pub _ops_tail: [Unused; 11],
    /// Bytes of this struct in front of `context` plus the context (`verbs_get_ctx_op`
    /// compares it against each op's offset).
    pub sz: usize,
    /// The plain context.
    pub context: ibv_context,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    /// Its device context.
    pub context: *mut ibv_context,
    /// The kernel handle.
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    /// Its device context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// First byte.
    pub addr: *mut c_void,
    /// Length in bytes.
    pub length: usize,
    /// The kernel handle.
    pub handle: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    /// Its device context.
    pub context: *mut ibv_context,
    /// Readable when a CQ of the channel has an event.
    pub fd: c_int,
    /// CQs using the channel.
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    /// Its device context.
    pub context: *mut ibv_context,
    /// Its completion channel, if any.
    pub channel: *mut ibv_comp_channel,
    /// The caller's pointer.
    pub cq_context: *mut c_void,
    /// The kernel handle.
    pub handle: u32,
    /// Entries.
    pub cqe: c_int,
    /// For event accounting (kept initialised).
    pub mutex: libc::pthread_mutex_t,
    /// For event accounting (kept initialised).
    pub cond: libc::pthread_cond_t,
    /// Completion events acknowledged.
    pub comp_events_completed: u32,
    /// Async events acknowledged.
    pub async_events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    /// Its device context.
    pub context: *mut ibv_context,
    /// The caller's pointer.
    pub qp_context: *mut c_void,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Where sends complete.
    pub send_cq: *mut ibv_cq,
    /// Where receives complete.
    pub recv_cq: *mut ibv_cq,
    /// Its shared receive queue, if it has one.
    pub srq: *mut c_void,
    /// The kernel handle.
    pub handle: u32,
    /// The QP number.
    pub qp_num: u32,
    /// `enum ibv_qp_state`.
    pub state: c_uint,
    /// `enum ibv_qp_type`.
    pub qp_type: c_int,
    /// For event accounting (kept initialised).
    pub mutex: libc::pthread_mutex_t,
    /// For event accounting (kept initialised).
    pub cond: libc::pthread_cond_t,
    /// Async events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    /// Its device context.
    pub context: *mut ibv_context,
    /// The caller's pointer.
    pub srq_context: *mut c_void,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// The kernel handle.
    pub handle: u32,
    /// For event accounting (kept initialised).
    pub mutex: libc::pthread_mutex_t,
    /// For event accounting (kept initialised).
    pub cond: libc::pthread_cond_t,
    /// Async events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    /// Receives it holds.
    pub max_wr: u32,
    /// Scatter entries per receive.
    pub max_sge: u32,
    /// The limit (0: disarmed).
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    /// The caller's pointer.
    pub srq_context: *mut c_void,
    /// Sizes, updated to what was granted, and the limit.
    pub attr: ibv_srq_attr,
}

/// `enum ibv_srq_attr_mask`: `IBV_SRQ_MAX_WR` (resize) and `IBV_SRQ_LIMIT`.
pub mod srq_mask {
    /// `IBV_SRQ_MAX_WR`.
    pub const MAX_WR: i32 = 1;
    /// `IBV_SRQ_LIMIT`.
    pub const LIMIT: i32 = 2;
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    /// First byte.
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// Local key.
    pub lkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`, as its largest member (`atomic`) lays it out;
/// `rdma` uses the first two fields (the rkey in the low half of the second).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_wr {
    /// `rdma.remote_addr`, `atomic.remote_addr`.
    pub remote_addr: u64,
    /// `rdma.rkey` (low 32 bits), `atomic.compare_add`.
    pub rdma_rkey_or_compare_add: u64,
    /// `atomic.swap`.
    pub swap: u64,
    /// `atomic.rkey`.
    pub atomic_rkey: u32,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The next request of the list.
    pub next: *mut ibv_send_wr,
    /// The gather list.
    pub sg_list: *mut ibv_sge,
    /// Entries of the gather list.
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode`.
    pub opcode: c_uint,
    /// `enum ibv_send_flags`.
    pub send_flags: c_uint,
    /// Immediate data, network order.
    pub imm_data: u32,
    /// The operation's remote side.
    pub wr: ibv_send_wr_wr,
    /// `qp_type` (XRC) and the `bind_mw`/`tso` union: not used by RC.
    pub _tail: [u64; 7],
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The next request of the list.
    pub next: *mut ibv_recv_wr,
    /// The scatter list.
    pub sg_list: *mut ibv_sge,
    /// Entries of the scatter list.
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wc {
    /// The request's id.
    pub wr_id: u64,
    /// `enum ibv_wc_status`.
    pub status: c_uint,
    /// `enum ibv_wc_opcode`.
    pub opcode: c_uint,
    /// Vendor syndrome.
    pub vendor_err: u32,
    /// Bytes received (receives, READs).
    pub byte_len: u32,
    /// Immediate data, network order.
    pub imm_data: u32,
    /// The local QP.
    pub qp_num: u32,
    /// The remote QP (UD only).
    pub src_qp: u32,
    /// `enum ibv_wc_flags`.
    pub wc_flags: c_uint,
    /// P_Key index (GSI only).
    pub pkey_index: u16,
    /// Source LID (UD only).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits (UD only).
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    /// Send work requests.
    pub max_send_wr: u32,
    /// Receive work requests.
    pub max_recv_wr: u32,
    /// Gather entries per send.
    pub max_send_sge: u32,
    /// Scatter entries per receive.
    pub max_recv_sge: u32,
    /// Inline bytes per send.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    /// The caller's pointer.
    pub qp_context: *mut c_void,
    /// Where sends complete.
    pub send_cq: *mut ibv_cq,
    /// Where receives complete.
    pub recv_cq: *mut ibv_cq,
    /// A shared receive queue.
    pub srq: *mut c_void,
    /// Queue sizes, updated to what was granted.
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: c_int,
    /// Every send signaled.
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// IPv6 flow label.
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit (TTL).
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    /// The global route (RoCE: required).
    pub grh: ibv_global_route,
    /// Destination LID (InfiniBand only).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Whether `grh` is valid.
    pub is_global: u8,
    /// Port.
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    /// `enum ibv_qp_state`: the new state.
    pub qp_state: c_uint,
    /// The state the caller believes current.
    pub cur_qp_state: c_uint,
    /// `enum ibv_mtu`.
    pub path_mtu: c_uint,
    /// `enum ibv_mig_state`.
    pub path_mig_state: c_uint,
    /// Q_Key (UD only).
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Remote QP number.
    pub dest_qp_num: u32,
    /// `enum ibv_access_flags`.
    pub qp_access_flags: c_uint,
    /// Queue sizes.
    pub cap: ibv_qp_cap,
    /// Primary path.
    pub ah_attr: ibv_ah_attr,
    /// Alternate path.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// SQD async notification.
    pub en_sqd_async_notify: u8,
    /// SQ draining.
    pub sq_draining: u8,
    /// Outstanding reads/atomics as requester.
    pub max_rd_atomic: u8,
    /// Outstanding reads/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Port.
    pub port_num: u8,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate timeout.
    pub alt_timeout: u8,
    /// Rate limit.
    pub rate_limit: u32,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    /// `enum ibv_port_state`.
    pub state: c_uint,
    /// `enum ibv_mtu`.
    pub max_mtu: c_uint,
    /// `enum ibv_mtu`.
    pub active_mtu: c_uint,
    /// GID table entries.
    pub gid_tbl_len: c_int,
    /// Capability flags.
    pub port_cap_flags: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table entries.
    pub pkey_tbl_len: u16,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// SM LID.
    pub sm_lid: u16,
    /// LMC.
    pub lmc: u8,
    /// VLs.
    pub max_vl_num: u8,
    /// SM SL.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Link width code.
    pub active_width: u8,
    /// Link speed code.
    pub active_speed: u8,
    /// Physical state (5: LinkUp).
    pub phys_state: u8,
    /// [`IBV_LINK_LAYER_ETHERNET`].
    pub link_layer: u8,
    /// Flags.
    pub flags: u8,
    /// More capability flags.
    pub port_cap_flags2: u16,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    /// Firmware version string.
    pub fw_ver: [c_char; 64],
    /// Node GUID, network order.
    pub node_guid: u64,
    /// System image GUID, network order.
    pub sys_image_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// QPs.
    pub max_qp: c_int,
    /// Work requests per queue.
    pub max_qp_wr: c_int,
    /// `enum ibv_device_cap_flags`.
    pub device_cap_flags: c_uint,
    /// Gather/scatter entries.
    pub max_sge: c_int,
    /// Gather/scatter entries of RDMA READ.
    pub max_sge_rd: c_int,
    /// CQs.
    pub max_cq: c_int,
    /// CQ entries.
    pub max_cqe: c_int,
    /// MRs.
    pub max_mr: c_int,
    /// PDs.
    pub max_pd: c_int,
    /// Reads/atomics per QP as responder.
    pub max_qp_rd_atom: c_int,
    /// EE reads/atomics.
    pub max_ee_rd_atom: c_int,
    /// Responder resources.
    pub max_res_rd_atom: c_int,
    /// Reads/atomics per QP as requester.
    pub max_qp_init_rd_atom: c_int,
    /// EE initiator reads/atomics.
    pub max_ee_init_rd_atom: c_int,
    /// `enum ibv_atomic_cap`.
    pub atomic_cap: c_uint,
    /// From `max_ee` to `max_map_per_fmr`: all zero here (no EE, RDD, MW, raw QPs,
    /// multicast, AH or FMR).
    pub _unsupported: [c_int; 11],
    /// Shared receive queues.
    pub max_srq: c_int,
    /// Receives per shared receive queue.
    pub max_srq_wr: c_int,
    /// Scatter entries per shared receive queue receive.
    pub max_srq_sge: c_int,
    /// P_Keys.
    pub max_pkeys: u16,
    /// Local CA ACK delay.
    pub local_ca_ack_delay: u8,
    /// Ports.
    pub phys_port_cnt: u8,
}

/// `struct ibv_gid_entry`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    /// The GID.
    pub gid: ibv_gid,
    /// Its index.
    pub gid_index: u32,
    /// Its port.
    pub port_num: u32,
    /// `enum ibv_gid_type`.
    pub gid_type: u32,
    /// The netdev's ifindex.
    pub ndev_ifindex: u32,
}

/// One mirrored struct: its C name, its size, and the fields whose offsets matter.
pub struct Layout {
    /// `struct <name>` in verbs.h.
    pub c_name: &'static str,
    /// `sizeof` on our side.
    pub size: usize,
    /// (C field path, our offset).
    pub fields: &'static [(&'static str, usize)],
}

macro_rules! layout {
    ($ty:ident { $($field:ident $(. $sub:ident)* => $c:literal),* $(,)? }) => {
        Layout {
            c_name: stringify!($ty),
            size: size_of::<$ty>(),
            fields: &[$(($c, offset_of!($ty, $field $(. $sub)*))),*],
        }
    };
}

/// Every struct above, with the fields the shim or a caller reads.
pub const LAYOUTS: &[Layout] = &[
    layout!(ibv_device {
        node_type => "node_type", transport_type => "transport_type", name => "name",
        dev_name => "dev_name", dev_path => "dev_path", ibdev_path => "ibdev_path",
    }),
    layout!(ibv_context_ops {
        alloc_mw => "alloc_mw", bind_mw => "bind_mw", dealloc_mw => "dealloc_mw",
        poll_cq => "poll_cq", req_notify_cq => "req_notify_cq",
        post_srq_recv => "post_srq_recv", post_send => "post_send", post_recv => "post_recv",
    }),
    layout!(ibv_context {
        device => "device", ops => "ops", cmd_fd => "cmd_fd", async_fd => "async_fd",
        num_comp_vectors => "num_comp_vectors", mutex => "mutex", abi_compat => "abi_compat",
    }),
    layout!(verbs_context {
        query_port => "query_port", query_device_ex => "query_device_ex", sz => "sz",
        context => "context",
    }),
    layout!(ibv_pd { context => "context", handle => "handle" }),
    layout!(ibv_mr {
        context => "context", pd => "pd", addr => "addr", length => "length",
        handle => "handle", lkey => "lkey", rkey => "rkey",
    }),
    layout!(ibv_comp_channel { context => "context", fd => "fd", refcnt => "refcnt" }),
    layout!(ibv_cq {
        context => "context", channel => "channel", cq_context => "cq_context",
        handle => "handle", cqe => "cqe", mutex => "mutex", cond => "cond",
        comp_events_completed => "comp_events_completed",
        async_events_completed => "async_events_completed",
    }),
    layout!(ibv_qp {
        context => "context", qp_context => "qp_context", pd => "pd", send_cq => "send_cq",
        recv_cq => "recv_cq", srq => "srq", handle => "handle", qp_num => "qp_num",
        state => "state", qp_type => "qp_type", mutex => "mutex", cond => "cond",
        events_completed => "events_completed",
    }),
    layout!(ibv_srq {
        context => "context", srq_context => "srq_context", pd => "pd", handle => "handle",
        mutex => "mutex", cond => "cond", events_completed => "events_completed",
    }),
    layout!(ibv_srq_attr {
        max_wr => "max_wr", max_sge => "max_sge", srq_limit => "srq_limit",
    }),
    layout!(ibv_srq_init_attr { srq_context => "srq_context", attr => "attr" }),
    layout!(ibv_sge { addr => "addr", length => "length", lkey => "lkey" }),
    layout!(ibv_send_wr {
        wr_id => "wr_id", next => "next", sg_list => "sg_list", num_sge => "num_sge",
        opcode => "opcode", send_flags => "send_flags", imm_data => "imm_data",
        wr.remote_addr => "wr.rdma.remote_addr",
        wr.rdma_rkey_or_compare_add => "wr.rdma.rkey",
        wr.swap => "wr.atomic.swap", wr.atomic_rkey => "wr.atomic.rkey",
    }),
    layout!(ibv_recv_wr {
        wr_id => "wr_id", next => "next", sg_list => "sg_list", num_sge => "num_sge",
    }),
    layout!(ibv_wc {
        wr_id => "wr_id", status => "status", opcode => "opcode", vendor_err => "vendor_err",
        byte_len => "byte_len", imm_data => "imm_data", qp_num => "qp_num",
        src_qp => "src_qp", wc_flags => "wc_flags", pkey_index => "pkey_index",
        slid => "slid", sl => "sl", dlid_path_bits => "dlid_path_bits",
    }),
    layout!(ibv_qp_cap {
        max_send_wr => "max_send_wr", max_recv_wr => "max_recv_wr",
        max_send_sge => "max_send_sge", max_recv_sge => "max_recv_sge",
        max_inline_data => "max_inline_data",
    }),
    layout!(ibv_qp_init_attr {
        qp_context => "qp_context", send_cq => "send_cq", recv_cq => "recv_cq", srq => "srq",
        cap => "cap", qp_type => "qp_type", sq_sig_all => "sq_sig_all",
    }),
    layout!(ibv_global_route {
        dgid => "dgid", flow_label => "flow_label", sgid_index => "sgid_index",
        hop_limit => "hop_limit", traffic_class => "traffic_class",
    }),
    layout!(ibv_ah_attr {
        grh => "grh", dlid => "dlid", sl => "sl", src_path_bits => "src_path_bits",
        static_rate => "static_rate", is_global => "is_global", port_num => "port_num",
    }),
    layout!(ibv_qp_attr {
        qp_state => "qp_state", cur_qp_state => "cur_qp_state", path_mtu => "path_mtu",
        qkey => "qkey", rq_psn => "rq_psn", sq_psn => "sq_psn", dest_qp_num => "dest_qp_num",
        qp_access_flags => "qp_access_flags", cap => "cap", ah_attr => "ah_attr",
        alt_ah_attr => "alt_ah_attr", pkey_index => "pkey_index",
        max_rd_atomic => "max_rd_atomic", max_dest_rd_atomic => "max_dest_rd_atomic",
        min_rnr_timer => "min_rnr_timer", port_num => "port_num", timeout => "timeout",
        retry_cnt => "retry_cnt", rnr_retry => "rnr_retry", rate_limit => "rate_limit",
    }),
    layout!(ibv_port_attr {
        state => "state", max_mtu => "max_mtu", active_mtu => "active_mtu",
        gid_tbl_len => "gid_tbl_len", port_cap_flags => "port_cap_flags",
        max_msg_sz => "max_msg_sz", pkey_tbl_len => "pkey_tbl_len", lid => "lid",
        active_width => "active_width", active_speed => "active_speed",
        phys_state => "phys_state", link_layer => "link_layer",
        port_cap_flags2 => "port_cap_flags2",
    }),
    layout!(ibv_device_attr {
        fw_ver => "fw_ver", node_guid => "node_guid", max_mr_size => "max_mr_size",
        page_size_cap => "page_size_cap", vendor_id => "vendor_id", max_qp => "max_qp",
        max_qp_wr => "max_qp_wr", device_cap_flags => "device_cap_flags", max_sge => "max_sge",
        max_cq => "max_cq", max_cqe => "max_cqe", max_mr => "max_mr", max_pd => "max_pd",
        max_qp_rd_atom => "max_qp_rd_atom", max_qp_init_rd_atom => "max_qp_init_rd_atom",
        atomic_cap => "atomic_cap", _unsupported => "max_ee", max_srq => "max_srq",
        max_srq_wr => "max_srq_wr", max_srq_sge => "max_srq_sge", max_pkeys => "max_pkeys",
        local_ca_ack_delay => "local_ca_ack_delay", phys_port_cnt => "phys_port_cnt",
    }),
    layout!(ibv_gid_entry {
        gid => "gid", gid_index => "gid_index", port_num => "port_num", gid_type => "gid_type",
        ndev_ifindex => "ndev_ifindex",
    }),
];
