//! Devices and contexts: the device list (ours in front of the system's), opening and closing,
//! and the query verbs.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::mem::offset_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::abi::*;
use crate::config::{Config, DeviceSpec, Progress};
use crate::objects;
use crate::real::real_fns;
use crate::util::{init_logging, invalid, refuse, set_errno};

real_fns! {
    ibv_get_device_list @ "IBVERBS_1.1": fn(*mut c_int) -> *mut *mut ibv_device;
    ibv_free_device_list @ "IBVERBS_1.1": fn(*mut *mut ibv_device) -> ();
    ibv_get_device_name @ "IBVERBS_1.1": fn(*mut ibv_device) -> *const c_char;
    ibv_get_device_guid @ "IBVERBS_1.1": fn(*mut ibv_device) -> u64;
    ibv_get_device_index @ "IBVERBS_1.9": fn(*mut ibv_device) -> c_int;
    ibv_open_device @ "IBVERBS_1.1": fn(*mut ibv_device) -> *mut ibv_context;
    ibv_close_device @ "IBVERBS_1.1": fn(*mut ibv_context) -> c_int;
    ibv_query_device @ "IBVERBS_1.1": fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    ibv_query_port @ "IBVERBS_1.1": fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
    ibv_query_gid @ "IBVERBS_1.1": fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
    _ibv_query_gid_ex @ "IBVERBS_1.11": fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int;
    ibv_query_gid_type @ "IBVERBS_PRIVATE_34": fn(*mut ibv_context, u8, u32, *mut c_int) -> c_int;
    ibv_query_pkey @ "IBVERBS_1.1": fn(*mut ibv_context, u8, c_int, *mut u16) -> c_int;
    ibv_get_async_event @ "IBVERBS_1.1": fn(*mut ibv_context, *mut c_void) -> c_int;
}

/// A device the shim presents. `ibv` comes first: a `*mut ibv_device` of ours points here.
#[repr(C)]
pub struct RsDevice {
    ibv: ibv_device,
    /// What it opens.
    pub spec: DeviceSpec,
    /// Its position in `RAILSHIFT_DEVICES`.
    pub index: usize,
    /// The open pmd device, shared by every `ibv_open_device` of this process (a softnic
    /// binds its address once), and its poll activity.
    open: Mutex<(Weak<pmd::Context>, Arc<PollActivity>)>,
    /// A resilient device, once opened: kept for the process (its service and helper
    /// threads run while it lives).
    resilient: Mutex<Option<Opened>>,
}

// SAFETY: `ibv` is written once before the device is published and only read afterwards; its
// raw pointers are null. The rest is Sync on its own.
unsafe impl Sync for RsDevice {}
// SAFETY: as above.
unsafe impl Send for RsDevice {}

struct Registry {
    config: Result<Config, crate::config::ConfigError>,
    devices: Vec<&'static RsDevice>,
}

fn copy_name(dst: &mut [c_char], src: &str) {
    let room = dst.len() - 1;
    for (d, s) in dst.iter_mut().zip(src.bytes().take(room)) {
        *d = s as c_char;
    }
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        init_logging();
        let config = Config::from_env();
        let mut devices = Vec::new();
        match &config {
            Ok(config) => {
                for (index, spec) in config.devices.iter().enumerate() {
                    let mut ibv = ibv_device {
                        _ops: _ibv_device_ops {
                            _dummy1: std::ptr::null_mut(),
                            _dummy2: std::ptr::null_mut(),
                        },
                        node_type: IBV_NODE_CA,
                        transport_type: IBV_TRANSPORT_IB,
                        name: [0; IBV_SYSFS_NAME_MAX],
                        dev_name: [0; IBV_SYSFS_NAME_MAX],
                        dev_path: [0; IBV_SYSFS_PATH_MAX],
                        ibdev_path: [0; IBV_SYSFS_PATH_MAX],
                    };
                    copy_name(&mut ibv.name, &spec.name);
                    copy_name(&mut ibv.dev_name, &format!("railshift{index}"));
                    let device: &'static RsDevice = Box::leak(Box::new(RsDevice {
                        ibv,
                        spec: spec.clone(),
                        index,
                        open: Mutex::new((Weak::new(), Arc::default())),
                        resilient: Mutex::new(None),
                    }));
                    devices.push(device);
                }
            }
            Err(e) => tracing::error!("railshift verbs: {e}; presenting no railshift device"),
        }
        Registry { config, devices }
    })
}

