//! When each phase of a failover and of the switch-back ends, QP by QP, from the two apps'
//! logs (`RUST_LOG=warn,pmd::resilient=debug,pmd::failover=info`): the first, median and
//! last QP of every phase, in milliseconds after the client's failover service saw the
//! default link change: where a 1,000-QP failover spends its time.

use std::collections::HashMap;

use serde::Serialize;

/// What the logs lacked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PhaseError {
    /// The client's log has no link change of this direction on its default device.
    #[error("the client's log has no `failover service: link changed ... change={0}` line (was it run with RUST_LOG=warn,pmd::resilient=debug,pmd::failover=info?)")]
    NoLinkChange(&'static str),
}

/// One phase at one end: when it ended for the first, median and last QP.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseRow {
    /// `client` or `server`.
    pub side: &'static str,
    /// The phase, named after the log line that ends it.
    pub phase: String,
    /// Milliseconds after the link change, first QP.
    pub first_ms: f64,
    /// ... median QP.
    pub median_ms: f64,
    /// ... last QP.
    pub last_ms: f64,
    /// QPs that went through the phase.
    pub qps: usize,
}

/// The failover (from the link-down) and the switch-back (from the link-up).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Breakdown {
    /// When the client's service had mailed the link-down to every QP, after it saw it.
    pub fan_out_ms: Option<f64>,
    /// Link-up after link-down, as the client's service saw them.
    pub down_for_ms: Option<f64>,
    /// Phases from the link-down to the link-up, in order of their median.
    pub failover: Vec<PhaseRow>,
    /// Phases from the link-up on, in order of their median.
    pub switch_back: Vec<PhaseRow>,
}

/// A log line that ends a phase: when (ms since the Unix epoch), the phase, the QP.
#[derive(Debug, Clone, PartialEq)]
struct Mark {
    at_ms: f64,
    phase: String,
    qp: u32,
}

/// Milliseconds since the Unix epoch of a `tracing` timestamp (`2026-11-26T02:54:41.521392Z`).
fn timestamp_ms(s: &str) -> Option<f64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    let sec = t.next()?.parse::<f64>().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days as f64 * 24.0 + h) * 60.0 + min) * 60_000.0 + sec * 1000.0)
}

/// The value of `key=` in a line, up to the next space (or the whole `qp=qp 0x11 on dev`).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(key)? + key.len();
    let rest = &line[at..];
    Some(rest.split(' ').next().unwrap_or(rest))
}

/// The QP a line names: `qp=qp 0x11 on soft:nic0` (the QP's lines) or `dest_qpn=17` (a
/// control message received: the destination is the receiver's default QPN).
fn qp_of(line: &str) -> Option<u32> {
    if let Some(hex) = field(line, "qp=qp 0x") {
        return u32::from_str_radix(hex, 16).ok();
    }
    field(line, "dest_qpn=")?.parse().ok()
}

/// The first word after `marker` (a message kind: `Failover`, `Rearm`, ...).
fn word_after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let at = line.find(marker)? + marker.len();
    line[at..]
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| !w.is_empty())
}

/// The phase a line ends, if any.
fn phase_of(line: &str) -> Option<String> {
    let message = |prefix: &str| {
        let after = line.find(" on ").map_or(line, |i| &line[i + 4..]);
        let after = after.split_once(' ').map_or("", |(_, r)| r);
        word_after(after, "").map(|w| format!("{prefix} {w}"))
    };
    if line.contains("failover: mail") {
        if line.contains("LinkDown") {
            return Some("mail LinkDown".into());
        }
        if line.contains("LinkUp") {
            return Some("mail LinkUp".into());
        }
        return word_after(line, "event=Control(").map(|k| format!("mail {k}"));
    }
    let fixed = [
        ("failover: round started", "round started"),
        ("failover: default QP drained", "default QP drained"),
        (
            "failover: traffic moved to the backup QP",
            "moved to the backup",
        ),
        (
            "failover: first completion on the backup QP",
            "first success on the backup",
        ),
        (
            "failover: receives back on the default QP",
            "receives back on the default",
        ),
        (
            "failover: sends back on the default QP",
            "sends back on the default",
        ),
    ];
    for (text, name) in fixed {
        if line.contains(text) {
            return Some(name.into());
        }
    }
    if line.contains("failover: control message sent") {
        return message("sent");
    }
    if line.contains("failover: control message received") {
        let kind = word_after(field_rest(line, "dest_qpn=")?, " ")?;
        return Some(format!("received {kind}"));
    }
    None
}

/// The rest of the line after `key=value`.
fn field_rest<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(key)? + key.len();
    let rest = &line[at..];
    Some(rest.find(' ').map_or("", |i| &rest[i..]))
}

