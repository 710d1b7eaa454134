//! The setting of the control-path benches (`control_verbs`, `qp_memory`): an in-process
//! softnic fabric of four ports (host A's default and backup devices, host B's), registered
//! under a fresh name and unregistered when dropped, and the QP shape they create. No root and
//! no network.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pmd::provider::soft::{register_fabric, unregister_fabric};
use pmd::{AddressVector, Context, ContextConfig, Gid, Mtu, QpAttr, QpCaps};

/// Port numbers of [`Fabric`]: host A's default and backup devices, then host B's.
pub const A_DEFAULT: u32 = 0;
/// Host A's backup device.
pub const A_BACKUP: u32 = 1;
/// Host B's default device.
pub const B_DEFAULT: u32 = 2;
/// Host B's backup device.
pub const B_BACKUP: u32 = 3;

/// A registered fabric of four ports.
pub struct Fabric {
    name: String,
    fabric: softnic::Fabric,
}

impl Fabric {
    /// A fresh fabric (5 us one-way delay) named after this process and a counter.
    pub fn new() -> Fabric {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "bench{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let fabric = softnic::Fabric::new(1, Duration::from_micros(5));
        for addr in ["198.18.0.1", "198.18.1.1", "198.18.0.2", "198.18.1.2"] {
            fabric.add_port(addr.parse().expect("an address"));
        }
        register_fabric(&name, &fabric);
        Fabric { name, fabric }
    }

    /// Takes `port`'s link down or up (a failed NIC port or cable).
    pub fn set_link(&self, port: u32, up: bool) {
        self.fabric.set_link(port as usize, up);
    }

    /// Opens the device on `port` (see the port constants).
    pub fn open(&self, port: u32) -> Arc<Context> {
        self.open_for(port, 0)
    }

    /// Opens the device on `port` with a key table for `qps` QPs, sized as the apps size
    /// theirs ([`ContextConfig::key_table_slots_for`]).
    pub fn open_for(&self, port: u32, qps: u32) -> Arc<Context> {
        let config = ContextConfig {
            key_table_slots: ContextConfig::key_table_slots_for(qps),
            ..ContextConfig::default()
        };
        Context::open(&format!("fabric:{}/{port}", self.name), &config)
            .expect("open a fabric device")
    }
}

impl Default for Fabric {
    fn default() -> Fabric {
        Fabric::new()
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        unregister_fabric(&self.name);
    }
}

/// The QP shape the control-path benches create: 128 send and 128 receive WQEs of one SGE
/// (perftest's default depth), no inline data.
pub fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 128,
        max_recv_wr: 128,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// RTR attributes towards `peer`'s QP `qpn` (PSN 0, path MTU 1024).
pub fn rtr(peer: Gid, qpn: u32) -> QpAttr {
    QpAttr::rtr(AddressVector::to_gid(peer), qpn, 0, Mtu::Mtu1024)
}
