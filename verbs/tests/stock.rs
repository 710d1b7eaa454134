//! The distribution's stock verbs binaries, unmodified, over railshift softnic devices on
//! loopback: `LD_PRELOAD=librailshift_verbs.so RAILSHIFT_DEVICES=rs0=soft:lo@<addr>`, a
//! server and a client per case, each on its own loopback address. Every pair must exit 0.
//!
//! Needs the Debian packages `perftest` and `ibverbs-utils` (`tools/test` installs them); a
//! case whose binary is missing skips with a printed reason.

mod common;

use std::process::Command;

use common::{assert_both_ok, binary, run_pair, shim, side, SERIAL};

fn device(addr: &str) -> String {
    format!("rs0=soft:lo@{addr}")
}

/// Runs `tool args` as a server on 127.0.<net>.1 and a client on 127.0.<net>.2; both must
/// exit 0. Returns the client's stdout.
fn pair(tool: &str, args: &[&str], net: u8) -> Option<String> {
    let Some(bin) = binary(tool) else {
        eprintln!("skipped: /usr/bin/{tool} is missing (install perftest and ibverbs-utils)");
        return None;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = 19000 + u16::from(net);
    let what = format!("{tool} {args:?}");
    let (server, client) = (
        device(&format!("127.0.{net}.1")),
        device(&format!("127.0.{net}.2")),
    );
    let (s, c) = run_pair(
        &what,
        port,
        || side(&bin, &[("RAILSHIFT_DEVICES", &server)], port, args, None),
        || {
            side(
                &bin,
                &[("RAILSHIFT_DEVICES", &client)],
                port,
                args,
                Some("127.0.0.1"),
            )
        },
    );
    assert_both_ok(&what, &s, &c);
    Some(String::from_utf8_lossy(&c.stdout).into_owned())
}

#[test]
fn ibv_devices_lists_ours_in_front() {
    let Some(bin) = binary("ibv_devices") else {
        eprintln!("skipped: /usr/bin/ibv_devices is missing (install ibverbs-utils)");
        return;
    };
    let out = Command::new(bin)
        .env("LD_PRELOAD", shim())
        .env(
            "RAILSHIFT_DEVICES",
            "rs0=soft:lo@127.0.40.1,rs1=soft:lo@127.0.40.2",
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let rs0 = text.find("rs0").expect("rs0 listed");
    let rs1 = text.find("rs1").expect("rs1 listed");
    assert!(rs0 < rs1, "{text}");
}

#[test]
fn ibv_devinfo_shows_an_active_roce_v2_port() {
    let Some(bin) = binary("ibv_devinfo") else {
        eprintln!("skipped: /usr/bin/ibv_devinfo is missing (install ibverbs-utils)");
        return;
    };
    let out = Command::new(bin)
        .args(["-v", "-d", "rs0"])
        .env("LD_PRELOAD", shim())
        .env("RAILSHIFT_DEVICES", "rs0=soft:lo@127.0.41.1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "hca_id:\trs0",
        "PORT_ACTIVE",
        "link_layer:\t\tEthernet",
        "::ffff:127.0.41.1, RoCE v2",
    ] {
        assert!(text.contains(want), "no `{want}` in:\n{text}");
    }
}

#[test]
fn a_bad_device_list_is_an_error_naming_it() {
    let Some(bin) = binary("ibv_devinfo") else {
        eprintln!("skipped: /usr/bin/ibv_devinfo is missing (install ibverbs-utils)");
        return;
    };
    let out = Command::new(bin)
        .env("LD_PRELOAD", shim())
        .env("RAILSHIFT_DEVICES", "rs0=soft:lo@127.0.42.1,rs0=soft:lo")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`rs0` is given twice"), "{err}");
}

#[test]
fn ibv_rc_pingpong_checks_its_data() {
    pair("ibv_rc_pingpong", &["-g", "0", "-n", "100", "--chk"], 43);
}

#[test]
fn ibv_rc_pingpong_with_completion_events() {
    pair(
        "ibv_rc_pingpong",
        &["-g", "0", "-n", "100", "-e", "--chk"],
        44,
    );
}

#[test]
fn ibv_rc_pingpong_with_large_messages() {
    pair(
        "ibv_rc_pingpong",
        &["-g", "0", "-n", "50", "-s", "65536"],
        45,
    );
}

#[test]
fn ibv_uc_pingpong_is_refused_as_a_provider_refuses_uc() {
    let Some(bin) = binary("ibv_uc_pingpong") else {
        eprintln!("skipped: /usr/bin/ibv_uc_pingpong is missing (install ibverbs-utils)");
        return;
    };
    let out = Command::new(bin)
        .args(["-d", "rs0", "-g", "0", "-p", "19046"])
        .env("LD_PRELOAD", shim())
        .env("RAILSHIFT_DEVICES", "rs0=soft:lo@127.0.46.1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("UC QPs"), "{err}");
}

#[test]
fn ibv_srq_pingpong_checks_its_data_over_16_qps_on_one_srq() {
    pair("ibv_srq_pingpong", &["-g", "0", "-n", "100", "-c"], 47);
}

#[test]
fn ibv_srq_pingpong_with_completion_events_and_4_qps() {
    pair(
        "ibv_srq_pingpong",
        &["-g", "0", "-q", "4", "-n", "100", "-e", "-c"],
        48,
    );
}

#[test]
fn ib_write_bw_common_flags() {
    pair("ib_write_bw", &["-n", "300"], 50);
    pair("ib_write_bw", &["-s", "8", "-n", "500", "-I", "8"], 51);
    pair("ib_write_bw", &["-a", "-n", "10"], 52);
    pair("ib_write_bw", &["-D", "2"], 53);
    pair(
        "ib_write_bw",
        &[
            "-q",
            "2",
            "-t",
            "64",
            "-Q",
            "4",
            "-l",
            "4",
            "-F",
            "--report_gbits",
            "-n",
            "300",
        ],
        54,
    );
    pair("ib_write_bw", &["-b", "-n", "200"], 55);
}

#[test]
fn ib_write_lat_common_flags() {
    pair("ib_write_lat", &["-n", "300"], 60);
    pair("ib_write_lat", &["-s", "8", "-I", "8", "-n", "500"], 61);
    pair("ib_write_lat", &["-a", "-n", "10", "-F"], 62);
    pair("ib_write_lat", &["-D", "2"], 63);
}

#[test]
fn ib_read_bw_common_flags() {
    pair("ib_read_bw", &["-n", "300"], 70);
    pair("ib_read_bw", &["-D", "2", "-s", "4096", "-q", "2"], 71);
    pair("ib_read_bw", &["-a", "-n", "10", "--report_gbits"], 72);
}

#[test]
fn ib_read_lat_common_flags() {
    pair("ib_read_lat", &["-n", "300"], 75);
    pair("ib_read_lat", &["-a", "-n", "10"], 76);
}

#[test]
fn ib_send_bw_common_flags() {
    pair("ib_send_bw", &["-n", "300"], 80);
    pair("ib_send_bw", &["-b", "-n", "200", "-q", "2"], 81);
    pair("ib_send_bw", &["-e", "-n", "200"], 82);
    pair("ib_send_bw", &["-D", "2", "-s", "8", "-I", "8"], 83);
}

#[test]
fn ib_send_lat_common_flags() {
    pair("ib_send_lat", &["-n", "300"], 85);
    pair("ib_send_lat", &["-s", "8", "-I", "8", "-n", "300"], 86);
    pair("ib_send_lat", &["-a", "-n", "10"], 87);
}

#[test]
fn ib_atomic_bw_both_atomics() {
    pair("ib_atomic_bw", &["-n", "300"], 90);
    pair("ib_atomic_bw", &["-A", "CMP_AND_SWAP", "-n", "300"], 91);
    pair("ib_atomic_bw", &["-D", "2", "-q", "2"], 92);
}

/// With the mlx5 feature, a `mlx5:` device this machine does not have is an error naming it
/// from `ibv_open_device`, not a hang or a crash: the pmd's mlx5 provider lists devices
/// through the shim's own `ibv_get_device_list` while the shim opens it, and must be given
/// the system's list alone (never `rs0` itself).
#[cfg(feature = "mlx5")]
#[test]
fn an_absent_mlx5_device_is_an_error_naming_it() {
    let Some(bin) = binary("ibv_devinfo") else {
        eprintln!("skipped: /usr/bin/ibv_devinfo is missing (install ibverbs-utils)");
        return;
    };
    let child = Command::new(bin)
        .args(["-d", "rs0"])
        .env("LD_PRELOAD", shim())
        .env("RAILSHIFT_DEVICES", "rs0=mlx5:rs_absent0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ibv_devinfo");
    let out = common::finish(child, "ibv_devinfo -d rs0 on an absent mlx5 device");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", common::show(&out));
    assert!(
        err.contains("ibv_open_device") && err.contains("mlx5:rs_absent0"),
        "{}",
        common::show(&out)
    );
    assert!(
        !err.contains("present: rs0"),
        "the provider saw the shim's own device: {}",
        common::show(&out)
    );
}