/// Strips ANSI colour codes (a log written to a terminal).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn marks(log: &str) -> (Vec<Mark>, Vec<(f64, String)>) {
    let mut marks = Vec::new();
    let mut service = Vec::new();
    for raw in log.lines() {
        let line = plain(raw);
        let Some(at_ms) = line.split(' ').next().and_then(timestamp_ms) else {
            continue;
        };
        if line.contains("failover service: link change") {
            service.push((at_ms, line));
            continue;
        }
        if let (Some(phase), Some(qp)) = (phase_of(&line), qp_of(&line)) {
            marks.push(Mark { at_ms, phase, qp });
        }
    }
    (marks, service)
}

/// Each phase's first occurrence per QP within `[from, to)`, as rows relative to `from`.
fn rows(side: &'static str, marks: &[Mark], from: f64, to: f64) -> Vec<PhaseRow> {
    let mut by_phase: HashMap<&str, HashMap<u32, f64>> = HashMap::new();
    for m in marks.iter().filter(|m| m.at_ms >= from && m.at_ms < to) {
        by_phase
            .entry(&m.phase)
            .or_default()
            .entry(m.qp)
            .or_insert(m.at_ms - from);
    }
    by_phase
        .into_iter()
        .map(|(phase, qps)| {
            let mut v: Vec<f64> = qps.into_values().collect();
            v.sort_by(f64::total_cmp);
            PhaseRow {
                side,
                phase: phase.to_owned(),
                first_ms: v[0],
                median_ms: v[v.len() / 2],
                last_ms: v[v.len() - 1],
                qps: v.len(),
            }
        })
        .collect()
}

/// The breakdown of the first failover (and the switch-back after it) in the two logs.
pub fn breakdown(client_log: &str, server_log: &str) -> Result<Breakdown, PhaseError> {
    let (client, service) = marks(client_log);
    let (server, _) = marks(server_log);
    let changed = |dir: &str| {
        service
            .iter()
            .find(|(_, l)| l.contains("link changed") && l.contains(&format!("change={dir}")))
            .map(|(t, _)| *t)
    };
    let down = changed("Down").ok_or(PhaseError::NoLinkChange("Down"))?;
    let up = changed("Up").filter(|&u| u > down);
    let fan_out_ms = service
        .iter()
        .find(|(t, l)| *t >= down && l.contains("handed to every QP") && l.contains("change=Down"))
        .map(|(t, _)| t - down);
    let sorted = |mut v: Vec<PhaseRow>| {
        v.sort_by(|a, b| a.median_ms.total_cmp(&b.median_ms));
        v
    };
    let until = up.unwrap_or(f64::INFINITY);
    let mut failover = rows("client", &client, down, until);
    failover.extend(rows("server", &server, down, until));
    let mut switch_back = Vec::new();
    if let Some(up) = up {
        switch_back = rows("client", &client, up, f64::INFINITY);
        switch_back.extend(rows("server", &server, up, f64::INFINITY));
    }
    Ok(Breakdown {
        fan_out_ms,
        down_for_ms: up.map(|u| u - down),
        failover: sorted(failover),
        switch_back: sorted(switch_back),
    })
}

