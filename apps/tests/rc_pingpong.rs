//! `shift_rc_pingpong` against itself on `lo` (root: softnic binds to the netdev): multi-packet
//! SENDs both ways, every byte checked, and a malformed out-of-band message refused with an
//! error that names it. Against rdma-core's stock `ibv_rc_pingpong` on Linux rxe:
//! `tools/interop` (docs/interop.md).

mod common;

use std::io::Write;
use std::time::Duration;

use common::{spawn, wait};

/// Whether this process may bind softnic to a netdev (CI runs as root).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

fn port(test: u16) -> u16 {
    24000 + (std::process::id() % 300) as u16 * 4 + test
}

#[test]
fn two_rc_pingpongs_exchange_multi_packet_sends_with_every_byte_checked() {
    if !is_root() {
        println!("skipped: softnic on lo needs root (CI runs as root)");
        return;
    }
    let p = port(0).to_string();
    let args = |dev: &str| -> Vec<String> {
        [
            "-d", dev, "-p", &p, "-s", "4096", "-m", "1024", "-n", "200", "-c",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let server = spawn("shift_rc_pingpong", &args("soft:lo@127.79.0.2"));
    let mut cargs = args("soft:lo@127.79.0.1");
    cargs.push("127.0.0.1".into());
    let client = spawn("shift_rc_pingpong", &cargs);
    let c = wait(client, Duration::from_secs(60));
    let s = wait(server, Duration::from_secs(60));
    for (who, out) in [("client", &c), ("server", &s)] {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{who}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("checked 200 messages: 0 bad bytes"),
            "{who}: {text}"
        );
        assert!(text.contains("200 iters in"), "{who}: {text}");
    }
}

#[test]
fn a_malformed_exchange_message_is_refused_by_name() {
    if !is_root() {
        println!("skipped: softnic on lo needs root (CI runs as root)");
        return;
    }
    let p = port(1);
    let server = spawn(
        "shift_rc_pingpong",
        &[
            "-d".into(),
            "soft:lo@127.79.1.2".into(),
            "-p".into(),
            p.to_string(),
        ],
    );
    let t0 = std::time::Instant::now();
    let mut s = loop {
        match std::net::TcpStream::connect(("127.0.0.1", p)) {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("server never listened: {e}"),
        }
    };
    let mut msg = [0u8; 52];
    msg[..20].copy_from_slice(b"0000:zz0011:abcdef:0");
    s.write_all(&msg).unwrap();
    let out = wait(server, Duration::from_secs(20));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("LID:QPN:PSN:GID") || err.contains("QPN"),
        "{err}"
    );
}

#[test]
fn rc_ops_runs_every_rc_opcode_against_itself_and_both_sides_check_it() {
    if !is_root() {
        println!("skipped: softnic on lo needs root (CI runs as root)");
        return;
    }
    // shift_rc_ops listens on its fixed port (18516), so this is the only test that runs it.
    let target = spawn(
        "shift_rc_ops",
        &["-d".into(), "soft:lo@127.79.2.2".into(), "--target".into()],
    );
    let initiator = spawn(
        "shift_rc_ops",
        &[
            "-d".into(),
            "soft:lo@127.79.2.1".into(),
            "--initiator".into(),
            "127.0.0.1".into(),
        ],
    );
    let i = wait(initiator, Duration::from_secs(60));
    let t = wait(target, Duration::from_secs(60));
    for (who, out) in [("initiator", &i), ("target", &t)] {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("RCOPS ok"),
            "{who}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
