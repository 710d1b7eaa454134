//! Finding and opening a verbs device by name, and the GID the pmd calls index 0.

use std::ffi::CStr;
use std::net::IpAddr;
use std::path::PathBuf;
use std::ptr::NonNull;

use rdma_sys::{
    ibv_ack_async_event, ibv_async_event, ibv_close_device, ibv_context, ibv_device,
    ibv_free_device_list, ibv_get_async_event, ibv_get_device_list, ibv_get_device_name, ibv_gid,
    ibv_open_device, ibv_query_gid,
};

use super::dv;
use crate::provider::VerbsError;
use crate::verbs::Gid;

/// The devices `ibv_get_device_list` reports, freed on drop.
struct DeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// The list, or why there is none (`ibv_get_device_list` returns NULL with `ENOSYS` when
    /// the kernel has no RDMA stack, as on machines without RDMA hardware).
    fn get() -> Result<DeviceList, std::io::Error> {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer; the call has no other preconditions.
        let list = unsafe { ibv_get_device_list(&mut n) };
        match NonNull::new(list) {
            Some(list) => Ok(DeviceList {
                list,
                len: usize::try_from(n).unwrap_or(0),
            }),
            None => Err(std::io::Error::last_os_error()),
        }
    }

    fn devices(&self) -> impl Iterator<Item = (*mut ibv_device, String)> + '_ {
        (0..self.len).filter_map(move |i| {
            // SAFETY: the list holds `len` device pointers (NULL-terminated after them), valid
            // until `ibv_free_device_list`, which only our Drop calls.
            let dev = unsafe { *self.list.as_ptr().add(i) };
            if dev.is_null() {
                return None;
            }
            // SAFETY: `dev` is a device of the list; its name is a NUL-terminated string that
            // lives as long as the device.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) };
            Some((dev, name.to_string_lossy().into_owned()))
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once. Contexts opened
        // from its devices stay valid (libibverbs reference-counts the devices).
        unsafe { ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// The names of the RDMA devices on this machine (empty when there are none, which is also
/// what a machine without a kernel RDMA stack reports).
pub fn device_names() -> Vec<String> {
    match DeviceList::get() {
        Ok(list) => list.devices().map(|(_, name)| name).collect(),
        Err(_) => Vec::new(),
    }
}

/// An opened verbs device context, closed when the last holder drops it. The provider and
/// every completion channel hold it, so the context outlives everything made from it.
pub(super) struct Device {
    ctx: NonNull<ibv_context>,
    ibdev: String,
}

// SAFETY: a verbs context may be used from any thread; libibverbs serialises what needs it.
unsafe impl Send for Device {}
// SAFETY: as above; we never mutate the context struct ourselves.
unsafe impl Sync for Device {}

impl Device {
    /// Opens the device called `ibdev`. `name` is the full device name, for errors.
    pub fn open(name: &str, ibdev: &str) -> Result<Device, VerbsError> {
        let no_device = |reason: String| VerbsError::NoDevice {
            name: name.to_string(),
            reason,
        };
        let list = DeviceList::get().map_err(|e| {
            no_device(format!(
                "ibv_get_device_list found no RDMA devices ({e}); this machine has no RDMA \
                 hardware, or the kernel modules (ib_uverbs, mlx5_ib) are not loaded"
            ))
        })?;
        let found: Vec<(*mut ibv_device, String)> = list.devices().collect();
        let Some(&(dev, _)) = found.iter().find(|(_, n)| n == ibdev) else {
            let present: Vec<&str> = found.iter().map(|(_, n)| n.as_str()).collect();
            return Err(no_device(if present.is_empty() {
                "ibv_get_device_list lists no RDMA devices".to_string()
            } else {
                format!("RDMA devices present: {}", present.join(", "))
            }));
        };
        // SAFETY: `dev` is a live device of `list`.
        if !unsafe { dv::mlx5dv_is_supported(dev) } {
            return Err(VerbsError::Unsupported {
                device: name.to_string(),
                verb: "open_device",
                what: format!("{ibdev} is not driven by libmlx5 (not a ConnectX)"),
            });
        }
        // SAFETY: as above.
        let ctx = unsafe { ibv_open_device(dev) };
        let ctx = NonNull::new(ctx).ok_or_else(|| VerbsError::Failed {
            device: name.to_string(),
            verb: "ibv_open_device",
            reason: std::io::Error::last_os_error().to_string(),
        })?;
        let device = Device {
            ctx,
            ibdev: ibdev.to_string(),
        };
        // Async events are read without blocking, from the failover service's poll loop.
        let fd = device.async_fd();
        // SAFETY: fcntl on the context's own descriptor, which is open while the context is.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            tracing::warn!(ibdev = %device.ibdev, error = %std::io::Error::last_os_error(), "mlx5: the async event descriptor stays blocking; async events are not read");
        }
        Ok(device)
    }

    /// The context's async event descriptor (`ibv_context::async_fd`), non-blocking.
    pub fn async_fd(&self) -> std::os::fd::RawFd {
        // SAFETY: the context is open; `async_fd` is a plain integer field.
        unsafe { (*self.ctx()).async_fd }
    }

    /// The type (`enum ibv_event_type`, as its number) of the oldest unread async event,
    /// acknowledged; `None` when none is waiting (or the descriptor is blocking).
    pub fn next_async_event(&self) -> Option<u32> {
        /// `struct ibv_async_event` with its event type as a plain integer: the kernel may
        /// report a type newer than the bindings' Rust enum knows, which must not be read
        /// into that enum.
        #[repr(C)]
        struct RawAsyncEvent {
            /// The union of the object pointers and the port number: pointer-sized.
            element: *mut libc::c_void,
            event_type: u32,
        }
        let mut raw = RawAsyncEvent {
            element: std::ptr::null_mut(),
            event_type: 0,
        };
        let event = (&mut raw as *mut RawAsyncEvent).cast::<ibv_async_event>();
        // SAFETY: the context is open; `event` points to writable memory of the size and
        // alignment of `struct ibv_async_event` (a pointer-sized union, then a C enum), which
        // libibverbs fills; with a non-blocking descriptor the call returns -1 when nothing is
        // waiting.
        if unsafe { ibv_get_async_event(self.ctx(), event) } != 0 {
            return None;
        }
        let kind = raw.event_type;
        // SAFETY: an event just returned by ibv_get_async_event, acknowledged once.
        unsafe { ibv_ack_async_event(event) };
        Some(kind)
    }

    /// The context, for verbs calls.
    pub fn ctx(&self) -> *mut ibv_context {
        self.ctx.as_ptr()
    }

    /// GID `index` of port 1 as the device numbers it.
    pub fn hw_gid(&self, index: u16) -> Result<Gid, std::io::Error> {
        // SAFETY: all-zero bytes are a valid ibv_gid (a union of byte arrays).
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `gid` is a valid out-pointer.
        let rc = unsafe { ibv_query_gid(self.ctx(), 1, i32::from(index), &mut gid) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: every bit pattern is a valid [u8; 16].
        Ok(Gid(unsafe { gid.raw }))
    }

    /// The device's index of the GID the pmd calls index 0 (see [`GidMap`]), and that GID:
    /// `held`'s entry when the device has one already (see [`GidMap::resolve`]).
    pub fn gid_map(
        &self,
        table_len: u16,
        held: Option<Gid>,
    ) -> Result<(GidMap, Option<Gid>), String> {
        let sysfs = PathBuf::from(format!(
            "/sys/class/infiniband/{}/ports/1/gid_attrs/types",
            self.ibdev
        ));
        GidMap::resolve(table_len, held, |i| {
            let kind = std::fs::read_to_string(sysfs.join(i.to_string())).ok()?;
            let gid = self.hw_gid(i).ok()?;
            Some((kind, gid))
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device and closed once, after every object made from it
        // (they hold this Device alive).
        let rc = unsafe { ibv_close_device(self.ctx.as_ptr()) };
        if rc != 0 {
            tracing::error!(ibdev = %self.ibdev, error = %std::io::Error::last_os_error(), "ibv_close_device failed");
        }
    }
}

/// How the pmd's GID indices map to the device's.
///
/// The pmd's contract is that GID 0 is the device's own address (`Context::query_gid`), and
/// `AddressVector::to_gid` sends from GID 0. On a ConnectX in Ethernet mode, device index 0 is
/// the RoCE v1 link-local GID; the RoCE v2 GID of the netdev's IPv4 address sits further down
/// the table. So the provider swaps two entries: pmd index 0 is the preferred device index `p`
/// (the first RoCE v2 GID of an IPv4 address, else the first RoCE v2 GID, else 0) and pmd index
/// `p` is device index 0; every other index is the same on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidMap {
    preferred: u16,
}

impl GidMap {
    /// The same index on both sides.
    pub const IDENTITY: GidMap = GidMap { preferred: 0 };

    /// Chooses the preferred index among `table_len` entries; `entry(i)` gives the GID type as
    /// sysfs writes it (`RoCE v2`, `IB/RoCE v1`) and the GID, or `None` for an empty slot.
    pub fn choose(table_len: u16, entry: impl Fn(u16) -> Option<(String, Gid)>) -> GidMap {
        let mut first_v2 = None;
        for i in 0..table_len {
            let Some((kind, gid)) = entry(i) else {
                continue;
            };
            if kind.trim() != "RoCE v2" || gid == Gid::default() {
                continue;
            }
            if matches!(gid.to_ip(), IpAddr::V4(_)) {
                return GidMap { preferred: i };
            }
            first_v2.get_or_insert(i);
        }
        GidMap {
            preferred: first_v2.unwrap_or(0),
        }
    }

    /// The map for a device whose pmd GID 0 is `held` once it has been resolved: the RoCE v2
    /// entry holding that GID, wherever it now sits, or [`GidMap::choose`]'s pick the first
    /// time. Returns the GID to hold too (none while the pick is not a RoCE v2 GID).
    ///
    /// Why hold it: peers know the device by that GID (they connected to it), and the table
    /// is not fixed: an address removed and added again on the netdev comes back at another
    /// index (NCCL PR #2183), and with two addresses the first choice can move to the other.
    /// While the held GID is absent (its address removed) there is no right index; the error
    /// names the GID, and the caller (a rearm or repair) fails and tries again later, when the
    /// address may be back.
    pub fn resolve(
        table_len: u16,
        held: Option<Gid>,
        entry: impl Fn(u16) -> Option<(String, Gid)>,
    ) -> Result<(GidMap, Option<Gid>), String> {
        let Some(held) = held else {
            let map = GidMap::choose(table_len, &entry);
            // Only a RoCE v2 GID is held: the identity map of a table without one (no
            // sysfs, an InfiniBand port) stays the identity map.
            let gid = entry(map.preferred)
                .filter(|(kind, g)| kind.trim() == "RoCE v2" && *g != Gid::default())
                .map(|(_, g)| g);
            return Ok((map, gid));
        };
        (0..table_len)
            .find(|&i| entry(i).is_some_and(|(kind, g)| kind.trim() == "RoCE v2" && g == held))
            .map(|preferred| (GidMap { preferred }, Some(held)))
            .ok_or_else(|| {
                format!(
                    "the device's GID {} ({}) is no longer in its GID table (its address removed?)",
                    held,
                    held.to_ip()
                )
            })
    }

    /// The device index of pmd index `index`.
    pub fn to_device(self, index: u16) -> u16 {
        if index == 0 {
            self.preferred
        } else if index == self.preferred {
            0
        } else {
            index
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn link_local() -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[15] = 1;
        Gid(g)
    }

    #[test]
    fn without_devices_opening_names_the_missing_stack_and_does_not_crash() {
        if !device_names().is_empty() {
            println!("skipped: this machine has RDMA devices");
            return;
        }
        let Err(err) = Device::open("mlx5:mlx5_0", "mlx5_0") else {
            panic!("opened a device on a machine that lists none");
        };
        let text = err.to_string();
        assert!(matches!(err, VerbsError::NoDevice { .. }), "{text}");
        assert!(text.contains("mlx5:mlx5_0"), "{text}");
        assert!(text.contains("no RDMA devices"), "{text}");
    }

    #[test]
    fn gid_zero_is_the_first_roce_v2_gid_of_an_ipv4_address() {
        // A ConnectX table: v1 and v2 link-local, then v1 and v2 of 198.18.0.1.
        let v4 = Gid::from(Ipv4Addr::new(198, 18, 0, 1));
        let table = [
            ("IB/RoCE v1", link_local()),
            ("RoCE v2", link_local()),
            ("IB/RoCE v1", v4),
            ("RoCE v2", v4),
        ];
        let map = GidMap::choose(4, |i| {
            table
                .get(usize::from(i))
                .map(|(k, g)| (format!("{k}\n"), *g))
        });
        assert_eq!(map.to_device(0), 3);
        assert_eq!(map.to_device(3), 0);
        assert_eq!(map.to_device(1), 1);
        assert_eq!(map.to_device(2), 2);
    }

    /// A table as sysfs and ibv_query_gid give it.
    fn table<'a>(entries: &'a [(&'static str, Gid)]) -> impl Fn(u16) -> Option<(String, Gid)> + 'a {
        |i| {
            entries
                .get(usize::from(i))
                .map(|(k, g)| (format!("{k}\n"), *g))
        }
    }

    #[test]
    fn the_held_gid_is_found_wherever_a_readded_address_puts_it_and_its_absence_is_an_error() {
        let a = Gid::from(Ipv4Addr::new(198, 18, 0, 1));
        let b = Gid::from(Ipv4Addr::new(198, 18, 0, 9));
        // First resolution: the policy's pick (the first RoCE v2 IPv4 GID), returned to hold.
        let before = [("RoCE v2", link_local()), ("RoCE v2", a), ("RoCE v2", b)];
        let (map, held) = GidMap::resolve(3, None, table(&before)).unwrap();
        assert_eq!((map.to_device(0), held), (1, Some(a)));
        let held = held.unwrap();
        // `a` removed: no index is right, and the error names the address.
        let removed = [("RoCE v2", link_local()), ("RoCE v2", b)];
        let err = GidMap::resolve(2, Some(held), table(&removed)).unwrap_err();
        assert!(err.contains("198.18.0.1"), "{err}");
        // `a` added again, now after `b`: found at its new index, not the policy's `b`.
        let readded = [("RoCE v2", link_local()), ("RoCE v2", b), ("RoCE v2", a)];
        let (map, gid) = GidMap::resolve(3, Some(held), table(&readded)).unwrap();
        assert_eq!((map.to_device(0), gid), (2, Some(a)));
        assert_eq!(GidMap::choose(3, table(&readded)).to_device(0), 1);
        // Only as RoCE v2: a v1 entry of the same GID is not it.
        let v1_only = [("IB/RoCE v1", a)];
        assert!(GidMap::resolve(1, Some(held), table(&v1_only)).is_err());
        // Nothing RoCE v2 at the first resolution: the identity map, nothing held.
        let (map, gid) = GidMap::resolve(8, None, |_| None).unwrap();
        assert_eq!((map, gid), (GidMap::IDENTITY, None));
    }

    #[test]
    fn without_an_ipv4_gid_the_first_roce_v2_gid_is_preferred_and_else_index_zero() {
        let only_v6 = [("IB/RoCE v1", link_local()), ("RoCE v2", link_local())];
        let map = GidMap::choose(2, |i| {
            only_v6
                .get(usize::from(i))
                .map(|(k, g)| (k.to_string(), *g))
        });
        assert_eq!(map.to_device(0), 1);
        // Infiniband link layer or no sysfs: nothing is RoCE v2; the identity map.
        let map = GidMap::choose(8, |_| None);
        assert_eq!((map.to_device(0), map.to_device(5)), (0, 5));
    }
}