/// Prints the breakdown as two tables.
pub fn print(b: &Breakdown) {
    if let Some(f) = b.fan_out_ms {
        println!("link-down fan-out (every default QP to ERR, each mailed): {f:.2} ms");
    }
    let table = |title: &str, rows: &[PhaseRow]| {
        println!("{title}");
        println!(
            "  {:6} {:32} {:>9} {:>9} {:>9} {:>6}",
            "side", "phase ends", "first", "median", "last", "QPs"
        );
        for r in rows {
            println!(
                "  {:6} {:32} {:>9.2} {:>9.2} {:>9.2} {:>6}",
                r.side, r.phase, r.first_ms, r.median_ms, r.last_ms, r.qps
            );
        }
    };
    table(
        "failover, ms after the client's service saw the link-down:",
        &b.failover,
    );
    if let Some(d) = b.down_for_ms {
        table(
            &format!("switch-back, ms after the client's service saw the link-up ({d:.1} ms after the link-down):"),
            &b.switch_back,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "\
2026-11-26T02:54:38.748559Z  WARN pmd::memory: 2 MiB hugepages unavailable
 local address: QPN 0x0011 PSN 0x679d0f
2026-11-26T02:54:41.500000Z  INFO pmd::resilient::service: failover service: link changed device=soft:nic0 change=Down
2026-11-26T02:54:41.500500Z  INFO pmd::resilient::service: failover service: link change handed to every QP device=soft:nic0 change=Down qps=2 elapsed_us=495
2026-11-26T02:54:41.501000Z DEBUG pmd::resilient::driver: failover: mail qp=qp 0x11 on soft:nic0 event=LinkDown { path: Default }
2026-11-26T02:54:41.502000Z DEBUG pmd::resilient::perform: failover: control message sent qp=qp 0x11 on soft:nic0 Failover { epoch: Epoch(0), recvs_completed: 0, stale_recvs: 0 }
2026-11-26T02:54:41.503000Z DEBUG pmd::resilient::driver: failover: mail qp=qp 0x13 on soft:nic0 event=LinkDown { path: Default }
2026-11-26T02:54:41.505000Z DEBUG pmd::resilient::perform: failover: control message sent qp=qp 0x13 on soft:nic0 Failover { epoch: Epoch(0), recvs_completed: 0, stale_recvs: 0 }
2026-11-26T02:54:41.520000Z DEBUG pmd::resilient::control: failover: control message received dest_qpn=17 Failover { epoch: Epoch(0), recvs_completed: 0, stale_recvs: 0 }
2026-11-26T02:54:41.530000Z DEBUG pmd::resilient::driver: failover: mail qp=qp 0x11 on soft:nic0 event=Control(Failover { epoch: Epoch(0), recvs_completed: 0, stale_recvs: 0 })
2026-11-26T02:54:41.540000Z  INFO pmd::resilient::log: failover: first completion on the backup QP qp=qp 0x11 on soft:nic0 fallback_latency_us=40000
2026-11-26T02:54:43.500000Z  INFO pmd::resilient::service: failover service: link changed device=soft:nic0 change=Up
2026-11-26T02:54:44.500000Z DEBUG pmd::resilient::perform: failover: control message sent qp=qp 0x11 on soft:nic0 Rearm { epoch: Epoch(1) }
";
    const SERVER: &str = "\
2026-11-26T02:54:41.510000Z DEBUG pmd::resilient::control: failover: control message received dest_qpn=17 Failover { epoch: Epoch(0), recvs_completed: 0, stale_recvs: 0 }
2026-11-26T02:54:41.512000Z DEBUG pmd::resilient::control: failover: control message received dest_qpn=19 Failover { epoch: Epoch(0), recvs_completed: 0, stale_recvs: 0 }
";

    fn row<'a>(rows: &'a [PhaseRow], side: &str, phase: &str) -> &'a PhaseRow {
        rows.iter()
            .find(|r| r.side == side && r.phase == phase)
            .unwrap_or_else(|| panic!("no {side} {phase} in {rows:?}"))
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-3
    }

    #[test]
    fn each_phase_ends_for_the_first_median_and_last_qp_after_the_link_change() {
        let b = breakdown(CLIENT, SERVER).unwrap();
        assert!(close(b.fan_out_ms.unwrap(), 0.5));
        assert!(close(b.down_for_ms.unwrap(), 2000.0));
        let sent = row(&b.failover, "client", "sent Failover");
        assert_eq!(sent.qps, 2);
        assert!(close(sent.first_ms, 2.0) && close(sent.last_ms, 5.0));
        let recv = row(&b.failover, "server", "received Failover");
        assert_eq!(recv.qps, 2);
        assert!(close(recv.first_ms, 10.0) && close(recv.last_ms, 12.0));
        assert!(close(
            row(&b.failover, "client", "received Failover").first_ms,
            20.0
        ));
        assert!(close(
            row(&b.failover, "client", "mail Failover").first_ms,
            30.0
        ));
        assert!(close(
            row(&b.failover, "client", "mail LinkDown").median_ms,
            3.0
        ));
        assert!(close(
            row(&b.failover, "client", "first success on the backup").first_ms,
            40.0
        ));
        // Ordered by median; the switch-back starts at the link-up.
        assert!(b
            .failover
            .windows(2)
            .all(|w| w[0].median_ms <= w[1].median_ms));
        assert!(close(
            row(&b.switch_back, "client", "sent Rearm").first_ms,
            1000.0
        ));
        assert!(b.switch_back.iter().all(|r| r.phase != "sent Failover"));
    }

    #[test]
    fn a_log_without_the_link_change_is_an_error_naming_what_is_missing() {
        let e = breakdown(SERVER, SERVER).unwrap_err();
        assert_eq!(e, PhaseError::NoLinkChange("Down"));
        assert!(e.to_string().contains("RUST_LOG"));
    }

    #[test]
    fn timestamps_are_unix_milliseconds() {
        // 2026-11-26T00:00:00Z is 1795651200 s after the epoch.
        assert!(close(
            timestamp_ms("2026-11-26T00:00:01.250000Z").unwrap(),
            1_795_651_201_250.0
        ));
        assert_eq!(timestamp_ms("not a time"), None);
        assert_eq!(timestamp_ms("2026-11-26T00:00:01.25"), None);
    }
}