/// Our device behind `dev`, if it is one.
pub fn our_device(dev: *const ibv_device) -> Option<&'static RsDevice> {
    registry()
        .devices
        .iter()
        .copied()
        .find(|d| std::ptr::eq(&d.ibv, dev))
}

/// The progress mode of the configuration.
fn progress() -> Progress {
    match &registry().config {
        Ok(c) => c.progress,
        Err(_) => Progress::Poll,
    }
}

/// What the application's polls tell the helper thread of a poll-progress device: one word,
/// so that entering `ibv_poll_cq` is one atomic add (and leaving it one subtract), not one
/// per count.
#[derive(Debug, Default)]
pub struct PollActivity {
    /// Low 32 bits: threads inside `ibv_poll_cq` (or an `ibv_destroy_qp` linger) on a plain
    /// device now. High 32 bits: `ibv_poll_cq` calls counted, wrapping.
    state: AtomicU64,
}

/// One thread driving, in [`PollActivity::state`].
const DRIVING_ONE: u64 = 1;
/// One poll counted, in [`PollActivity::state`].
const POLL_ONE: u64 = 1 << 32;

impl PollActivity {
    /// The calling thread drives the device until the guard drops; its poll is counted.
    #[inline]
    pub fn driving(&self) -> Driving<'_> {
        self.state
            .fetch_add(DRIVING_ONE | POLL_ONE, Ordering::Relaxed);
        Driving(self)
    }

    /// The application polled.
    #[inline]
    pub fn polled(&self) {
        self.state.fetch_add(POLL_ONE, Ordering::Relaxed);
    }

    /// The polls counted so far (modulo 2^32: compare for a change, not for an order).
    pub fn count(&self) -> u64 {
        self.state.load(Ordering::Relaxed) >> 32
    }

    /// Whether a thread drives the device now.
    pub fn is_driven(&self) -> bool {
        self.state.load(Ordering::Relaxed) & (POLL_ONE - 1) != 0
    }
}

/// A thread inside a verb that drives the device (see [`PollActivity::driving`]).
pub struct Driving<'a>(&'a PollActivity);

impl Drop for Driving<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.state.fetch_sub(DRIVING_ONE, Ordering::Relaxed);
    }
}

/// How long the helper sleeps after a look that found the device idle.
const IDLE_GAP: Duration = Duration::from_micros(50);
/// How long it sleeps after a look whose round did work: more is likely to follow (a stream
/// to a server that never polls, the peer's next message).
const BUSY_GAP: Duration = Duration::from_micros(10);
/// The helper's timer slack. The kernel's default (50 us) would double the idle gap.
const TIMER_SLACK_NS: libc::c_ulong = 1_000;

/// The helper thread of a poll-progress device. It runs the device only while no thread of
/// the application is inside `ibv_poll_cq` on it (or one is, but has not polled since the
/// last look): a stock latency test waits for the peer's
/// WRITE by spinning on its buffer, outside verbs, and a bandwidth server never polls.
///
/// One round per look, never rounds back to back: the softnic holds an ACK back for one round
/// to send it with the reply the application is about to post. Rounds back to back sent that
/// ACK alone a microsecond later, so the peer's send completed before the reply left, the
/// peer went back to spinning on its buffer, and each half round trip waited for the peer's
/// helper (docs/verbs.md, "Progress"). It ends with the device.
fn helper(ctx: Weak<pmd::Context>, activity: Arc<PollActivity>) {
    // SAFETY: prctl with PR_SET_TIMERSLACK takes one integer and affects only this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS) };
    let mut gap = IDLE_GAP;
    let mut seen = activity.count();
    loop {
        std::thread::sleep(gap);
        let Some(c) = ctx.upgrade() else {
            return;
        };
        // A thread inside ibv_poll_cq that polled nothing since the last look is off its core
        // (a loaded machine): the device must not wait for it.
        let now = activity.count();
        let polling = activity.is_driven() && now != seen;
        seen = now;
        gap = if !polling && c.step().busy {
            BUSY_GAP
        } else {
            IDLE_GAP
        };
    }
}

