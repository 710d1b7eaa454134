//! `shift-testbed baseline`: the medium's floor between the two hosts over one rail.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::medium::{self, Endpoint, MediumError, PingPong, Stream, Wait};
use crate::topology::{Role, TestbedInfo};

/// Port the baseline uses on both hosts (kept away from RoCEv2's 4791).
const PORT: u16 = 47_900;

/// The medium's figures over one rail, all measured in one run.
#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    /// The rail measured.
    pub rail: u8,
    /// Rail MTU.
    pub mtu: u32,
    /// 8-byte ping-pong with busy-polling ends.
    pub ping_pong_busy: PingPong,
    /// 8-byte ping-pong with blocking ends.
    pub ping_pong_blocking: PingPong,
    /// Stream of full-size datagrams.
    pub stream: Stream,
}

/// The UDP payload of a full RoCEv2 RDMA WRITE packet at the largest RoCE path MTU the
/// link MTU allows: BTH (12) + RETH (16) + payload + ICRC (4).
pub fn roce_datagram_for(link_mtu: u32) -> usize {
    let roce_mtu = [4096u32, 2048, 1024, 512, 256]
        .into_iter()
        .find(|m| m + 12 + 16 + 4 + 8 + 20 <= link_mtu)
        .unwrap_or(256);
    (roce_mtu + 12 + 16 + 4) as usize
}

/// Measures ping-pong (busy and blocking) and a stream from host A to host B on `rail`.
pub fn measure(
    info: &TestbedInfo,
    rail: u8,
    iters: usize,
    duration: Duration,
    datagram: Option<usize>,
) -> Result<Baseline, MediumError> {
    let end = |role: Role| {
        let host = info.host(role);
        let addr = &host.nics[usize::from(rail).min(host.nics.len() - 1)].addr;
        Endpoint {
            netns: Some(host.netns.clone()),
            addr: SocketAddr::new(addr.parse().unwrap_or([0, 0, 0, 0].into()), PORT),
        }
    };
    let (a, b) = (end(Role::Initiator), end(Role::Responder));
    let ping_pong_busy = medium::ping_pong(&a, &b, 8, iters, Wait::Busy)?;
    let ping_pong_blocking = medium::ping_pong(&a, &b, 8, iters / 4, Wait::Blocking)?;
    let datagram = datagram.unwrap_or_else(|| roce_datagram_for(info.mtu));
    let stream = medium::stream(&a, &b, datagram, duration)?;
    Ok(Baseline {
        rail,
        mtu: info.mtu,
        ping_pong_busy,
        ping_pong_blocking,
        stream,
    })
}

impl Baseline {
    /// Prints the figures as a small table.
    pub fn print(&self) {
        println!(
            "medium baseline, rail {} (MTU {}), host A -> host B",
            self.rail, self.mtu
        );
        for p in [&self.ping_pong_busy, &self.ping_pong_blocking] {
            println!(
                "  UDP ping-pong {:>8} {:>3} B: one-way p50 {:>7.2} us  (RTT p50 {:.2} us, p99 {:.2} us, {} iters)",
                format!("{:?}", p.wait).to_lowercase(),
                p.payload,
                p.one_way_p50_us,
                p.rtt_p50_us,
                p.rtt_p99_us,
                p.iterations
            );
        }
        let s = &self.stream;
        println!(
            "  UDP stream {} B datagrams: {:.2} Gb/s goodput ({} of {} received in {:.1} s)",
            s.datagram, s.goodput_gbps, s.received, s.sent, s.seconds
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_datagram_fits_the_link() {
        assert_eq!(roce_datagram_for(9000), 4096 + 32);
        assert_eq!(roce_datagram_for(1500), 1024 + 32);
        assert_eq!(roce_datagram_for(1280), 1024 + 32);
    }
}
