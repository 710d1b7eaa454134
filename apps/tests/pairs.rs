//! Each tool as a real process pair over softnic on loopback UDP, checked through its JSON
//! report (`docs/apps-json.md`), and the one-line errors of bad command lines and peers.

mod common;

use std::time::Duration;

use common::{pair, slot, spawn, text, wait, TempDir};

fn ok(r: &common::PairRun) {
    assert!(r.client.status.success(), "client: {}", text(&r.client));
    assert!(r.server.status.success(), "server: {}", text(&r.server));
}

#[test]
fn write_bw_with_check_moves_every_byte_and_notification_intact() {
    let r = pair(
        "shift_write_bw",
        1,
        &["-s", "65536", "-n", "400", "--check", "--timeline-ms", "20"],
    );
    ok(&r);
    let c = &r.client_json;
    assert_eq!(c["tool"], "shift_write_bw");
    assert_eq!(c["role"], "client");
    assert_eq!(c["op"], "write");
    assert_eq!(c["size"], 65536);
    assert_eq!(c["iterations"], 400);
    assert!(c["bw_avg_gbps"].as_f64().unwrap() > 0.0);
    assert!(c["msg_rate_mpps"].as_f64().unwrap() > 0.0);
    assert_eq!(c["failover_enabled"], false);
    assert!(c["error"].is_null());
    assert!(c["timeline"].as_array().is_some());
    let s = &r.server_json;
    assert_eq!(s["role"], "server");
    assert_eq!(s["check"]["enabled"], true);
    assert_eq!(s["check"]["notifications_checked"], 400);
    assert_eq!(s["check"]["bytes_checked"], 400 * 65536);
    assert_eq!(s["check"]["errors"], 0);
    assert_eq!(s["check"]["notification_errors"], 0);
}

#[test]
fn write_bw_for_a_duration_samples_a_timeline_with_unix_times() {
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1e3;
    let r = pair(
        "shift_write_bw",
        2,
        &["-s", "4096", "-D", "1", "--timeline-ms", "100"],
    );
    ok(&r);
    let t = r.client_json["timeline"].as_array().unwrap();
    // About ten at 100 ms in 1 s; a loaded machine may stall through a few (missed
    // intervals are skipped, not made up).
    assert!(t.len() >= 5, "{} samples", t.len());
    for s in t {
        assert!(s["unix_ms"].as_f64().unwrap() > before);
        assert_eq!(s["state"], "default");
        assert_eq!(s["errors"], 0);
    }
    let d = r.client_json["duration_s"].as_f64().unwrap();
    assert!((0.9..3.0).contains(&d), "duration {d}");
}

#[test]
fn write_lat_reports_percentiles_and_writes_an_hgrm_file() {
    let dir = TempDir::new("hgrm");
    let hgrm = dir.file("lat.hgrm");
    let hgrm_arg = hgrm.display().to_string();
    let r = pair(
        "shift_write_lat",
        3,
        &["-s", "8", "-n", "2000", "--hdr-out", &hgrm_arg],
    );
    ok(&r);
    let c = &r.client_json;
    let p50 = c["lat_p50_us"].as_f64().unwrap();
    let p99 = c["lat_p99_us"].as_f64().unwrap();
    let p999 = c["lat_p999_us"].as_f64().unwrap();
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= p999, "{p50} {p99} {p999}");
    assert_eq!(c["iterations"], 2000);
    let text = std::fs::read_to_string(&hgrm).unwrap();
    assert!(text.contains("Percentile"), "{text}");
    assert!(text.contains("Total count    =         2000]"), "{text}");
}

