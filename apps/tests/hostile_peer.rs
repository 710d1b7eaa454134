//! A peer that lies in the out-of-band exchange: the tool refuses what it sent with a one-line
//! error naming it, never a panic.

mod common;

use std::time::Duration;

use apps::exchange::{self, Hello, Msg};
use common::{slot, spawn, text, wait};

#[test]
fn a_write_bw_server_refuses_a_peer_buffer_shorter_than_its_credit_word() {
    let (port, a_server, a_client) = slot(45);
    let server = spawn(
        "shift_write_bw",
        &[
            "-d".into(),
            format!("soft:lo@{a_server}"),
            "-p".into(),
            port.to_string(),
            "-s".into(),
            "4096".into(),
            "--check".into(),
        ],
    );
    let t0 = std::time::Instant::now();
    while !common::listening(port) {
        assert!(t0.elapsed() < Duration::from_secs(10), "never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut chan = exchange::connect("127.0.0.1", port).unwrap();
    let Msg::Hello(theirs) = chan.recv(Duration::from_secs(20)).unwrap() else {
        panic!("the server did not start with a hello");
    };
    // Everything as the server expects, but a 10-byte buffer: the server's credit word sits
    // 64 bytes before the end of it (the subtraction overflowed before the check).
    let mut qp = theirs.qps[0].clone();
    qp.gid = a_client.clone();
    qp.len = 10;
    qp.backup = None;
    chan.send(&Msg::Hello(Hello::new(theirs.params.clone(), vec![qp])))
        .unwrap();
    // The server brings its QP up towards ours (nothing answers there) and says ready.
    chan.sync_ready(Duration::from_secs(20)).unwrap();
    let s = wait(server, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&s.stderr);
    assert_eq!(s.status.code(), Some(1), "{}", text(&s));
    assert!(
        err.contains("the peer's buffer") && err.contains("+10 is unusable"),
        "{}",
        text(&s)
    );
    assert!(!err.contains("panicked"), "{}", text(&s));
}
