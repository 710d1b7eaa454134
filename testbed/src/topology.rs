//! The rail-optimized topology: two hosts with two NICs each, two rail switches and a
//! management network, all in network namespaces.
//!
//! ```text
//!            rail switch 0 (ns <p>-sw0, bridge br0)        rail switch 1 (ns <p>-sw1, bridge br1)
//!              port pa        port pb                        port pa        port pb
//!               |               |                              |               |
//!   host A nic0 198.18.0.1   host B nic0 198.18.0.2   host A nic1 198.18.1.1   host B nic1 198.18.1.2
//!   (ns <p>-a, initiator)    (ns <p>-b, responder)
//!   mgmt0 198.18.100.1 ---- management switch (ns <p>-mgmt, bridge brm, 198.18.100.254) ---- mgmt0 198.18.100.2
//! ```
//!
//! Every address is in 198.18.0.0/15, the benchmarking range; no namespace gets a default route
//! and nothing is attached to the machine's own interfaces, so no packet can leave the testbed.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::ip::{self, ip, ip_in, IpError};

/// Number of NICs (and rails) per host.
pub const RAILS: u8 = 2;

/// Where `up` records the topology it built, so `fail`, `scenario` and `down` can find it.
pub const STATE_DIR: &str = "/run/railshift";

/// What `up` is asked to build.
#[derive(Debug, Clone)]
pub struct TopologySpec {
    /// Prefix of every namespace name: `<prefix>-a`, `<prefix>-sw0`, ...
    pub prefix: String,
    /// MTU of the data links (the rail links); 9000 lets RoCE use a 4096-byte path MTU.
    pub mtu: u32,
    /// How many 2 MiB hugepages to make sure the machine has reserved (0: leave as is).
    pub hugepages: u32,
}

impl Default for TopologySpec {
    fn default() -> Self {
        TopologySpec {
            prefix: "rs".to_owned(),
            mtu: 9000,
            hugepages: 64,
        }
    }
}

/// Why the testbed could not be built or torn down.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// Namespaces need root.
    #[error("the testbed needs root (network namespaces and veth); run as root")]
    NotRoot,
    /// A prefix that would make names too long or unsafe to use in commands.
    #[error("bad prefix {0:?}: use 1 to 8 lowercase letters or digits")]
    BadPrefix(String),
    /// A testbed with this prefix is already up.
    #[error("a testbed with prefix {prefix:?} is already up (namespaces {found}); run `shift-testbed down --prefix {prefix}` first")]
    AlreadyUp {
        /// The prefix asked for.
        prefix: String,
        /// The namespaces found.
        found: String,
    },
    /// An MTU outside what veth and RoCE can use.
    #[error("bad MTU {0}: use 1280..=9000")]
    BadMtu(u32),
    /// An `ip` command failed.
    #[error(transparent)]
    Ip(#[from] IpError),
    /// A helper command (`sh` writing a sysctl) failed.
    #[error("{what}: {detail}")]
    Command {
        /// What was being done.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// The state file could not be read or written.
    #[error("state file {path}: {detail}")]
    State {
        /// The path.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// Which end of a connection a host plays in the scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Host A: runs the client, which posts the work.
    Initiator,
    /// Host B: runs the server.
    Responder,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Initiator => "initiator",
            Role::Responder => "responder",
        })
    }
}

/// One host NIC and the switch port it is cabled to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicInfo {
    /// Interface name inside the host namespace (`nic0`, `nic1`).
    pub name: String,
    /// The rail (and switch) it belongs to.
    pub rail: u8,
    /// Its IPv4 address.
    pub addr: String,
    /// Its MAC address, fixed and locally administered, so captures and neighbour tables read
    /// the same in every run.
    #[serde(default)]
    pub mac: String,
    /// Prefix length of the rail subnet.
    pub prefix_len: u8,
    /// Namespace of the rail switch.
    pub switch_netns: String,
    /// The switch port (interface in the switch namespace) this NIC is cabled to.
    pub switch_port: String,
    /// The softnic device name an application inside the host uses for this NIC.
    pub device: String,
}

/// One host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    /// `a` or `b`.
    pub name: String,
    /// Initiator (A) or responder (B).
    pub role: Role,
    /// Its network namespace.
    pub netns: String,
    /// Its data NICs, rail 0 first.
    pub nics: Vec<NicInfo>,
    /// Its management interface.
    pub mgmt_if: String,
    /// Its management address (out-of-band exchange, Redis).
    pub mgmt_addr: String,
}

/// One rail switch: a bridge in its own namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchInfo {
    /// The rail it serves.
    pub rail: u8,
    /// Its namespace.
    pub netns: String,
    /// The bridge interface.
    pub bridge: String,
    /// Its ports, one per host, in host order (A, B).
    pub ports: Vec<String>,
}

