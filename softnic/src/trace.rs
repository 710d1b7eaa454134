//! Optional pcap trace of every packet a device sends and receives, written with hw-defs'
//! pcap and header emitters. Each UDP payload is recorded verbatim (a received packet with a
//! bad ICRC stays bad in the trace) inside Ethernet, IP and UDP headers rebuilt as rxe sends
//! them (DF set, IP ID 0, UDP checksum 0 over IPv4).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hw_defs::pcap::{FileHeaderRepr, RecordHeaderRepr};
use hw_defs::roce::ethernet::{self, EthernetFrame, EthernetRepr};
use hw_defs::roce::ipv4::{self, Ipv4Packet, Ipv4Repr};
use hw_defs::roce::ipv6::{self, Ipv6Packet, Ipv6Repr};
use hw_defs::roce::udp::{self, UdpPacket, UdpRepr};

/// Locally administered MAC addresses derived from the IP address (the trace has no ARP).
fn mac_for(addr: IpAddr) -> [u8; 6] {
    let o = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets()[12..].to_vec(),
    };
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

/// A pcap file being written.
pub(crate) struct Trace {
    out: BufWriter<File>,
    /// Added to the device clock to get wall-clock timestamps.
    epoch: Duration,
    frame: Vec<u8>,
    snaplen: u32,
}

impl Trace {
    /// Creates (truncates) `path` and writes the pcap file header.
    pub fn create(path: &Path, clock_now: Duration) -> std::io::Result<Trace> {
        let mut out = BufWriter::new(File::create(path)?);
        let header = FileHeaderRepr::ethernet();
        out.write_all(&header.to_bytes())?;
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Ok(Trace {
            out,
            epoch: wall.saturating_sub(clock_now),
            frame: Vec::with_capacity(9216),
            snaplen: header.snaplen,
        })
    }

    /// Records one RoCEv2 UDP payload from `src:src_port` to `dst:dst_port` at device time `now`.
    pub fn record(
        &mut self,
        src: IpAddr,
        src_port: u16,
        dst: IpAddr,
        dst_port: u16,
        payload: &[u8],
        now: Duration,
    ) {
        let ip_len = match src {
            IpAddr::V4(_) => ipv4::HEADER_LEN,
            IpAddr::V6(_) => ipv6::HEADER_LEN,
        };
        let total = ethernet::HEADER_LEN + ip_len + udp::HEADER_LEN + payload.len();
        self.frame.clear();
        self.frame.resize(total, 0);
        let udp_start = ethernet::HEADER_LEN + ip_len;
        let (eth, rest) = self.frame.split_at_mut(ethernet::HEADER_LEN);
        let (ip, rest) = rest.split_at_mut(ip_len);
        let (udp_hdr, body) = rest.split_at_mut(udp::HEADER_LEN);
        body.copy_from_slice(payload);
        let udp_len = udp::HEADER_LEN + payload.len();
        let ethertype = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let r = Ipv4Repr {
                    src_addr: s,
                    dst_addr: d,
                    protocol: ipv4::PROTOCOL_UDP,
                    payload_len: udp_len,
                    ttl: 64,
                    dscp_ecn: 0,
                    ident: 0,
                    dont_frag: true,
                };
                if r.emit(&mut Ipv4Packet::new_unchecked(&mut *ip)).is_err() {
                    return;
                }
                ethernet::ETHERTYPE_IPV4
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let r = Ipv6Repr {
                    src_addr: s,
                    dst_addr: d,
                    next_header: ipv4::PROTOCOL_UDP,
                    payload_len: udp_len,
                    hop_limit: 64,
                    traffic_class: 0,
                    flow_label: 0,
                };
                if r.emit(&mut Ipv6Packet::new_unchecked(&mut *ip)).is_err() {
                    return;
                }
                ethernet::ETHERTYPE_IPV6
            }
            _ => return,
        };
        if (UdpRepr { src_port, dst_port })
            .emit(&mut UdpPacket::new_unchecked(&mut *udp_hdr), payload.len())
            .is_err()
        {
            return;
        }
        EthernetRepr {
            src_addr: mac_for(src),
            dst_addr: mac_for(dst),
            ethertype,
        }
        .emit(&mut EthernetFrame::new_unchecked(eth));
        if matches!(dst, IpAddr::V6(_)) {
            // IPv6 forbids a zero UDP checksum.
            UdpPacket::new_unchecked(&mut self.frame[udp_start..]).fill_checksum(src, dst);
        }
        let record = RecordHeaderRepr::for_frame(self.epoch + now, self.frame.len(), self.snaplen);
        let ok = self
            .out
            .write_all(&record.to_bytes())
            .and_then(|_| self.out.write_all(&self.frame[..record.incl_len as usize]));
        if let Err(e) = ok {
            tracing::warn!(error = %e, "pcap trace write failed");
        }
    }

    /// Pushes buffered records to the file.
    pub fn flush(&mut self) {
        if let Err(e) = self.out.flush() {
            tracing::warn!(error = %e, "pcap trace flush failed");
        }
    }
}