/// Lists handed out: our array -> (its length, the system's array inside it).
fn lists() -> &'static Mutex<HashMap<usize, (usize, usize)>> {
    static LISTS: OnceLock<Mutex<HashMap<usize, (usize, usize)>>> = OnceLock::new();
    LISTS.get_or_init(|| Mutex::new(HashMap::new()))
}

thread_local! {
    /// Set while this thread opens a pmd device (see [`open_pmd_context`]).
    static OPENING_PMD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `pmd::Context::open` for one of our devices. The pmd's mlx5 provider lists and opens the
/// machine's devices through libibverbs, and its calls land on this library's exported
/// definitions (the shim interposes the symbols in the whole process, itself included):
/// while it opens, `ibv_get_device_list` answers with the system's list alone, so that the
/// provider never sees (or opens) a device of ours; every other verb passes through because
/// the objects it is given are not ours.
pub(crate) fn open_pmd_context(
    name: &str,
    config: &pmd::ContextConfig,
) -> Result<Arc<pmd::Context>, pmd::OpenError> {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            OPENING_PMD.with(|o| o.set(false));
        }
    }
    OPENING_PMD.with(|o| o.set(true));
    let _reset = Reset;
    let ctx = pmd::Context::open(name, config)?;
    crate::faults::register(name, &ctx);
    Ok(ctx)
}

/// `ibv_get_device_list`: ours first, then the system's (the system's alone while the pmd
/// opens a device: [`open_pmd_context`]).
///
/// # Safety
/// `num_devices` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    if OPENING_PMD.with(|o| o.get()) {
        return match system::ibv_get_device_list() {
            // SAFETY: the system's function with the caller's count slot.
            Some(f) => unsafe { f(num_devices) },
            None => {
                if !num_devices.is_null() {
                    // SAFETY: the caller's slot.
                    unsafe { *num_devices = 0 };
                }
                crate::util::set_errno(libc::ENOSYS);
                std::ptr::null_mut()
            }
        };
    }
    let reg = registry();
    let mut n_system: c_int = 0;
    let system = match system::ibv_get_device_list() {
        // SAFETY: the system's function with a valid count slot.
        Some(f) => unsafe { f(&mut n_system) },
        None => std::ptr::null_mut(),
    };
    let mut all: Vec<*mut ibv_device> = reg
        .devices
        .iter()
        .map(|d| std::ptr::from_ref(&d.ibv).cast_mut())
        .collect();
    if !system.is_null() {
        for i in 0..n_system.max(0) as usize {
            // SAFETY: the system's list holds `n_system` entries.
            all.push(unsafe { *system.add(i) });
        }
    }
    let count = all.len();
    if count == 0 && system.is_null() {
        // Neither we nor the system have a device: keep the system's answer (its errno).
        if !num_devices.is_null() {
            // SAFETY: the caller's slot.
            unsafe { *num_devices = 0 };
        }
        return std::ptr::null_mut();
    }
    all.push(std::ptr::null_mut());
    let list = Box::leak(all.into_boxed_slice()).as_mut_ptr();
    lists()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(list as usize, (count + 1, system as usize));
    if !num_devices.is_null() {
        // SAFETY: the caller's slot.
        unsafe { *num_devices = count as c_int };
    }
    list
}