/// The management network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MgmtInfo {
    /// Namespace of the management switch, which also hosts Redis.
    pub netns: String,
    /// The bridge.
    pub bridge: String,
    /// Address of the management switch itself (where Redis listens).
    pub addr: String,
    /// Prefix length of the management subnet.
    pub prefix_len: u8,
}

/// Everything `up` built, written as JSON for scripts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestbedInfo {
    /// The namespace prefix.
    pub prefix: String,
    /// MTU of the rail links.
    pub mtu: u32,
    /// Host A (initiator) then host B (responder).
    pub hosts: Vec<HostInfo>,
    /// Rail switch 0 then rail switch 1.
    pub switches: Vec<SwitchInfo>,
    /// The management network.
    pub mgmt: MgmtInfo,
    /// 2 MiB hugepages reserved on the machine after `up` (0 when none could be).
    pub hugepages_total: u32,
}

impl TestbedInfo {
    /// The address plan and names for `spec`, without touching the kernel.
    pub fn plan(spec: &TopologySpec) -> TestbedInfo {
        let p = &spec.prefix;
        let host = |index: u8, name: &str, role: Role| HostInfo {
            name: name.to_owned(),
            role,
            netns: format!("{p}-{name}"),
            nics: (0..RAILS)
                .map(|rail| NicInfo {
                    name: format!("nic{rail}"),
                    rail,
                    addr: format!("198.18.{rail}.{}", index + 1),
                    // Locally administered (02:), then the rail and the host.
                    mac: format!("02:00:c6:12:{rail:02x}:{:02x}", index + 1),
                    prefix_len: 24,
                    switch_netns: format!("{p}-sw{rail}"),
                    switch_port: format!("p{name}"),
                    device: format!("soft:nic{rail}"),
                })
                .collect(),
            mgmt_if: "mgmt0".to_owned(),
            mgmt_addr: format!("198.18.100.{}", index + 1),
        };
        TestbedInfo {
            prefix: p.clone(),
            mtu: spec.mtu,
            hosts: vec![host(0, "a", Role::Initiator), host(1, "b", Role::Responder)],
            switches: (0..RAILS)
                .map(|rail| SwitchInfo {
                    rail,
                    netns: format!("{p}-sw{rail}"),
                    bridge: format!("br{rail}"),
                    ports: vec!["pa".to_owned(), "pb".to_owned()],
                })
                .collect(),
            mgmt: MgmtInfo {
                netns: format!("{p}-mgmt"),
                bridge: "brm".to_owned(),
                addr: "198.18.100.254".to_owned(),
                prefix_len: 24,
            },
            hugepages_total: 0,
        }
    }

    /// Every namespace of this testbed.
    pub fn namespaces(&self) -> Vec<String> {
        let mut all: Vec<String> = self.hosts.iter().map(|h| h.netns.clone()).collect();
        all.extend(self.switches.iter().map(|s| s.netns.clone()));
        all.push(self.mgmt.netns.clone());
        all
    }

    /// The host playing `role`.
    pub fn host(&self, role: Role) -> &HostInfo {
        // `plan` always builds one initiator and one responder.
        self.hosts
            .iter()
            .find(|h| h.role == role)
            .unwrap_or(&self.hosts[0])
    }

    /// Path of the state file for `prefix`.
    pub fn state_path(prefix: &str) -> PathBuf {
        PathBuf::from(STATE_DIR).join(format!("testbed-{prefix}.json"))
    }

    /// Reads the state file `up` wrote for `prefix`.
    pub fn load(prefix: &str) -> Result<TestbedInfo, TopologyError> {
        let path = Self::state_path(prefix);
        let text = std::fs::read_to_string(&path).map_err(|e| TopologyError::State {
            path: path.clone(),
            detail: format!("{e} (is the testbed up? run `shift-testbed up`)"),
        })?;
        serde_json::from_str(&text).map_err(|e| TopologyError::State {
            path,
            detail: e.to_string(),
        })
    }

    fn save(&self) -> Result<(), TopologyError> {
        let path = Self::state_path(&self.prefix);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(STATE_DIR)?;
            let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
            std::fs::write(&path, text)
        };
        write().map_err(|e| TopologyError::State {
            path: path.clone(),
            detail: e.to_string(),
        })
    }
}

fn check_spec(spec: &TopologySpec) -> Result<(), TopologyError> {
    let ok = !spec.prefix.is_empty()
        && spec.prefix.len() <= 8
        && spec
            .prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !ok {
        return Err(TopologyError::BadPrefix(spec.prefix.clone()));
    }
    if !(1280..=9000).contains(&spec.mtu) {
        return Err(TopologyError::BadMtu(spec.mtu));
    }
    Ok(())
}

