//! The medium's floor: raw UDP ping-pong latency and raw UDP stream goodput between two
//! namespaces, measured over the same path the applications use.
//!
//! These are the baselines every scenario's latency and bandwidth are divided by, measured
//! in the same run, so a number printed by the testbed is a ratio to what the veth, the
//! bridge and the kernel's UDP stack give on this machine at this moment.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::netns::{self, NetnsError};

/// How the ping-pong waits for the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Wait {
    /// Nonblocking receive in a spin loop on both ends: the floor a busy-polling driver sees.
    Busy,
    /// Blocking receive: what a sleeping engine sees.
    Blocking,
}

/// One end of a measurement: a namespace (or `None` for this process's own) and an address.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Network namespace to run in; `None` runs in the caller's namespace.
    pub netns: Option<String>,
    /// Address and port to bind.
    pub addr: SocketAddr,
}

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum MediumError {
    /// A namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The peer stopped answering.
    #[error("no reply within {0:?}: is the path up?")]
    Timeout(Duration),
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> MediumError {
    move |source| MediumError::Io { what, source }
}

/// Result of a ping-pong run.
#[derive(Debug, Clone, Serialize)]
pub struct PingPong {
    /// How the ends waited.
    pub wait: Wait,
    /// UDP payload bytes per message.
    pub payload: usize,
    /// Round trips measured (after warm-up).
    pub iterations: usize,
    /// Median round-trip time.
    pub rtt_p50_us: f64,
    /// 99th-percentile round-trip time.
    pub rtt_p99_us: f64,
    /// Mean round-trip time.
    pub rtt_mean_us: f64,
    /// Half the median round-trip time: the one-way figure latency tools are compared with.
    pub one_way_p50_us: f64,
}

/// Result of a stream run.
#[derive(Debug, Clone, Serialize)]
pub struct Stream {
    /// UDP payload bytes per datagram.
    pub datagram: usize,
    /// How long the sender sent.
    pub seconds: f64,
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams received.
    pub received: u64,
    /// Payload goodput at the receiver, in Gb/s.
    pub goodput_gbps: f64,
}

fn bind_in(end: &Endpoint) -> Result<UdpSocket, MediumError> {
    let addr = end.addr;
    let bind = move || UdpSocket::bind(addr);
    let socket = match &end.netns {
        Some(ns) => netns::run_in(ns, bind)?,
        None => bind(),
    };
    socket.map_err(io("binding a UDP socket"))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Runs `iterations` round trips of `payload`-byte datagrams from `client` to `server`, after
/// a warm-up of a tenth as many.
pub fn ping_pong(
    client: &Endpoint,
    server: &Endpoint,
    payload: usize,
    iterations: usize,
    wait: Wait,
) -> Result<PingPong, MediumError> {
    let client_sock = bind_in(client)?;
    let server_sock = bind_in(server)?;
    let server_addr = server_sock.local_addr().map_err(io("server address"))?;
    let client_addr = client_sock.local_addr().map_err(io("client address"))?;
    let timeout = Duration::from_secs(2);
    for s in [&client_sock, &server_sock] {
        match wait {
            Wait::Busy => s.set_nonblocking(true).map_err(io("nonblocking"))?,
            Wait::Blocking => s.set_read_timeout(Some(timeout)).map_err(io("timeout"))?,
        }
    }
    let warmup = (iterations / 10).max(10);
    let total = warmup + iterations;
    let done = Arc::new(AtomicBool::new(false));
    let server_done = done.clone();
    let echo = std::thread::spawn(move || -> Result<(), MediumError> {
        let mut buf = vec![0u8; payload.max(1) + 64];
        for _ in 0..total {
            let n = recv_one(&server_sock, &mut buf, wait, timeout, &server_done)?;
            send_all(&server_sock, &buf[..n], client_addr)?;
        }
        Ok(())
    });
    let message = vec![0x5au8; payload];
    let mut buf = vec![0u8; payload.max(1) + 64];
    let mut rtts = Vec::with_capacity(iterations);
    let mut result = Ok(());
    for i in 0..total {
        let start = Instant::now();
        if let Err(e) = send_all(&client_sock, &message, server_addr)
            .and_then(|_| recv_one(&client_sock, &mut buf, wait, timeout, &done))
        {
            result = Err(e);
            break;
        }
        if i >= warmup {
            rtts.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    done.store(true, Ordering::Relaxed);
    let echoed = echo.join().unwrap_or(Ok(()));
    result?;
    echoed?;
    rtts.sort_by(f64::total_cmp);
    let mean = rtts.iter().sum::<f64>() / rtts.len().max(1) as f64;
    let p50 = percentile(&rtts, 50.0);
    Ok(PingPong {
        wait,
        payload,
        iterations,
        rtt_p50_us: p50,
        rtt_p99_us: percentile(&rtts, 99.0),
        rtt_mean_us: mean,
        one_way_p50_us: p50 / 2.0,
    })
}

fn send_all(s: &UdpSocket, data: &[u8], to: SocketAddr) -> Result<(), MediumError> {
    loop {
        match s.send_to(data, to) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => {
                return Err(MediumError::Io {
                    what: "sending",
                    source: e,
                })
            }
        }
    }
}

fn recv_one(
    s: &UdpSocket,
    buf: &mut [u8],
    wait: Wait,
    timeout: Duration,
    abandon: &AtomicBool,
) -> Result<usize, MediumError> {
    let start = Instant::now();
    loop {
        match s.recv_from(buf) {
            Ok((n, _)) => return Ok(n),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if abandon.load(Ordering::Relaxed) || start.elapsed() > timeout {
                    return Err(MediumError::Timeout(timeout));
                }
                if wait == Wait::Busy {
                    std::hint::spin_loop();
                }
            }
            Err(e) => {
                return Err(MediumError::Io {
                    what: "receiving",
                    source: e,
                })
            }
        }
    }
}

/// Sends `datagram`-byte datagrams from `sender` to `receiver` as fast as the sender can for
/// `duration`, and measures what arrives.
pub fn stream(
    sender: &Endpoint,
    receiver: &Endpoint,
    datagram: usize,
    duration: Duration,
) -> Result<Stream, MediumError> {
    let tx = bind_in(sender)?;
    let rx = bind_in(receiver)?;
    let rx_addr = rx.local_addr().map_err(io("receiver address"))?;
    enlarge_receive_buffer(&rx);
    rx.set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(io("timeout"))?;
    let received = Arc::new(AtomicU64::new(0));
    let sending = Arc::new(AtomicBool::new(true));
    let ready = Arc::new(Barrier::new(2));
    let (rx_count, rx_sending, rx_ready) = (received.clone(), sending.clone(), ready.clone());
    let receiver_thread = std::thread::spawn(move || {
        let mut buf = vec![0u8; datagram + 64];
        rx_ready.wait();
        loop {
            match rx.recv_from(&mut buf) {
                Ok(_) => {
                    rx_count.fetch_add(1, Ordering::Relaxed);
                }
                // Stop once the sender is done and the socket has drained.
                Err(_) if !rx_sending.load(Ordering::Relaxed) => break,
                Err(_) => {}
            }
        }
    });
    let message = vec![0xa5u8; datagram];
    ready.wait();
    let start = Instant::now();
    let mut sent = 0u64;
    let mut send_error = None;
    while start.elapsed() < duration {
        match tx.send_to(&message, rx_addr) {
            Ok(_) => sent += 1,
            // A full socket buffer or a full device queue: the medium's own back-pressure.
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOBUFS as i32) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                send_error = Some(e);
                break;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    sending.store(false, Ordering::Relaxed);
    let _ = receiver_thread.join();
    if let Some(e) = send_error {
        return Err(MediumError::Io {
            what: "sending",
            source: e,
        });
    }
    let got = received.load(Ordering::Relaxed);
    Ok(Stream {
        datagram,
        seconds,
        sent,
        received: got,
        goodput_gbps: (got as f64 * datagram as f64 * 8.0) / seconds / 1e9,
    })
}

fn enlarge_receive_buffer(s: &UdpSocket) {
    use nix::sys::socket::{setsockopt, sockopt};
    // 8 MiB keeps the receiver from dropping bursts it could have absorbed; the kernel caps it
    // at rmem_max, which is fine: the figure is then what a default socket gets.
    if let Err(e) = setsockopt(s, sockopt::RcvBuf, &(8 << 20)) {
        tracing::debug!(error = %e, "could not enlarge the receive buffer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lo(port: u16) -> Endpoint {
        Endpoint {
            netns: None,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    #[test]
    fn ping_pong_on_loopback_measures_positive_ordered_percentiles() {
        let r = ping_pong(&lo(0), &lo(0), 8, 200, Wait::Blocking).expect("ping-pong");
        assert_eq!(r.iterations, 200);
        assert!(r.rtt_p50_us > 0.0);
        assert!(r.rtt_p50_us <= r.rtt_p99_us);
        assert!((r.one_way_p50_us * 2.0 - r.rtt_p50_us).abs() < 1e-9);
    }

    #[test]
    fn stream_on_loopback_receives_no_more_than_was_sent() {
        let r = stream(&lo(0), &lo(0), 1024, Duration::from_millis(100)).expect("stream");
        assert!(r.sent > 0);
        assert!(r.received > 0 && r.received <= r.sent, "{r:?}");
        assert!(r.goodput_gbps > 0.0);
    }

    #[test]
    fn percentile_picks_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