/// `ibv_free_device_list`.
///
/// # Safety
/// `list` came from `ibv_get_device_list` and is freed once.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    let entry = lists()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(list as usize));
    match entry {
        Some((len, system)) => {
            // SAFETY: `list` is the boxed slice of `len` entries leaked above.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, len)) });
            if system != 0 {
                if let Some(f) = system::ibv_free_device_list() {
                    // SAFETY: the system's own list, freed once.
                    unsafe { f(system as *mut *mut ibv_device) };
                }
            }
        }
        None => {
            if let Some(f) = system::ibv_free_device_list() {
                // SAFETY: not ours: the system's list.
                unsafe { f(list) };
            }
        }
    }
}

/// `ibv_get_device_name`.
///
/// # Safety
/// `device` is a device of a list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    if let Some(d) = our_device(device) {
        return d.ibv.name.as_ptr();
    }
    match system::ibv_get_device_name() {
        // SAFETY: not ours: the system's device.
        Some(f) => unsafe { f(device) },
        None => std::ptr::null(),
    }
}

/// `ibv_get_device_guid`: ours is a locally administered EUI-64 with the device's position.
///
/// # Safety
/// `device` is a device of a list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    if let Some(d) = our_device(device) {
        return (0x0200_00ff_fe00_0000u64 | d.index as u64).to_be();
    }
    match system::ibv_get_device_guid() {
        // SAFETY: not ours: the system's device.
        Some(f) => unsafe { f(device) },
        None => 0,
    }
}

/// `ibv_get_device_index`: ours count from 1000, clear of kernel indices.
///
/// # Safety
/// `device` is a device of a list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    if let Some(d) = our_device(device) {
        return 1000 + d.index as c_int;
    }
    match system::ibv_get_device_index() {
        // SAFETY: not ours: the system's device.
        Some(f) => unsafe { f(device) },
        None => -1,
    }
}

/// An open device. `vctx` comes first and ends with the `ibv_context`, so our
/// `*mut ibv_context` points `offset_of!(verbs_context, context)` bytes into this.
#[repr(C)]
pub struct RsContext {
    vctx: verbs_context,
    /// Its device.
    pub device: &'static RsDevice,
    /// The pmd device.
    pub pmd: Arc<pmd::Context>,
    /// Its poll activity, which the helper thread watches.
    pub activity: Arc<PollActivity>,
    /// The default and backup devices when the device has a backup.
    pub resilient: Option<Arc<crate::resilient::ResilientDevice>>,
}

impl RsContext {
    /// The `ibv_context` callers hold.
    pub fn ibv(&self) -> *mut ibv_context {
        std::ptr::from_ref(&self.vctx.context).cast_mut()
    }
}

/// Our context behind `ctx`, if it is one.
///
/// # Safety
/// `ctx` is null or a live context (ours or the system's).
pub unsafe fn our_context<'a>(ctx: *mut ibv_context) -> Option<&'a RsContext> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: a live context starts with its device pointer.
    let device = unsafe { (*ctx).device };
    our_device(device)?;
    // SAFETY: the device is ours, so the context is the `vctx.context` of an RsContext.
    Some(unsafe {
        &*ctx
            .cast::<u8>()
            .sub(offset_of!(verbs_context, context))
            .cast::<RsContext>()
    })
}

type Opened = (
    Arc<pmd::Context>,
    Arc<PollActivity>,
    Option<Arc<crate::resilient::ResilientDevice>>,
);

fn open_pmd(device: &'static RsDevice) -> Result<Opened, String> {
    if let Some(backup) = &device.spec.backup_text {
        let mut open = device.resilient.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = &*open {
            return Ok(o.clone());
        }
        let settings = match &registry().config {
            Ok(Config {
                resilience: Some(r),
                ..
            }) => r,
            _ => return Err("no rendezvous configured".into()),
        };
        let (ctx, activity, dev) =
            crate::resilient::open(&device.spec, backup, settings, progress())?;
        let opened = (ctx, activity, Some(dev));
        *open = Some(opened.clone());
        return Ok(opened);
    }
    let mut open = device.open.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ctx) = open.0.upgrade() {
        return Ok((ctx, open.1.clone(), None));
    }
    let mode = progress();
    let config = pmd::ContextConfig {
        progress: mode.model(),
        ..pmd::ContextConfig::default()
    };
    let ctx = open_pmd_context(&device.spec.device_text, &config).map_err(|e| e.to_string())?;
    let activity = Arc::new(PollActivity::default());
    if mode == Progress::Poll && ctx.progress_model() == pmd::provider::ProgressModel::Manual {
        let (weak, act) = (Arc::downgrade(&ctx), activity.clone());
        std::thread::Builder::new()
            .name(format!("rs-progress-{}", device.spec.name))
            .spawn(move || helper(weak, act))
            .map_err(|e| format!("cannot start the progress helper thread: {e}"))?;
    }
    *open = (Arc::downgrade(&ctx), activity.clone());
    Ok((ctx, activity, None))
}