/// Namespaces that belong to the testbed with `prefix`.
fn existing_namespaces(prefix: &str) -> Result<Vec<String>, TopologyError> {
    let plan = TestbedInfo::plan(&TopologySpec {
        prefix: prefix.to_owned(),
        ..TopologySpec::default()
    });
    let wanted = plan.namespaces();
    Ok(ip::list_namespaces()?
        .into_iter()
        .filter(|ns| wanted.contains(ns))
        .collect())
}

/// Builds the testbed. On any failure it removes what it had built and returns the error.
pub fn up(spec: &TopologySpec) -> Result<TestbedInfo, TopologyError> {
    check_spec(spec)?;
    if !ip::is_root() {
        return Err(TopologyError::NotRoot);
    }
    let found = existing_namespaces(&spec.prefix)?;
    if !found.is_empty() {
        return Err(TopologyError::AlreadyUp {
            prefix: spec.prefix.clone(),
            found: found.join(", "),
        });
    }
    let mut info = TestbedInfo::plan(spec);
    if let Err(e) = build(&info) {
        // Leave nothing half-built behind; the build error is the one worth reporting.
        if let Err(cleanup) = down(&spec.prefix) {
            tracing::warn!(error = %cleanup, "cleanup after a failed `up` also failed");
        }
        return Err(e);
    }
    info.hugepages_total = reserve_hugepages(spec.hugepages);
    info.save()?;
    Ok(info)
}

fn build(info: &TestbedInfo) -> Result<(), TopologyError> {
    for ns in info.namespaces() {
        ip(&["netns", "add", &ns])?;
        ip_in(&ns, &["link", "set", "dev", "lo", "up"])?;
        // No IPv6 inside the testbed: no duplicate-address detection delays, no router
        // solicitations, and RoCEv2 runs on the IPv4 addresses.
        write_sysctl(&ns, "net/ipv6/conf/all/disable_ipv6", "1")?;
        write_sysctl(&ns, "net/ipv6/conf/default/disable_ipv6", "1")?;
    }
    let mtu = info.mtu.to_string();
    for sw in &info.switches {
        ip_in(
            &sw.netns,
            &["link", "add", "name", &sw.bridge, "type", "bridge"],
        )?;
        ip_in(
            &sw.netns,
            &["link", "set", "dev", &sw.bridge, "mtu", &mtu, "up"],
        )?;
    }
    for host in &info.hosts {
        for nic in &host.nics {
            // One veth a cable: the host end is the NIC, the switch end is the switch port.
            ip(&[
                "link",
                "add",
                "name",
                &nic.name,
                "netns",
                &host.netns,
                "address",
                &nic.mac,
                "mtu",
                &mtu,
                "type",
                "veth",
                "peer",
                "name",
                &nic.switch_port,
                "netns",
                &nic.switch_netns,
                "mtu",
                &mtu,
            ])?;
            let bridge = &info.switches[usize::from(nic.rail)].bridge;
            ip_in(
                &nic.switch_netns,
                &[
                    "link",
                    "set",
                    "dev",
                    &nic.switch_port,
                    "master",
                    bridge,
                    "up",
                ],
            )?;
            let cidr = format!("{}/{}", nic.addr, nic.prefix_len);
            ip_in(&host.netns, &["addr", "add", &cidr, "dev", &nic.name])?;
            ip_in(&host.netns, &["link", "set", "dev", &nic.name, "up"])?;
        }
    }
    let m = &info.mgmt;
    ip_in(
        &m.netns,
        &["link", "add", "name", &m.bridge, "type", "bridge"],
    )?;
    ip_in(&m.netns, &["link", "set", "dev", &m.bridge, "up"])?;
    let mgmt_cidr = format!("{}/{}", m.addr, m.prefix_len);
    ip_in(&m.netns, &["addr", "add", &mgmt_cidr, "dev", &m.bridge])?;
    for host in &info.hosts {
        let port = format!("m{}", host.name);
        ip(&[
            "link",
            "add",
            "name",
            &host.mgmt_if,
            "netns",
            &host.netns,
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &m.netns,
        ])?;
        ip_in(
            &m.netns,
            &["link", "set", "dev", &port, "master", &m.bridge, "up"],
        )?;
        let cidr = format!("{}/{}", host.mgmt_addr, m.prefix_len);
        ip_in(&host.netns, &["addr", "add", &cidr, "dev", &host.mgmt_if])?;
        ip_in(&host.netns, &["link", "set", "dev", &host.mgmt_if, "up"])?;
    }
    Ok(())
}

