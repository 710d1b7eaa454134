//! Two network namespaces joined by a veth pair, for root-only tests and benchmarks, with
//! addresses from 198.18.0.0/15 and no route out. Dropping the pair deletes both namespaces
//! (which deletes the veths), also when a test fails.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether this process runs as root (namespaces need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// One side of the pair.
#[derive(Clone, Debug)]
pub struct Side {
    /// Namespace name.
    pub netns: String,
    /// The veth end inside it.
    pub netdev: String,
    /// Its address.
    pub addr: IpAddr,
}

/// Two namespaces `a` and `b`, a veth between them, both ends up.
#[derive(Debug)]
pub struct NetnsPair {
    /// Side a.
    pub a: Side,
    /// Side b.
    pub b: Side,
}

impl Side {
    /// Waits until the veth's operational state is UP.
    pub fn wait_running(&self, limit: std::time::Duration) -> io::Result<()> {
        let end = std::time::Instant::now() + limit;
        loop {
            let out = Command::new("ip")
                .args(["-n", &self.netns, "-o", "link", "show", "dev", &self.netdev])
                .output()?;
            if String::from_utf8_lossy(&out.stdout).contains("state UP") {
                return Ok(());
            }
            if std::time::Instant::now() > end {
                return Err(io::Error::other(format!("{} never came up", self.netdev)));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl NetnsPair {
    /// Creates the pair with link MTU `mtu`, IPv4 addresses from 198.18.0.0/15. Names are
    /// unique per process and call.
    pub fn create(mtu: u32) -> io::Result<NetnsPair> {
        let subnet = 100 + (std::process::id() % 100) as u8;
        let host = |h| IpAddr::V4(Ipv4Addr::new(198, 18, subnet, h));
        NetnsPair::create_with(mtu, [host(1), host(2)], 24)
    }

    /// Creates the pair with IPv6 addresses from the benchmarking prefix 2001:2::/48
    /// (RFC 5180), the IPv6 counterpart of 198.18.0.0/15; the veth MTU must be at least
    /// 1280 (IPv6's minimum).
    pub fn create_ipv6(mtu: u32) -> io::Result<NetnsPair> {
        let subnet = 100 + (std::process::id() % 100) as u16;
        let host = |h| IpAddr::V6(Ipv6Addr::new(0x2001, 2, subnet, 0, 0, 0, 0, h));
        NetnsPair::create_with(mtu, [host(1), host(2)], 64)
    }

    fn create_with(mtu: u32, addrs: [IpAddr; 2], prefix: u8) -> io::Result<NetnsPair> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}x{}", std::process::id() % 100_000, n);
        let pair = NetnsPair {
            a: Side {
                netns: format!("sn{tag}a"),
                netdev: format!("sn{tag}a"),
                addr: addrs[0],
            },
            b: Side {
                netns: format!("sn{tag}b"),
                netdev: format!("sn{tag}b"),
                addr: addrs[1],
            },
        };
        // From here on, Drop cleans up whatever was made.
        ip(&["netns", "add", &pair.a.netns])?;
        ip(&["netns", "add", &pair.b.netns])?;
        ip(&[
            "link",
            "add",
            &pair.a.netdev,
            "netns",
            &pair.a.netns,
            "type",
            "veth",
            "peer",
            "name",
            &pair.b.netdev,
            "netns",
            &pair.b.netns,
        ])?;
        for side in [&pair.a, &pair.b] {
            let ns = side.netns.as_str();
            let mtu = mtu.to_string();
            ip(&["-n", ns, "link", "set", "dev", &side.netdev, "mtu", &mtu])?;
            let addr = format!("{}/{prefix}", side.addr);
            let mut args = vec!["-n", ns, "addr", "add", &addr, "dev", &side.netdev];
            if side.addr.is_ipv6() {
                // No duplicate address detection: the address is usable at once instead of
                // "tentative" (unbindable) for a second or two.
                args.push("nodad");
            }
            ip(&args)?;
            ip(&["-n", ns, "link", "set", "dev", &side.netdev, "up"])?;
            ip(&["-n", ns, "link", "set", "dev", "lo", "up"])?;
        }
        // The kernel reports carrier (IFF_RUNNING, RTM_NEWLINK) through linkwatch, up to a
        // second late; devices opened before that start with their port down.
        for side in [&pair.a, &pair.b] {
            side.wait_running(std::time::Duration::from_secs(5))?;
        }
        Ok(pair)
    }

    /// Sets side `a`'s veth end down or up (which takes the carrier of `b`'s end with it).
    pub fn set_a_link(&self, up: bool) -> io::Result<()> {
        Self::set_link(&self.a, up)
    }

    /// Sets side `b`'s veth end down or up (which takes the carrier of `a`'s end with it).
    pub fn set_b_link(&self, up: bool) -> io::Result<()> {
        Self::set_link(&self.b, up)
    }

    fn set_link(side: &Side, up: bool) -> io::Result<()> {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &side.netns, "link", "set", "dev", &side.netdev, state])
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for ns in [&self.a.netns, &self.b.netns] {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// Runs `f` on a fresh thread inside namespace `netns`; sockets it creates (and threads it
/// spawns) live in that namespace.
pub fn run_in<T: Send>(netns: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let file = std::fs::File::open(format!("/var/run/netns/{netns}"))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on a namespace fd we hold; it changes only this thread.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("thread in the namespace panicked")))
    })
}