/// `ibv_open_device`.
///
/// # Safety
/// `device` is a device of a list.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    let Some(d) = our_device(device) else {
        return match system::ibv_open_device() {
            // SAFETY: not ours: the system's device.
            Some(f) => unsafe { f(device) },
            None => std::ptr::null_mut(),
        };
    };
    let (pmd, activity, resilient) = match open_pmd(d) {
        Ok(p) => p,
        Err(e) => {
            invalid(
                "ibv_open_device",
                &format!("{} ({}): {e}", d.spec.name, d.spec.device_text),
                libc::ENODEV,
            );
            return std::ptr::null_mut();
        }
    };
    let ops = ibv_context_ops {
        _compat_query_device: std::ptr::null_mut(),
        _compat_query_port: std::ptr::null_mut(),
        _compat_pd_mr: [std::ptr::null_mut(); 5],
        alloc_mw: None,
        bind_mw: None,
        dealloc_mw: None,
        _compat_create_cq: std::ptr::null_mut(),
        poll_cq: Some(if resilient.is_some() {
            crate::resilient::poll_cq
        } else {
            objects::poll_cq
        }),
        req_notify_cq: Some(if resilient.is_some() {
            crate::resilient::req_notify_cq
        } else {
            objects::req_notify_cq
        }),
        _compat_cq_srq: [std::ptr::null_mut(); 7],
        post_srq_recv: Some(crate::srq::post_srq_recv),
        _compat_qp: [std::ptr::null_mut(); 4],
        post_send: Some(if resilient.is_some() {
            crate::resilient::post_send
        } else {
            objects::post_send
        }),
        post_recv: Some(if resilient.is_some() {
            crate::resilient::post_recv
        } else {
            objects::post_recv
        }),
        _compat_tail: [std::ptr::null_mut(); 5],
    };
    let ctx = Box::new(RsContext {
        vctx: verbs_context {
            query_port: Some(query_port_ex),
            _ops_to_priv: [std::ptr::null_mut(); 26],
            query_device_ex: None,
            _ops_tail: [std::ptr::null_mut(); 11],
            sz: std::mem::size_of::<verbs_context>(),
            context: ibv_context {
                device,
                ops,
                cmd_fd: -1,
                async_fd: -1,
                num_comp_vectors: 1,
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                abi_compat: VERBS_ABI_IS_EXTENDED,
            },
        },
        device: d,
        pmd,
        activity,
        resilient,
    });
    Box::leak(ctx).ibv()
}

/// `ibv_close_device`.
///
/// # Safety
/// `ctx` is an open context, closed once, with every object on it destroyed.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    // SAFETY: forwarded from the caller.
    match unsafe { our_context(ctx) } {
        Some(c) => {
            // SAFETY: leaked by ibv_open_device, closed once.
            drop(unsafe { Box::from_raw(std::ptr::from_ref(c).cast_mut()) });
            0
        }
        None => match system::ibv_close_device() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx) },
            None => refuse("ibv_close_device", "no system libibverbs", libc::ENOSYS),
        },
    }
}

