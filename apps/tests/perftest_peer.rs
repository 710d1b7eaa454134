//! `--perftest-peer` on both sides of a loopback pair: each tool speaks stock perftest's
//! out-of-band exchange with itself, server and client, and both exit 0 with perftest's
//! results. (Against stock perftest itself: `tools/interop`'s perftest round.)

mod common;

use common::{pair, text, PairRun};

fn ok(r: &PairRun) {
    assert!(r.client.status.success(), "client: {}", text(&r.client));
    assert!(r.server.status.success(), "server: {}", text(&r.server));
    let out = String::from_utf8_lossy(&r.client.stdout);
    assert!(out.contains("stock perftest 6.06"), "{out}");
}

#[test]
fn every_bandwidth_tool_pairs_through_perftests_exchange() {
    for (k, tool) in ["shift_write_bw", "shift_read_bw", "shift_send_bw"]
        .into_iter()
        .enumerate()
    {
        let r = pair(
            tool,
            60 + k as u16,
            &["--perftest-peer", "-s", "4096", "-n", "300"],
        );
        ok(&r);
        assert_eq!(r.client_json["iterations"], 300, "{tool}");
        // The server prints (and reports) the client's result, as perftest's server does;
        // a SEND server counts its own receives.
        assert_eq!(r.server_json["iterations"], 300, "{tool}");
        assert_eq!(r.server_json["size"], 4096, "{tool}");
        if tool != "shift_send_bw" {
            assert_eq!(r.server_json["table_from"], "peer", "{tool}");
        }
    }
}

#[test]
fn atomics_with_a_perftest_peer_are_counted_over_its_whole_buffer() {
    let r = pair("shift_atomic_bw", 63, &["--perftest-peer", "-n", "500"]);
    ok(&r);
    assert_eq!(r.client_json["atomic"]["fetched_in_sequence"], true);
    assert_eq!(r.server_json["atomic"]["remote_counter"], 500);
}

#[test]
fn every_latency_tool_pairs_through_perftests_exchange() {
    for (k, tool) in ["shift_write_lat", "shift_send_lat", "shift_read_lat"]
        .into_iter()
        .enumerate()
    {
        let r = pair(tool, 64 + k as u16, &["--perftest-peer", "-n", "300"]);
        ok(&r);
        assert_eq!(r.client_json["iterations"], 300, "{tool}");
    }
}

#[test]
fn failover_is_off_with_a_perftest_peer_and_says_so_in_one_line() {
    let r = pair(
        "shift_write_bw",
        67,
        &[
            "--perftest-peer",
            "-n",
            "100",
            "--backup-dev",
            "soft:lo@127.0.0.9",
        ],
    );
    ok(&r);
    assert_eq!(r.client_json["failover_enabled"], false);
    let out = String::from_utf8_lossy(&r.client.stdout);
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("cannot take part in failover"))
        .collect();
    assert_eq!(lines.len(), 1, "{out}");
}
