//! Failure injection: runs a schedule's steps against the clock, each one what `ip -n NS link
//! set dev X down/up` does on a host NIC or a switch port (both hosts' NICs at once for
//! `both-nic*`), sent as one rtnetlink request from a thread inside the namespace rather than
//! by spawning `ip` (see [`set_link`]), or a command on an application's fault channel for a
//! device that dies silently; every action is logged with the time it was issued.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::faults;
use crate::ip::ip_in;
use crate::netns;
use crate::schedule::{LinkAction, Step};
use crate::target::FailTarget;
use crate::topology::{Role, TestbedInfo};

/// The namespaces and interfaces `ip link set` acts on for `target`; for a dead device, the
/// host's namespace and the device's name (the fault goes through the fault channel).
pub fn interfaces(target: &FailTarget, info: &TestbedInfo) -> Vec<(String, String)> {
    let nic = |role: Role, rail: u8| {
        let host = info.host(role);
        (
            host.netns.clone(),
            host.nics[usize::from(rail)].name.clone(),
        )
    };
    match *target {
        FailTarget::InitiatorNic { rail } => vec![nic(Role::Initiator, rail)],
        FailTarget::ResponderNic { rail } => vec![nic(Role::Responder, rail)],
        FailTarget::SwitchPort { rail, host } => {
            let n = &info.host(host).nics[usize::from(rail)];
            vec![(n.switch_netns.clone(), n.switch_port.clone())]
        }
        FailTarget::BothNics { rail } => {
            vec![nic(Role::Initiator, rail), nic(Role::Responder, rail)]
        }
        FailTarget::DeviceDead { host, rail } | FailTarget::DeviceQpsFailed { host, rail } => {
            let h = info.host(host);
            vec![(h.netns.clone(), h.nics[usize::from(rail)].device.clone())]
        }
    }
}

/// What happened when a step ran.
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    /// Milliseconds since the plan started, when the command returned.
    pub t_ms: f64,
    /// When the command returned, in milliseconds since the Unix epoch (to line up with
    /// application timelines, which use the same clock).
    pub unix_ms: f64,
    /// When the step was planned, in milliseconds since the plan started.
    pub planned_ms: f64,
    /// What was cut or restored.
    pub target: String,
    /// The rail.
    pub rail: u8,
    /// Down or up.
    pub action: LinkAction,
    /// Namespace of the interface (several, comma-separated, for `both-nic*`).
    pub netns: String,
    /// The interface (for a dead device, the device's name).
    pub dev: String,
    /// The `ip` error, when the command failed.
    pub error: Option<String>,
    /// When the command was issued, in Unix milliseconds. The link changes somewhere between
    /// this and `unix_ms` (the kernel acknowledges the request after it notified the link
    /// watchers, and an application can see the change before that), so failure windows and
    /// detection times are measured from here.
    pub issued_unix_ms: f64,
}

impl LogEntry {
    /// The entry of `step` issued at `issued_unix_ms`, as if it ran then and succeeded.
    pub fn planned(info: &TestbedInfo, step: &Step, issued_unix_ms: f64) -> LogEntry {
        let links = interfaces(&step.target, info);
        let join = |pick: fn(&(String, String)) -> &String| {
            links
                .iter()
                .map(pick)
                .cloned()
                .collect::<Vec<_>>()
                .join(",")
        };
        let planned_ms = step.at.as_secs_f64() * 1e3;
        LogEntry {
            t_ms: planned_ms,
            unix_ms: issued_unix_ms,
            planned_ms,
            target: step.target.to_string(),
            rail: step.target.rail(),
            action: step.action,
            netns: join(|l| &l.0),
            dev: join(|l| &l.1),
            error: None,
            issued_unix_ms,
        }
    }
}

/// The steps a run did not get to (it stopped early), at their planned times: `start_unix_ms`
/// is the Unix time of the schedule's start.
pub fn not_reached(info: &TestbedInfo, steps: &[Step], start_unix_ms: f64) -> Vec<LogEntry> {
    steps
        .iter()
        .map(|s| LogEntry::planned(info, s, start_unix_ms + s.at.as_secs_f64() * 1e3))
        .collect()
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}

/// rtnetlink sockets opened inside the namespaces whose links a schedule changes, ahead of
/// it, so that a step is one request from the schedule's own thread: no `ip` process, and no
/// thread spawned to enter a namespace (which, with every core taken by a busy-polling lcore,
/// waited up to a scheduler tick for a core). See [`set_link`].
#[derive(Debug, Default)]
pub struct LinkControls {
    by_netns: Vec<(String, netdev_link::LinkControl)>,
}

impl LinkControls {
    /// None opened: every link change opens its socket inside the namespace when it runs.
    pub fn none() -> LinkControls {
        LinkControls::default()
    }

