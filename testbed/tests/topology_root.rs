//! Root-only: builds a real testbed, checks what crosses it, cuts links, tears it down.
//! Skips with a printed reason when not root; CI runs as root.

use std::net::UdpSocket;
use std::time::Duration;

use testbed::fail;
use testbed::netns;
use testbed::schedule::LinkAction;
use testbed::target::FailTarget;
use testbed::topology::{self, Role, TestbedInfo, TopologySpec};

/// Tears the testbed down even when an assertion fails.
struct Guard(String);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Err(e) = topology::down(&self.0) {
            eprintln!("cleanup of testbed {:?} failed: {e}", self.0);
        }
    }
}

fn unique_prefix(tag: char) -> String {
    format!("{tag}{}", std::process::id() % 100_000)
}

/// A testbed of the test's own (`tag` keeps the tests' namespaces apart), torn down when the
/// guard drops; `None`, with the reason printed, when not root.
fn testbed_up(tag: char, mtu: u32) -> Option<(TestbedInfo, Guard)> {
    if !testbed::ip::is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return None;
    }
    let prefix = unique_prefix(tag);
    let info = topology::up(&TopologySpec {
        prefix: prefix.clone(),
        mtu,
        hugepages: 0,
    })
    .expect("testbed up");
    Some((info, Guard(prefix)))
}

/// Sends one datagram from `from_ns`/`from_addr` to `to_addr` and reports whether a socket
/// in `to_ns` received it within 500 ms.
fn udp_reaches(from_ns: &str, from_addr: &str, to_ns: &str, to_addr: &str, port: u16) -> bool {
    let bind = format!("{to_addr}:{port}");
    let receiver = netns::run_in(to_ns, move || {
        let s = UdpSocket::bind(bind).expect("bind receiver");
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        s
    })
    .expect("enter receiver namespace");
    let src = format!("{from_addr}:0");
    let dst = format!("{to_addr}:{port}");
    let sent = netns::run_in(from_ns, move || {
        let s = UdpSocket::bind(src)?;
        s.send_to(b"railshift", dst)
    })
    .expect("enter sender namespace");
    if sent.is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    matches!(receiver.recv_from(&mut buf), Ok((9, _)))
}

#[test]
fn root_testbed_connects_each_rail_and_the_management_network() {
    let Some((info, guard)) = testbed_up('c', 9000) else {
        return;
    };
    let (a, b) = (info.host(Role::Initiator), info.host(Role::Responder));
    for rail in 0..2 {
        assert!(
            udp_reaches(
                &a.netns,
                &a.nics[rail].addr,
                &b.netns,
                &b.nics[rail].addr,
                4000 + rail as u16
            ),
            "rail {rail} does not carry A -> B"
        );
    }
    assert!(udp_reaches(
        &a.netns,
        &a.mgmt_addr,
        &info.mgmt.netns,
        &info.mgmt.addr,
        4100
    ));
    assert!(udp_reaches(
        &b.netns,
        &b.mgmt_addr,
        &a.netns,
        &a.mgmt_addr,
        4101
    ));
    assert_eq!(TestbedInfo::load(&guard.0).expect("state file"), info);
}

#[test]
fn root_cutting_a_switch_port_stops_that_rail_only_until_it_is_restored() {
    let Some((info, _guard)) = testbed_up('f', 1500) else {
        return;
    };
    let (a, b) = (info.host(Role::Initiator), info.host(Role::Responder));
    let port = FailTarget::SwitchPort {
        rail: 0,
        host: Role::Initiator,
    };
    fail::apply(&info, port, LinkAction::Down).expect("port down");
    assert!(!udp_reaches(
        &a.netns,
        &a.nics[0].addr,
        &b.netns,
        &b.nics[0].addr,
        4200
    ));
    assert!(udp_reaches(
        &a.netns,
        &a.nics[1].addr,
        &b.netns,
        &b.nics[1].addr,
        4201
    ));
    fail::apply(&info, port, LinkAction::Up).expect("port up");
    // Carrier comes back at once on veth; give ARP a moment anyway.
    let mut back = false;
    for attempt in 0..20 {
        if udp_reaches(
            &a.netns,
            &a.nics[0].addr,
            &b.netns,
            &b.nics[0].addr,
            4210 + attempt,
        ) {
            back = true;
            break;
        }
    }
    assert!(back, "rail 0 did not come back after the port was restored");
}