/// `ibv_query_device`.
///
/// # Safety
/// `ctx` is an open context; `attr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: forwarded from the caller.
    let Some(c) = (unsafe { our_context(ctx) }) else {
        return match system::ibv_query_device() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx, attr) },
            None => refuse("ibv_query_device", "no system libibverbs", libc::ENOSYS),
        };
    };
    let d = match c.pmd.query_device() {
        Ok(d) => d,
        Err(e) => return invalid("ibv_query_device", &e.to_string(), libc::EIO),
    };
    let mut out = ibv_device_attr {
        fw_ver: [0; 64],
        // SAFETY: our device.
        node_guid: unsafe { ibv_get_device_guid(c.ibv().read().device) },
        // SAFETY: as above.
        sys_image_guid: unsafe { ibv_get_device_guid(c.ibv().read().device) },
        max_mr_size: d.max_mr_size,
        page_size_cap: 0x1000 | 0x20_0000,
        vendor_id: 0,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: 1 << 16,
        max_qp_wr: d.max_qp_wr as c_int,
        device_cap_flags: 0,
        max_sge: d.max_sge as c_int,
        max_sge_rd: d.max_sge as c_int,
        max_cq: 1 << 16,
        max_cqe: d.max_cqe as c_int,
        max_mr: 1 << 16,
        max_pd: 1 << 16,
        max_qp_rd_atom: c_int::from(d.max_qp_rd_atom),
        max_ee_rd_atom: 0,
        max_res_rd_atom: c_int::from(d.max_qp_rd_atom) << 16,
        max_qp_init_rd_atom: c_int::from(d.max_qp_init_rd_atom),
        max_ee_init_rd_atom: 0,
        atomic_cap: IBV_ATOMIC_HCA,
        _unsupported: [0; 11],
        // A device with a backup makes no SRQs (docs/failover.md).
        max_srq: if c.resilient.is_some() {
            0
        } else {
            d.max_srq as c_int
        },
        max_srq_wr: if c.resilient.is_some() {
            0
        } else {
            d.max_srq_wr as c_int
        },
        max_srq_sge: if c.resilient.is_some() {
            0
        } else {
            d.max_srq_sge as c_int
        },
        max_pkeys: 1,
        local_ca_ack_delay: 16,
        phys_port_cnt: 1,
    };
    copy_name(&mut out.fw_ver, &d.fw_ver);
    // SAFETY: the caller's buffer.
    unsafe { attr.write(out) };
    0
}

fn port_attr(c: &RsContext, port: u8) -> Result<ibv_port_attr, c_int> {
    if port != 1 {
        return Err(invalid(
            "ibv_query_port",
            &format!("port {port}: railshift devices have port 1 only"),
            libc::EINVAL,
        ));
    }
    let p = c
        .pmd
        .query_port()
        .map_err(|e| invalid("ibv_query_port", &e.to_string(), libc::EIO))?;
    let up = p.state == pmd::verbs::PortState::Active;
    Ok(ibv_port_attr {
        state: p.state as c_uint,
        max_mtu: p.max_mtu as c_uint,
        active_mtu: p.active_mtu as c_uint,
        gid_tbl_len: c_int::from(p.gid_tbl_len),
        port_cap_flags: 0,
        max_msg_sz: 1 << 31,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        // 4X (2) at 25 Gb/s per lane (EDR, 32): what a 100 Gb/s RoCE port reports.
        active_width: 2,
        active_speed: 32,
        // LinkUp (5) or Disabled (3).
        phys_state: if up { 5 } else { 3 },
        link_layer: IBV_LINK_LAYER_ETHERNET,
        ..ibv_port_attr::default()
    })
}

use std::ffi::c_uint;

/// `verbs_context.query_port`, which the inline `ibv_query_port` calls.
unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: the inline wrapper passes the context it was called on, one of ours.
    let Some(c) = (unsafe { our_context(ctx) }) else {
        return libc::EINVAL;
    };
    match port_attr(c, port) {
        Ok(a) => {
            let n = len.min(std::mem::size_of::<ibv_port_attr>());
            // SAFETY: the caller's buffer holds `len` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    std::ptr::from_ref(&a).cast::<u8>(),
                    attr.cast::<u8>(),
                    n,
                )
            };
            0
        }
        Err(e) => e,
    }
}