#[test]
fn write_lat_with_idle_qps_connects_them_and_measures_on_the_first() {
    let r = pair(
        "shift_write_lat",
        26,
        &["-s", "8", "-n", "500", "--idle-qps", "3"],
    );
    ok(&r);
    for (json, run) in [(&r.client_json, &r.client), (&r.server_json, &r.server)] {
        assert_eq!(json["idle_qps"], 3);
        assert_eq!(json["qps"], 1);
        assert!(
            text(run).contains("Number of qps   : 1 (+3 idle)"),
            "{}",
            text(run)
        );
    }
    assert_eq!(r.client_json["iterations"], 500);
    assert!(r.client_json["lat_p50_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn send_lat_with_all_sizes_reports_a_row_per_size() {
    let r = pair(
        "shift_send_lat",
        15,
        &["-a", "-n", "10", "--timeline-ms", "0"],
    );
    ok(&r);
    let rows = r.client_json["results"].as_array().unwrap();
    assert_eq!(rows.len(), 23);
    for (k, row) in rows.iter().enumerate() {
        assert_eq!(row["size"], 2u64 << k);
        assert_eq!(row["iterations"], 10);
        assert!(row["lat_p50_us"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(r.client_json["size"], 8 << 20);
}

#[test]
fn send_bw_lands_every_message_in_a_receive() {
    let r = pair("shift_send_bw", 4, &["-s", "8192", "-n", "2000"]);
    ok(&r);
    assert_eq!(r.client_json["iterations"], 2000);
    assert_eq!(r.server_json["iterations"], 2000);
    assert_eq!(r.client_json["op"], "send");
}

#[test]
fn send_bw_on_three_qps_spreads_iterations_round_robin() {
    let r = pair(
        "shift_send_bw",
        13,
        &["-s", "4096", "-n", "3001", "-q", "3"],
    );
    ok(&r);
    assert_eq!(r.client_json["qps"], 3);
    assert_eq!(r.client_json["iterations"], 3001);
    assert_eq!(r.server_json["iterations"], 3001);
}

#[test]
fn send_bw_bidirectional_sends_both_ways_and_both_sides_finish() {
    let r = pair(
        "shift_send_bw",
        14,
        &["-s", "8192", "-n", "2000", "-b", "--report-both"],
    );
    ok(&r);
    for j in [&r.client_json, &r.server_json] {
        assert_eq!(j["bidirectional"], true);
        assert_eq!(j["iterations"], 2000);
        assert_eq!(j["table_from"], "sum");
        assert!(j["bw_avg_gbps"].as_f64().unwrap() > 0.0);
    }
    // perftest's summed row, then each direction's with --report-both.
    let client = result_rows(&r.client);
    let server = result_rows(&r.server);
    for rows in [&client, &server] {
        let [sum, local, remote] = rows.as_slice() else {
            panic!("three rows expected: {rows:?}");
        };
        assert!((sum[3] - local[3] - remote[3]).abs() < 0.02, "{rows:?}");
        assert!((sum[4] - local[4] - remote[4]).abs() < 2e-6, "{rows:?}");
    }
    assert_eq!(
        client[1], server[2],
        "the client's own row is the server's remote one"
    );
    assert_eq!(client[2], server[1]);
}

/// The rows of perftest's bandwidth or latency table in `o`'s stdout: the lines whose
/// fields are all numbers, as a perftest script reads them.
fn result_rows(o: &std::process::Output) -> Vec<Vec<f64>> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<f64> = l
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            (f.len() >= 5).then_some(f)
        })
        .collect()
}

/// The last row of perftest's table as the usual script takes it, `tail -2 | head -1` of
/// stdout (the last line is the table's closing rule), every field a number.
fn last_result_row(o: &std::process::Output) -> Vec<f64> {
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 2, "{}", text(o));
    assert!(lines[lines.len() - 1].starts_with("-----"), "{}", text(o));
    lines[lines.len() - 2]
        .split_whitespace()
        .map(|f| {
            f.parse()
                .unwrap_or_else(|_| panic!("{f:?} is not a number:\n{}", text(o)))
        })
        .collect()
}

#[test]
fn every_bandwidth_tool_ends_with_perftests_table_and_its_server_prints_the_result() {
    for (tool, test, size) in [
        ("shift_write_bw", 40, 65536.0),
        ("shift_send_bw", 41, 65536.0),
        ("shift_read_bw", 42, 65536.0),
        ("shift_atomic_bw", 43, 8.0),
    ] {
        let r = pair(tool, test, &["-n", "1000", "--timeline-ms", "50"]);
        ok(&r);
        let client = last_result_row(&r.client);
        let server = last_result_row(&r.server);
        for row in [&client, &server] {
            assert_eq!(row.len(), 5, "{tool}: {row:?}");
            assert_eq!((row[0], row[1]), (size, 1000.0), "{tool}: {row:?}");
            assert!(
                row[2] > 0.0 && row[3] > 0.0 && row[4] > 0.0,
                "{tool}: {row:?}"
            );
        }
        let from = if tool == "shift_send_bw" {
            "self"
        } else {
            // A WRITE, READ or atomic server prints the client's row, as perftest's does.
            assert_eq!(client, server, "{tool}");
            "peer"
        };
        assert_eq!(r.server_json["table_from"], from, "{tool}");
        let out = String::from_utf8_lossy(&r.server.stdout);
        assert!(
            out.starts_with(
                "************************************\n* Waiting for client to connect... *"
            ),
            "{tool}: {out}"
        );
        // Timeline lines are the client's (its JSON has the server's samples); a plain run
        // prints no failover summary.
        assert!(!out.contains("[timeline]"), "{tool}: {out}");
        for run in [&r.client, &r.server] {
            let out = String::from_utf8_lossy(&run.stdout);
            assert!(!out.contains("Failover summary"), "{tool}: {out}");
            assert!(!out.contains("bytes checked"), "{tool}: {out}");
        }
    }
}

#[test]
fn read_bw_with_check_reads_the_servers_pattern() {
    let r = pair(
        "shift_read_bw",
        5,
        &["-s", "16384", "-n", "1000", "--check"],
    );
    ok(&r);
    let c = &r.client_json;
    assert_eq!(c["iterations"], 1000);
    assert_eq!(c["check"]["bytes_checked"], 1000 * 16384);
    assert_eq!(c["check"]["errors"], 0);
}

#[test]
fn send_lat_and_read_lat_report_percentiles() {
    for (tool, test) in [("shift_send_lat", 6), ("shift_read_lat", 7)] {
        let r = pair(tool, test, &["-n", "500"]);
        ok(&r);
        assert!(
            r.client_json["lat_p50_us"].as_f64().unwrap() > 0.0,
            "{tool}"
        );
        assert_eq!(r.client_json["iterations"], 500, "{tool}");
        // perftest's latency row ends the output; the percentile dump only on request.
        let row = last_result_row(&r.client);
        assert_eq!(
            (row.len(), row[0], row[1]),
            (9, 2.0, 500.0),
            "{tool}: {row:?}"
        );
        assert!(!String::from_utf8_lossy(&r.client.stdout).contains("Percentile"));
    }
}

#[test]
fn every_latency_server_ends_with_the_clients_table() {
    for (tool, test) in [
        ("shift_write_lat", 48),
        ("shift_send_lat", 49),
        ("shift_read_lat", 51),
    ] {
        let r = pair(tool, test, &["-s", "64", "-n", "300"]);
        ok(&r);
        let client = last_result_row(&r.client);
        let server = last_result_row(&r.server);
        assert_eq!(
            (client.len(), client[0], client[1]),
            (9, 64.0, 300.0),
            "{tool}: {client:?}"
        );
        // t_min <= t_typical <= t_max, and the average inside them.
        assert!(
            client[2] > 0.0 && client[2] <= client[4] && client[4] <= client[3],
            "{tool}: {client:?}"
        );
        assert!(
            client[2] <= client[5] && client[5] <= client[3],
            "{tool}: {client:?}"
        );
        // The server times nothing: its table is the client's, sent in the client's done.
        assert_eq!(client, server, "{tool}");
        assert_eq!(r.server_json["table_from"], "peer", "{tool}");
        let peer = r.server_json["peer_results"].as_array().unwrap();
        assert_eq!(peer.len(), 1, "{tool}");
        assert_eq!(peer[0]["lat_avg_us"], r.client_json["lat_avg_us"], "{tool}");
        let out = String::from_utf8_lossy(&r.server.stdout);
        assert_eq!(
            out.matches("#bytes #iterations    t_min[usec]").count(),
            1,
            "{tool}: the header once, right above the rows: {out}"
        );
    }
}

#[test]
fn atomic_bw_executes_each_fetch_add_once() {
    let r = pair("shift_atomic_bw", 8, &["-n", "3000"]);
    ok(&r);
    let a = &r.client_json["atomic"];
    assert_eq!(a["posted"], 3000);
    assert_eq!(a["completed"], 3000);
    assert_eq!(a["remote_counter"], 3000);
    assert_eq!(a["fetched_in_sequence"], true);
    assert_eq!(a["double_executions"], 0);
}

fn one_line_error(o: &std::process::Output, code: i32, needle: &str) {
    assert_eq!(o.status.code(), Some(code), "{}", text(o));
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.contains("WARN")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(needle), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}

#[test]
fn a_wrong_flag_is_one_line_and_exit_code_2() {
    let o = wait(
        spawn("shift_write_bw", &["--no-such-flag".into()]),
        Duration::from_secs(10),
    );
    one_line_error(&o, 2, "--no-such-flag");
    let o = wait(
        spawn("shift_write_bw", &["-m".into(), "1000".into()]),
        Duration::from_secs(10),
    );
    one_line_error(&o, 2, "-m/--mtu 1000");
}

#[test]
fn an_unreachable_server_is_one_line() {
    let (port, _, client) = slot(9);
    let args: Vec<String> = vec![
        "-d".into(),
        format!("soft:lo@{client}"),
        "-p".into(),
        port.to_string(),
        "127.0.0.1".into(),
    ];
    let o = wait(spawn("shift_write_bw", &args), Duration::from_secs(20));
    one_line_error(&o, 1, "cannot connect to 127.0.0.1");
}

#[test]
fn output_prints_the_one_figure_asked_for_and_nothing_else() {
    let r = pair(
        "shift_read_bw",
        47,
        &["-n", "500", "--output", "message_rate"],
    );
    ok(&r);
    for (run, json) in [(&r.client, &r.client_json), (&r.server, &r.server_json)] {
        let out = String::from_utf8_lossy(&run.stdout);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let mpps: f64 = lines[0].parse().unwrap();
        // The server prints the client's figure, as its table would.
        let want = r.client_json["msg_rate_mpps"].as_f64().unwrap();
        assert!(
            mpps > 0.0 && (mpps - want).abs() < 1e-6,
            "{mpps} {want} {json}"
        );
    }
}

#[test]
fn a_client_started_before_its_server_connects_once_it_listens() {
    let (port, a_server, a_client) = slot(44);
    let dev = |a: &str| {
        vec![
            "-d".to_owned(),
            format!("soft:lo@{a}"),
            "-p".into(),
            port.to_string(),
        ]
    };
    let mut cargs = dev(&a_client);
    cargs.extend(["-n".into(), "100".into(), "127.0.0.1".into()]);
    let client = spawn("shift_write_bw", &cargs);
    std::thread::sleep(Duration::from_millis(1500));
    let mut sargs = dev(&a_server);
    sargs.extend(["-n".into(), "100".into()]);
    let server = spawn("shift_write_bw", &sargs);
    let c = wait(client, Duration::from_secs(30));
    let s = wait(server, Duration::from_secs(10));
    assert!(c.status.success(), "{}", text(&c));
    assert!(s.status.success(), "{}", text(&s));
    assert_eq!(last_result_row(&s)[1], 100.0);
}

#[test]
fn the_same_softnic_address_on_both_sides_names_the_fix() {
    let (port, a_server, _) = slot(45);
    let args = vec![
        "-d".to_owned(),
        format!("soft:lo@{a_server}"),
        "-p".into(),
        port.to_string(),
    ];
    let mut server = spawn("shift_write_bw", &args);
    let t0 = std::time::Instant::now();
    while !common::listening(port) {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut cargs = args.clone();
    cargs.push("127.0.0.1".into());
    let c = wait(spawn("shift_write_bw", &cargs), Duration::from_secs(20));
    server.kill().unwrap();
    let _ = server.wait();
    one_line_error(
        &c,
        1,
        "give each side its own address, e.g. -d soft:lo@127.0.0.2",
    );
}

#[test]
fn too_much_inline_data_names_the_flag_and_the_limit() {
    let o = wait(
        spawn(
            "shift_write_bw",
            &[
                "-I".into(),
                "900".into(),
                "-d".into(),
                "soft:lo@127.77.46.1".into(),
            ],
        ),
        Duration::from_secs(10),
    );
    one_line_error(
        &o,
        1,
        "-I/--inline_size 900: soft:lo@127.77.46.1 sends at most",
    );
}

#[test]
fn a_device_that_does_not_exist_is_one_line() {
    let o = wait(
        spawn(
            "shift_write_lat",
            &["-d".into(), "soft:nosuchnetdev0".into()],
        ),
        Duration::from_secs(10),
    );
    one_line_error(
        &o,
        1,
        "cannot open device soft:nosuchnetdev0: there is no netdev",
    );
}

#[test]
fn a_peer_with_another_size_is_refused_on_both_sides() {
    let (port, a_server, a_client) = slot(10);
    let server = spawn(
        "shift_write_bw",
        &[
            "-d".into(),
            format!("soft:lo@{a_server}"),
            "-p".into(),
            port.to_string(),
            "-s".into(),
            "4096".into(),
        ],
    );
    let t0 = std::time::Instant::now();
    while !common::listening(port) {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(10));
    }
    let client = spawn(
        "shift_write_bw",
        &[
            "-d".into(),
            format!("soft:lo@{a_client}"),
            "-p".into(),
            port.to_string(),
            "-s".into(),
            "8192".into(),
            "127.0.0.1".into(),
        ],
    );
    let c = wait(client, Duration::from_secs(20));
    let s = wait(server, Duration::from_secs(20));
    one_line_error(
        &c,
        1,
        "parameter mismatch: -s/-a (sizes) is 8192 here but 4096 at the peer",
    );
    one_line_error(
        &s,
        1,
        "parameter mismatch: -s/-a (sizes) is 4096 here but 8192 at the peer",
    );
}

#[test]
fn allreduce_of_two_ranks_verifies_every_iteration() {
    let r = pair(
        "shift_allreduce",
        11,
        &["-s", "65536", "-n", "100", "--check"],
    );
    ok(&r);
    for (j, rank) in [(&r.server_json, 0), (&r.client_json, 1)] {
        assert_eq!(j["tool"], "shift_allreduce");
        assert_eq!(j["op"], "allreduce");
        assert_eq!(j["rank"], rank);
        assert_eq!(j["ranks"], 2);
        assert_eq!(j["iterations"], 100);
        assert!(j["iterations_per_s"].as_f64().unwrap() > 0.0);
        assert_eq!(j["check"]["bytes_checked"], 100 * 65536);
        assert_eq!(j["check"]["errors"], 0);
        assert_eq!(j["check"]["notifications_checked"], 200);
        assert_eq!(j["check"]["notification_errors"], 0);
    }
}

#[test]
fn allreduce_of_three_ranks_finds_its_ring_through_rank_0() {
    let dir = TempDir::new("ring3");
    let (port, _, _) = slot(12);
    let args = |r: usize| -> Vec<String> {
        let mut v: Vec<String> = [
            "--ranks",
            "3",
            "-s",
            "12288",
            "-n",
            "50",
            "--timeline-ms",
            "0",
            "-p",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.push(port.to_string());
        v.extend(["-d".into(), format!("soft:lo@127.77.12.{}", r + 1)]);
        v.extend([
            "--json".into(),
            dir.file(&format!("r{r}.json")).display().to_string(),
        ]);
        if r > 0 {
            v.push("127.0.0.1".into());
        }
        v
    };
    let root = spawn("shift_allreduce", &args(0));
    let t0 = std::time::Instant::now();
    while !common::listening(port) {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(10));
    }
    let others: Vec<_> = (1..3).map(|r| spawn("shift_allreduce", &args(r))).collect();
    let mut outs = vec![wait(root, Duration::from_secs(60))];
    outs.extend(others.into_iter().map(|c| wait(c, Duration::from_secs(60))));
    let mut ranks_seen = Vec::new();
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank process {r}: {}", text(o));
        let j: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.file(&format!("r{r}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(j["iterations"], 50);
        assert_eq!(j["check"]["errors"], 0);
        assert_eq!(j["check"]["notifications_checked"], 50 * 4);
        ranks_seen.push(j["rank"].as_u64().unwrap());
    }
    ranks_seen.sort();
    assert_eq!(ranks_seen, vec![0, 1, 2]);
}

#[test]
fn a_client_whose_server_dies_writes_its_error_and_exits_1() {
    let dir = TempDir::new("dies");
    let (port, a_server, a_client) = slot(16);
    let mut server = spawn(
        "shift_write_bw",
        &[
            "-d".into(),
            format!("soft:lo@{a_server}"),
            "-p".into(),
            port.to_string(),
        ],
    );
    let t0 = std::time::Instant::now();
    while !common::listening(port) {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(10));
    }
    let json = dir.file("client.json");
    let mut client = spawn(
        "shift_write_bw",
        &[
            "-d".into(),
            format!("soft:lo@{a_client}"),
            "-p".into(),
            port.to_string(),
            "-D".into(),
            "10".into(),
            // 16.8 ms per try, 134 ms in all: the dead server is found quickly, and a live
            // one descheduled for a few ms on a loaded machine is not taken for dead (with
            // `-u 8`, 8 ms in all, the client failed about one run in six under CI's load).
            "-u".into(),
            "12".into(),
            "--timeline-ms".into(),
            "50".into(),
            "--json".into(),
            json.display().to_string(),
            "127.0.0.1".into(),
        ],
    );
    // The server dies once traffic flows: a timeline line that counts completions (a fixed
    // delay could kill it during setup on a slow machine, and a timeline line alone can come
    // before the first completion on a loaded one: the client then had none, seen once).
    let completed = |l: &str| {
        l.contains("[timeline]")
            && l.split("completions")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n > 0)
    };
    let lines = common::wait_for_line_where(&mut client, completed, Duration::from_secs(20));
    assert!(
        lines.iter().any(|l| completed(l)),
        "no timeline line with completions from the client: {lines:?}"
    );
    server.kill().unwrap();
    let _ = server.wait();
    let c = wait(client, Duration::from_secs(20));
    assert_eq!(c.status.code(), Some(1), "{}", text(&c));
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let e = j["error"].as_str().expect("error set");
    assert!(e.contains("RetryExcErr"), "{e}");
    assert!(j["iterations"].as_u64().unwrap() > 0);
}