    /// A socket in each namespace whose links `steps` change.
    pub fn open(info: &TestbedInfo, steps: &[Step]) -> Result<LinkControls, String> {
        let mut controls = LinkControls::none();
        for step in steps {
            // Device faults go through the application's fault channel.
            if step.target.fault_host().is_some() {
                continue;
            }
            for (ns, _) in interfaces(&step.target, info) {
                if controls.by_netns.iter().any(|(n, _)| *n == ns) {
                    continue;
                }
                let control = netns::run_in(&ns, netdev_link::LinkControl::open)
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("rtnetlink socket in namespace {ns}: {e}"))?;
                controls.by_netns.push((ns, control));
            }
        }
        Ok(controls)
    }
}

/// Runs one step now. The links of a target with several (`both-nic*`) change one after the
/// other, a fraction of a millisecond apart.
pub fn apply(info: &TestbedInfo, target: FailTarget, action: LinkAction) -> Result<(), String> {
    apply_with(&mut LinkControls::none(), info, target, action)
}

/// [`apply`] through the sockets of `controls` where it has one for the namespace.
pub fn apply_with(
    controls: &mut LinkControls,
    info: &TestbedInfo,
    target: FailTarget,
    action: LinkAction,
) -> Result<(), String> {
    if let Some(host) = target.fault_host() {
        return match action {
            LinkAction::Down => {
                let device = interfaces(&target, info).remove(0).1;
                let command = target
                    .fault_command(&device)
                    .ok_or_else(|| format!("{target} has no fault-channel command"))?;
                let path = faults::channel_path(info, host);
                faults::send(&path, &command).map_err(|e| e.to_string())
            }
            LinkAction::Up if !target.recovers() => Err(format!(
                "{target} does not come back: a dead device stays dead"
            )),
            LinkAction::Up => Err(format!(
                "{target} has no up step: the device never went down, the driver repairs its QPs"
            )),
        };
    }
    let errors: Vec<String> = interfaces(&target, info)
        .iter()
        .filter_map(|(ns, dev)| set_link(controls, ns, dev, action).err())
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// What `ip -n <ns> link set dev <dev> up|down` does, done by one rtnetlink request
/// ([`netdev_link::LinkControl::set_admin_state`]) on the socket `controls` holds for `ns`
/// (or one opened there by a thread that enters it); returns once the kernel acknowledged
/// it.
///
/// Why not `ip` itself: spawning `ip -n` is a fork, an exec and a dynamic link, a few
/// milliseconds of CPU. With two busy-polling lcores on this 2-core machine it took 8 ms from
/// issuing the command to the link going down, and 13 ms to it coming up (the application
/// saw the port change 63 us after `ip` returned), so every detection
/// and switch-back figure of a run-to-completion scenario carried the testbed's own spawn.
/// The debug log names the equivalent `ip` command, to paste into a shell.
fn set_link(
    controls: &mut LinkControls,
    ns: &str,
    dev: &str,
    action: LinkAction,
) -> Result<(), String> {
    let command = format!("ip -n {ns} link set dev {dev} {action}");
    tracing::debug!(%command, "rtnetlink");
    let up = action == LinkAction::Up;
    let done = match controls.by_netns.iter_mut().find(|(n, _)| n == ns) {
        Some((_, control)) => control.set_admin_state(dev, up),
        None => {
            let netdev = dev.to_owned();
            netns::run_in(ns, move || netdev_link::set_admin_state(&netdev, up))
                .map_err(|e| format!("`{command}`: {e}"))?
        }
    };
    done.map_err(|e| format!("`{command}`: {e}"))
}

/// Puts every link of the testbed back up, whatever a schedule left down (dead devices die
/// with their process).
pub fn restore_all(info: &TestbedInfo) {
    for rail in 0..info.hosts[0].nics.len() as u8 {
        let targets = [
            FailTarget::BothNics { rail },
            FailTarget::SwitchPort {
                rail,
                host: Role::Initiator,
            },
            FailTarget::SwitchPort {
                rail,
                host: Role::Responder,
            },
        ];
        for t in targets {
            if let Err(e) = apply(info, t, LinkAction::Up) {
                tracing::warn!(target = %t, error = %e, "could not restore link");
            }
        }
    }
}

/// Forgets every neighbour (ARP) entry of the hosts, and with them the packets queued behind
/// an unresolved one. A packet a dead process sent while a link was down and that waited in
/// such a queue until the link returned, delivered to the next run's QP of the same number,
/// is a stale request the new QP rightly refuses (seen: the next run's control QP in error
/// with `QpAccessError`). The softnic resolves its peers' MAC addresses itself when a QP is
/// connected and keeps them (`docs/softnic.md`), so nothing is pinned here.
pub fn forget_neighbours(info: &TestbedInfo) -> Result<(), String> {
    for host in &info.hosts {
        ip_in(&host.netns, &["neigh", "flush", "all"]).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Every rail link of the testbed (host NICs and switch ports), as (namespace, interface).
fn rail_links(info: &TestbedInfo) -> Vec<(String, String)> {
    let mut links = Vec::new();
    for host in &info.hosts {
        for nic in &host.nics {
            links.push((host.netns.clone(), nic.name.clone()));
            links.push((nic.switch_netns.clone(), nic.switch_port.clone()));
        }
    }
    links
}

/// Whether `ip -o link` output says the link is operationally up.
fn says_up(ip_output: &str) -> bool {
    ip_output.contains(" state UP ")
}

/// Waits until every rail link reports its operational state up, at most `timeout`. After
/// `ip link set up` a veth reports it up to a second later (the kernel's link watch batches
/// carrier changes), and a softnic device opened meanwhile starts with its port down.
pub fn wait_all_up(info: &TestbedInfo, timeout: Duration) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        let down: Vec<String> = rail_links(info)
            .into_iter()
            .filter(|(ns, dev)| {
                !ip_in(ns, &["-o", "link", "show", "dev", dev]).is_ok_and(|out| says_up(&out))
            })
            .map(|(ns, dev)| format!("{ns}/{dev}"))
            .collect();
        if down.is_empty() {
            return Ok(());
        }
        if t0.elapsed() >= timeout {
            return Err(format!(
                "{} not operationally up after {timeout:?}",
                down.join(", ")
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Executes `steps` against the clock from `start`, calling `log` after each; returns the log.
/// Stops early (leaving later steps undone) when `stop` returns true between steps.
pub fn run(
    info: &TestbedInfo,
    steps: &[Step],
    start: Instant,
    mut log: impl FnMut(&LogEntry),
    stop: impl Fn() -> bool,
) -> Vec<LogEntry> {
    let mut entries = Vec::with_capacity(steps.len());
    // Opened before the clock matters; a namespace that cannot be entered now fails its steps
    // below, each with its own error.
    let mut controls = LinkControls::open(info, steps).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "rtnetlink sockets not opened ahead; each step opens its own");
        LinkControls::none()
    });
    for step in steps {
        // Sleep in short slices so a stop request is honoured promptly.
        loop {
            if stop() {
                return entries;
            }
            let now = start.elapsed();
            if now >= step.at {
                break;
            }
            std::thread::sleep((step.at - now).min(Duration::from_millis(20)));
        }
        let issued_unix_ms = unix_ms_now();
        let result = apply_with(&mut controls, info, step.target, step.action);
        let mut entry = LogEntry::planned(info, step, issued_unix_ms);
        entry.t_ms = start.elapsed().as_secs_f64() * 1e3;
        entry.unix_ms = unix_ms_now();
        entry.error = result.err();
        log(&entry);
        entries.push(entry);
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySpec;

    #[test]
    fn targets_map_to_the_right_namespace_and_interface() {
        let info = TestbedInfo::plan(&TopologySpec::default());
        let one = |t: FailTarget| interfaces(&t, &info);
        let pair = |ns: &str, dev: &str| (ns.to_owned(), dev.to_owned());
        assert_eq!(
            one(FailTarget::InitiatorNic { rail: 0 }),
            vec![pair("rs-a", "nic0")]
        );
        assert_eq!(
            one(FailTarget::ResponderNic { rail: 1 }),
            vec![pair("rs-b", "nic1")]
        );
        assert_eq!(
            one(FailTarget::SwitchPort {
                rail: 1,
                host: Role::Initiator
            }),
            vec![pair("rs-sw1", "pa")]
        );
        assert_eq!(
            one(FailTarget::BothNics { rail: 0 }),
            vec![pair("rs-a", "nic0"), pair("rs-b", "nic0")]
        );
        assert_eq!(
            one(FailTarget::DeviceDead {
                host: Role::Initiator,
                rail: 0
            }),
            vec![pair("rs-a", "soft:nic0")]
        );
    }

    #[test]
    fn the_operational_state_is_read_from_ip_link() {
        let up = "3: nic1@if3: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc noqueue state UP mode DEFAULT";
        let lower_down = "3: nic1@if3: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 9000 qdisc noqueue state LOWERLAYERDOWN mode DEFAULT";
        let down =
            "3: nic1@if3: <BROADCAST,MULTICAST> mtu 9000 qdisc noqueue state DOWN mode DEFAULT";
        assert!(says_up(up));
        assert!(!says_up(lower_down));
        assert!(!says_up(down));
    }

    #[test]
    fn every_rail_link_is_waited_for() {
        let info = TestbedInfo::plan(&TopologySpec::default());
        let links = rail_links(&info);
        assert_eq!(links.len(), 8);
        assert!(links.contains(&("rs-sw1".to_owned(), "pb".to_owned())));
        assert!(links.contains(&("rs-b".to_owned(), "nic1".to_owned())));
    }

    #[test]
    fn a_dead_device_refuses_to_come_back() {
        let info = TestbedInfo::plan(&TopologySpec::default());
        let dead = FailTarget::DeviceDead {
            host: Role::Responder,
            rail: 0,
        };
        let err = apply(&info, dead, LinkAction::Up).unwrap_err();
        assert!(err.contains("stays dead"), "{err}");
        let failed = FailTarget::DeviceQpsFailed {
            host: Role::Initiator,
            rail: 1,
        };
        assert_eq!(
            interfaces(&failed, &info),
            vec![("rs-a".to_owned(), "soft:nic1".to_owned())]
        );
        let err = apply(&info, failed, LinkAction::Up).unwrap_err();
        assert!(err.contains("no up step"), "{err}");
    }
}