/// The state `ip neigh` shows for `addr` in `ns` (`PERMANENT`, `REACHABLE`, ...), if any.
fn neighbour_state(ns: &str, addr: &str) -> Option<String> {
    let out = std::process::Command::new("ip")
        .args(["-n", ns, "neigh", "show", addr])
        .output()
        .expect("run ip neigh");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .last()
        .map(str::to_owned)
}

#[test]
fn root_the_testbed_pins_no_neighbour_and_forgets_every_entry_before_a_run() {
    // softnic resolves its peers' MAC addresses itself when a QP is connected and keeps
    // them, as a RoCE NIC does (docs/softnic.md): the kernel's neighbour table is the
    // kernel's, nothing pinned, and emptied before each run so no stale packet waits in it.
    let Some((info, _guard)) = testbed_up('n', 1500) else {
        return;
    };
    let (a, b) = (info.host(Role::Initiator), info.host(Role::Responder));
    let pairs = [
        (&a.netns, &b.nics[0].addr),
        (&a.netns, &b.nics[1].addr),
        (&b.netns, &a.nics[0].addr),
        (&b.netns, &a.nics[1].addr),
    ];
    for (ns, addr) in pairs {
        assert_ne!(
            neighbour_state(ns, addr).as_deref(),
            Some("PERMANENT"),
            "{ns}'s entry for {addr} after up"
        );
    }
    // Traffic makes the kernel resolve; forgetting the neighbours before a run removes it.
    assert!(udp_reaches(
        &a.netns,
        &a.nics[0].addr,
        &b.netns,
        &b.nics[0].addr,
        4300
    ));
    fail::forget_neighbours(&info).expect("forget neighbours");
    for (ns, addr) in pairs {
        assert_eq!(
            neighbour_state(ns, addr),
            None,
            "{ns}'s entry for {addr} after forgetting the neighbours"
        );
    }
}

/// Whether each rail carries a datagram from host A to host B now (ports from `port`).
fn rails_reach(info: &TestbedInfo, port: u16) -> [bool; 2] {
    let (a, b) = (info.host(Role::Initiator), info.host(Role::Responder));
    [0, 1].map(|rail| {
        udp_reaches(
            &a.netns,
            &a.nics[rail].addr,
            &b.netns,
            &b.nics[rail].addr,
            port + rail as u16,
        )
    })
}

#[test]
fn root_both_default_nics_and_the_backup_rails_targets_cut_what_they_name() {
    let Some((info, _guard)) = testbed_up('g', 1500) else {
        return;
    };
    let cases = [
        ("both-nic0", [false, true]),
        ("initiator-nic1", [true, false]),
        ("responder-nic1", [true, false]),
        ("switch1-port", [true, false]),
    ];
    for (i, (name, expect)) in cases.into_iter().enumerate() {
        let target = FailTarget::parse(name, None).expect("a target name");
        let port = 4300 + 30 * i as u16;
        fail::apply(&info, target, LinkAction::Down).expect("down");
        assert_eq!(rails_reach(&info, port), expect, "{name} down");
        fail::apply(&info, target, LinkAction::Up).expect("up");
        // Carrier comes back at once on veth; give ARP a few tries anyway.
        let back = (0..10).any(|t| rails_reach(&info, port + 2 + 2 * t) == [true, true]);
        assert!(
            back,
            "both rails did not come back after {name} was restored"
        );
    }
}

#[test]
fn root_down_removes_every_namespace_and_is_idempotent() {
    // The guard's own `down` at the end is the third: idempotent, as this test checks.
    let Some((info, guard)) = testbed_up('d', 1500) else {
        return;
    };
    let prefix = &guard.0;
    let removed = topology::down(prefix).expect("down");
    assert_eq!(removed.len(), info.namespaces().len());
    let left: Vec<String> = testbed::ip::list_namespaces()
        .unwrap()
        .into_iter()
        .filter(|ns| info.namespaces().contains(ns))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(topology::down(prefix).expect("second down").is_empty());
    assert!(TestbedInfo::load(prefix).is_err());
}
