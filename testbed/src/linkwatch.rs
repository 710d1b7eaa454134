//! When the kernel reported each rail link running, during a run. A link set up is usable
//! only once the kernel reports it `RUNNING` (its linkwatch work, rate-limited to once a
//! second after recent link events, also activates its qdisc), and that can be up to a second
//! after the testbed's request returned (`docs/testbed.md`, "Known problems"). The driver
//! counts a link from `RUNNING` too, so lost connections are judged against both the failure
//! log and these reports ([`crate::paths::Availability::with_kernel_reports`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use netdev_link::LinkMonitor;
use serde::Serialize;

use crate::fail::unix_ms_now;
use crate::netns;
use crate::target::Link;
use crate::topology::TestbedInfo;

/// How often the watcher reads its sockets.
const PERIOD: Duration = Duration::from_millis(2);

/// A change of a rail link's state as the kernel reported it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkChange {
    /// The link (a host NIC or a switch port).
    #[serde(skip)]
    pub link: Link,
    /// Its namespace.
    pub netns: String,
    /// Its interface.
    pub dev: String,
    /// The rail.
    pub rail: u8,
    /// `UP`, `RUNNING` and `LOWER_UP` all set.
    pub up: bool,
    /// When the watcher read the report, in Unix milliseconds.
    pub unix_ms: f64,
}

/// A thread that records every state change of the testbed's rail links until stopped.
pub struct LinkWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<LinkChange>>>,
}

impl LinkWatch {
    /// Subscribes to every rail link's changes (each in its namespace) and starts recording.
    pub fn start(info: &TestbedInfo) -> Result<LinkWatch, String> {
        let mut monitors: Vec<Watched> = Vec::new();
        for host in &info.hosts {
            for nic in &host.nics {
                let ends = [
                    (
                        Link::HostNic {
                            host: host.role,
                            rail: nic.rail,
                        },
                        host.netns.clone(),
                        nic.name.clone(),
                    ),
                    (
                        Link::SwitchPort {
                            host: host.role,
                            rail: nic.rail,
                        },
                        nic.switch_netns.clone(),
                        nic.switch_port.clone(),
                    ),
                ];
                for (link, ns, dev) in ends {
                    let name = dev.clone();
                    let monitor = netns::run_in(&ns, move || LinkMonitor::open(&name))
                        .map_err(|e| e.to_string())?
                        .map_err(|e| format!("watching {ns}/{dev}: {e}"))?;
                    let up = monitor.state().is_up();
                    monitors.push(Watched {
                        link,
                        netns: ns,
                        dev,
                        monitor,
                        up,
                    });
                }
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("link-watch".into())
            .spawn(move || watch(monitors, &flag))
            .map_err(|e| format!("cannot start the link watch: {e}"))?;
        Ok(LinkWatch {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops recording; every change seen, in order.
    pub fn finish(mut self) -> Vec<LinkChange> {
        self.stop.store(true, Ordering::Release);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for LinkWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One watched link and its last state.
struct Watched {
    link: Link,
    netns: String,
    dev: String,
    monitor: LinkMonitor,
    up: bool,
}

fn watch(mut monitors: Vec<Watched>, stop: &AtomicBool) -> Vec<LinkChange> {
    let mut changes = Vec::new();
    while !stop.load(Ordering::Acquire) {
        // Non-blocking reads every couple of milliseconds: eight sockets, no poll set, and
        // a resolution far below the RC budget the reports are judged against.
        std::thread::sleep(PERIOD);
        for w in &mut monitors {
            if let Some(state) = w.monitor.poll() {
                let up = state.is_up();
                if up != w.up {
                    w.up = up;
                    changes.push(LinkChange {
                        link: w.link,
                        netns: w.netns.clone(),
                        dev: w.dev.clone(),
                        rail: w.link.rail(),
                        up,
                        unix_ms: unix_ms_now(),
                    });
                }
            }
        }
    }
    changes
}