/// Writes `/proc/sys/<key>` inside namespace `ns`.
fn write_sysctl(ns: &str, key: &str, value: &str) -> Result<(), TopologyError> {
    let script = format!("echo {value} > /proc/sys/{key}");
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", &script])
        .output()
        .map_err(|e| TopologyError::Command {
            what: format!("setting {key} in {ns}"),
            detail: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(TopologyError::Command {
            what: format!("setting {key} in {ns}"),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Makes sure at least `wanted` 2 MiB hugepages are reserved; returns how many are.
fn reserve_hugepages(wanted: u32) -> u32 {
    const PATH: &str = "/proc/sys/vm/nr_hugepages";
    let read = || -> Option<u32> { std::fs::read_to_string(PATH).ok()?.trim().parse().ok() };
    let now = read().unwrap_or(0);
    if wanted > now {
        if let Err(e) = std::fs::write(PATH, wanted.to_string()) {
            tracing::warn!(error = %e, wanted, "could not reserve hugepages; the driver falls back to 4 KiB pages");
        }
    }
    read().unwrap_or(0)
}

/// Removes every namespace of the testbed with `prefix` (killing what runs inside), and its
/// state file. Succeeds when there is nothing to remove, so it also cleans up after a crash.
pub fn down(prefix: &str) -> Result<Vec<String>, TopologyError> {
    check_spec(&TopologySpec {
        prefix: prefix.to_owned(),
        ..TopologySpec::default()
    })?;
    if !ip::is_root() {
        return Err(TopologyError::NotRoot);
    }
    let found = existing_namespaces(prefix)?;
    for ns in &found {
        kill_namespace_processes(ns);
        // Deleting a namespace destroys its veth ends, and with them their peers.
        ip(&["netns", "del", ns])?;
    }
    let state = TestbedInfo::state_path(prefix);
    if state.exists() {
        std::fs::remove_file(&state).map_err(|e| TopologyError::State {
            path: state.clone(),
            detail: e.to_string(),
        })?;
    }
    Ok(found)
}

fn kill_namespace_processes(ns: &str) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let Ok(pids) = ip::namespace_pids(ns) else {
        return;
    };
    for &pid in &pids {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    // Give them a moment to exit cleanly, then make sure.
    for _ in 0..20 {
        if ip::namespace_pids(ns).map(|p| p.is_empty()).unwrap_or(true) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for pid in ip::namespace_pids(ns).unwrap_or_default() {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_puts_same_index_nics_on_the_same_rail_switch() {
        let info = TestbedInfo::plan(&TopologySpec::default());
        for rail in 0..RAILS {
            let switch_ns: Vec<&str> = info
                .hosts
                .iter()
                .map(|h| h.nics[usize::from(rail)].switch_netns.as_str())
                .collect();
            assert_eq!(switch_ns, vec![format!("rs-sw{rail}"); 2]);
        }
    }

    #[test]
    fn plan_uses_only_the_benchmarking_range() {
        let info = TestbedInfo::plan(&TopologySpec::default());
        let mut addrs: Vec<&str> = vec![&info.mgmt.addr];
        for h in &info.hosts {
            addrs.push(&h.mgmt_addr);
            addrs.extend(h.nics.iter().map(|n| n.addr.as_str()));
        }
        for a in addrs {
            let ip: std::net::Ipv4Addr = a.parse().unwrap();
            let o = ip.octets();
            assert!(
                o[0] == 198 && (o[1] == 18 || o[1] == 19),
                "{a} outside 198.18.0.0/15"
            );
        }
    }

    #[test]
    fn plan_gives_each_rail_its_own_subnet() {
        let info = TestbedInfo::plan(&TopologySpec::default());
        let a = &info.hosts[0].nics;
        assert_eq!(a[0].addr, "198.18.0.1");
        assert_eq!(a[1].addr, "198.18.1.1");
        assert_eq!(info.hosts[1].nics[1].addr, "198.18.1.2");
    }

    #[test]
    fn plan_gives_every_nic_its_own_locally_administered_mac() {
        let info = TestbedInfo::plan(&TopologySpec::default());
        let macs: Vec<&str> = info
            .hosts
            .iter()
            .flat_map(|h| h.nics.iter().map(|n| n.mac.as_str()))
            .collect();
        assert_eq!(macs[0], "02:00:c6:12:00:01");
        assert_eq!(macs[3], "02:00:c6:12:01:02");
        let unique: std::collections::BTreeSet<&str> = macs.iter().copied().collect();
        assert_eq!(unique.len(), macs.len(), "{macs:?}");
    }

    #[test]
    fn bad_prefixes_are_rejected_by_name() {
        for bad in ["", "toolongprefix", "Rs", "a-b", "a b"] {
            let spec = TopologySpec {
                prefix: bad.to_owned(),
                ..TopologySpec::default()
            };
            let err = check_spec(&spec).unwrap_err();
            assert!(err.to_string().contains("bad prefix"), "{bad:?}: {err}");
        }
    }
}