/// `ibv_query_port@IBVERBS_1.1` (callers built before the inline wrapper pass the shorter
/// `_compat_ibv_port_attr`, which ends before `flags`).
///
/// # Safety
/// `ctx` is an open context; `attr` holds at least the compat struct.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { our_context(ctx) }.is_none() {
        return match system::ibv_query_port() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx, port, attr) },
            None => refuse("ibv_query_port", "no system libibverbs", libc::ENOSYS),
        };
    }
    // SAFETY: ours; the compat struct's length.
    unsafe { query_port_ex(ctx, port, attr, offset_of!(ibv_port_attr, flags)) }
}

fn gid(c: &RsContext, verb: &'static str, port: u32, index: u32) -> Result<ibv_gid, c_int> {
    if port != 1 {
        return Err(invalid(
            verb,
            &format!("port {port}: only port 1"),
            libc::EINVAL,
        ));
    }
    let index = u16::try_from(index)
        .map_err(|_| invalid(verb, &format!("GID index {index}"), libc::EINVAL))?;
    let g = c
        .pmd
        .query_gid(index)
        .map_err(|e| invalid(verb, &e.to_string(), libc::EINVAL))?;
    Ok(ibv_gid { raw: g.0 })
}

/// `ibv_query_gid`.
///
/// # Safety
/// `ctx` is an open context; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    out: *mut ibv_gid,
) -> c_int {
    // SAFETY: forwarded from the caller.
    let Some(c) = (unsafe { our_context(ctx) }) else {
        return match system::ibv_query_gid() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx, port, index, out) },
            None => -refuse("ibv_query_gid", "no system libibverbs", libc::ENOSYS).signum(),
        };
    };
    match gid(c, "ibv_query_gid", u32::from(port), index as u32) {
        Ok(g) => {
            // SAFETY: the caller's buffer.
            unsafe { out.write(g) };
            0
        }
        Err(_) => -1,
    }
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): RoCE v2 GIDs.
///
/// # Safety
/// `ctx` is an open context; `entry` holds `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: forwarded from the caller.
    let Some(c) = (unsafe { our_context(ctx) }) else {
        return match system::_ibv_query_gid_ex() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx, port, index, entry, flags, entry_size) },
            None => refuse("ibv_query_gid_ex", "no system libibverbs", libc::ENOSYS),
        };
    };
    if flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
        return invalid(
            "ibv_query_gid_ex",
            &format!("flags {flags:#x}, entry size {entry_size}"),
            libc::EINVAL,
        );
    }
    match gid(c, "ibv_query_gid_ex", port, index) {
        Ok(g) => {
            let e = ibv_gid_entry {
                gid: g,
                gid_index: index,
                port_num: port,
                gid_type: IBV_GID_TYPE_ROCE_V2,
                ndev_ifindex: 0,
            };
            // SAFETY: the caller's buffer, large enough (checked).
            unsafe { entry.write(e) };
            0
        }
        Err(e) => e,
    }
}

/// `ibv_query_gid_type@IBVERBS_PRIVATE_34` (ibv_devinfo's): RoCE v2.
///
/// # Safety
/// `ctx` is an open context; `ty` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    // SAFETY: forwarded from the caller.
    let Some(c) = (unsafe { our_context(ctx) }) else {
        return match system::ibv_query_gid_type() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx, port, index, ty) },
            None => -refuse("ibv_query_gid_type", "no system libibverbs", libc::ENOSYS).signum(),
        };
    };
    match gid(c, "ibv_query_gid_type", u32::from(port), index) {
        Ok(_) => {
            // SAFETY: the caller's slot.
            unsafe { ty.write(IBV_GID_TYPE_SYSFS_ROCE_V2) };
            0
        }
        Err(_) => -1,
    }
}

