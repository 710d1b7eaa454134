//! The pmd's netdev link watch on a real veth (root only: each test makes two network
//! namespaces with a veth between them, softnic's test harness, 198.18.0.0/15 addresses and
//! no route out, removed on drop, also on failure). The watch is what a ConnectX's link is
//! read through, so it must work without the softnic provider: `tools/test` runs this file
//! with `--no-default-features --features mlx5` (the softnic here is only the harness, a
//! dev-dependency).

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use pmd::netdev_watch::{query, LinkState, NetdevWatch};
use softnic::harness::netns::{is_root, run_in, NetnsPair};

fn skip_unless_root(test: &str) -> bool {
    if !is_root() {
        eprintln!("skipped {test}: it needs root (it makes a network namespace)");
        return true;
    }
    false
}

/// Sleeps on `fd` until it is readable or `limit` has passed.
fn wait_readable(fd: RawFd, limit: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, and the count passed is one.
    unsafe { libc::poll(&mut pfd, 1, limit.as_millis() as libc::c_int) };
}

/// The watch's next change, sleeping on its socket between reads, within `limit`.
fn next_change(watch: &mut NetdevWatch, limit: Duration) -> Option<LinkState> {
    let end = Instant::now() + limit;
    loop {
        if let Some(state) = watch.poll() {
            return Some(state);
        }
        let left = end.checked_duration_since(Instant::now())?;
        wait_readable(watch.fd(), left.min(Duration::from_millis(100)));
    }
}

/// Runs `test` in side a's namespace of a fresh namespace pair with a watch on side a's veth
/// end, which the harness waited to run: up from the start, with nothing to report.
fn in_a_pair(test: impl FnOnce(&NetnsPair, &mut NetdevWatch) + Send) {
    let pair = NetnsPair::create(1500).expect("two namespaces and a veth");
    run_in(&pair.a.netns, || {
        let mut watch = NetdevWatch::open(&pair.a.netdev).expect("a watch on side a's veth end");
        assert_eq!(watch.netdev(), pair.a.netdev);
        assert_eq!(watch.state(), LinkState::Up);
        assert_eq!(watch.poll(), None);
        test(&pair, &mut watch);
    })
    .expect("a thread in the namespace");
}

#[test]
fn root_only_a_veth_flap_is_seen_down_then_up_through_the_netdev_watch() {
    if skip_unless_root("root_only_a_veth_flap_is_seen_down_then_up") {
        return;
    }
    in_a_pair(|pair, watch| {
        let watched = &pair.a.netdev;
        // Side b's end down takes side a's carrier with it.
        let down_at = Instant::now();
        pair.set_b_link(false).unwrap();
        let seen = next_change(watch, Duration::from_secs(5));
        assert_eq!(seen, Some(LinkState::Down), "after {:?}", down_at.elapsed());
        assert_eq!(watch.state(), LinkState::Down);
        assert_eq!(query(watched).unwrap().state, LinkState::Down);

        // Back up: carrier at once, running when the kernel's linkwatch work runs (rate
        // limited to once a second after recent events); only then is the link up.
        let up_at = Instant::now();
        pair.set_b_link(true).unwrap();
        let seen = next_change(watch, Duration::from_secs(5));
        println!(
            "link reported up {:?} after `ip link set up`",
            up_at.elapsed()
        );
        assert_eq!(seen, Some(LinkState::Up));
        assert_eq!(watch.state(), LinkState::Up);
        assert_eq!(query(watched).unwrap().state, LinkState::Up);
        pair.a.wait_running(Duration::from_secs(1)).unwrap();
    });
}

#[test]
fn root_only_a_flap_read_only_after_it_settled_collapses_to_no_change() {
    if skip_unless_root("root_only_a_flap_read_only_after_it_settled_collapses") {
        return;
    }
    in_a_pair(|pair, watch| {
        pair.set_b_link(false).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        pair.set_b_link(true).unwrap();
        pair.a.wait_running(Duration::from_secs(5)).unwrap();
        // The message saying "running" goes out as the kernel sets the state `ip` just read;
        // a margin makes sure it is queued.
        std::thread::sleep(Duration::from_millis(100));
        // Down, up-without-running and running, read at once: the burst ends where it began.
        assert_eq!(watch.poll(), None);
        assert_eq!(watch.state(), LinkState::Up);
    });
}

#[test]
fn a_netdev_that_does_not_exist_cannot_be_watched_and_says_so() {
    let e = NetdevWatch::open("railshift-nil0").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("railshift-nil0"), "{e}");
}