/// `ibv_query_pkey`: one entry, the default full-membership key.
///
/// # Safety
/// `ctx` is an open context; `pkey` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: forwarded from the caller.
    if unsafe { our_context(ctx) }.is_none() {
        return match system::ibv_query_pkey() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx, port, index, pkey) },
            None => -refuse("ibv_query_pkey", "no system libibverbs", libc::ENOSYS).signum(),
        };
    }
    if port != 1 || index != 0 {
        invalid(
            "ibv_query_pkey",
            &format!("port {port} index {index}: one P_Key at port 1 index 0"),
            libc::EINVAL,
        );
        return -1;
    }
    // SAFETY: the caller's slot.
    unsafe { pkey.write(0xffffu16.to_be()) };
    0
}

/// `struct ibv_async_event`.
#[repr(C)]
pub struct ibv_async_event {
    /// The element: the port number, or the `ibv_srq` of an SRQ event.
    pub element: u64,
    /// `enum ibv_event_type`.
    pub event_type: c_int,
}

/// `IBV_EVENT_SRQ_LIMIT_REACHED`.
const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;

/// `ibv_get_async_event`: on our devices, port and fatal events from the pmd
/// (`IBV_EVENT_PORT_ACTIVE`, `IBV_EVENT_PORT_ERR`, `IBV_EVENT_DEVICE_FATAL`) and
/// `IBV_EVENT_SRQ_LIMIT_REACHED` naming the SRQ; it blocks until one comes, as the real one
/// does.
///
/// # Safety
/// `ctx` is an open context; `event` is valid for a write of `struct ibv_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(ctx: *mut ibv_context, event: *mut c_void) -> c_int {
    // SAFETY: forwarded from the caller.
    let Some(c) = (unsafe { our_context(ctx) }) else {
        return match system::ibv_get_async_event() {
            // SAFETY: not ours.
            Some(f) => unsafe { f(ctx, event) },
            None => -refuse("ibv_get_async_event", "no system libibverbs", libc::ENOSYS).signum(),
        };
    };
    loop {
        if let Some(h) = c.pmd.poll_srq_event() {
            // An SRQ destroyed since has no one left to tell.
            if let Some(srq) = crate::srq::by_handle(ctx, h) {
                // SAFETY: the caller's buffer.
                unsafe {
                    event.cast::<ibv_async_event>().write(ibv_async_event {
                        element: srq,
                        event_type: IBV_EVENT_SRQ_LIMIT_REACHED,
                    })
                };
                return 0;
            }
        }
        if let Some(ev) = c.pmd.poll_port_event() {
            let (element, event_type) = match ev {
                pmd::provider::PortEvent::Active => (1, 9),
                pmd::provider::PortEvent::Down => (1, 10),
                pmd::provider::PortEvent::DeviceFatal => (0, 8),
            };
            // SAFETY: the caller's buffer.
            unsafe {
                event.cast::<ibv_async_event>().write(ibv_async_event {
                    element,
                    event_type,
                })
            };
            return 0;
        }
        match c.pmd.port_event_fd() {
            Some(fd) => {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, 1000) };
            }
            None => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// Sets errno for a refused call and returns `NULL`, for verbs that return a pointer.
pub fn null_with<T>(errno: c_int) -> *mut T {
    set_errno(errno);
    std::ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two counts share one word: a driving thread is counted as a poll and as driving
    /// until its guard drops; a poll alone counts only as a poll; a driving count past the
    /// low half's first bits does not reach the poll count.
    #[test]
    fn the_poll_activity_counts_polls_and_driving_threads_apart() {
        let activity = PollActivity::default();
        assert!(!activity.is_driven());
        let first = activity.driving();
        let second = activity.driving();
        assert!(activity.is_driven());
        assert_eq!(activity.count(), 2);
        activity.polled();
        assert_eq!(activity.count(), 3);
        drop(first);
        assert!(activity.is_driven());
        drop(second);
        assert!(!activity.is_driven());
        assert_eq!(activity.count(), 3);
        let many: Vec<_> = (0..300).map(|_| activity.driving()).collect();
        assert_eq!(activity.count(), 303);
        drop(many);
        assert!(!activity.is_driven());
        assert_eq!(activity.count(), 303);
    }
}
