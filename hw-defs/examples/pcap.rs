//! Writes a pcap (link type Ethernet) holding one RoCEv2 packet of each RC kind railshift
//! speaks, with correct IPv4 checksums and ICRCs, for Wireshark's RoCE dissector:
//!
//! ```text
//! cargo run -p hw-defs --example pcap -- OUT.pcap
//! ```
//!
//! It prints one line per packet, tab-separated: the frame number, the packet's name, then
//! `field=value` for the Wireshark fields it wrote (numbers; `bytes:` and `text:` values compare
//! as strings). `tools/check-pcap` decodes the file with tshark and compares every one.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use hw_defs::pcap::Capture;
use hw_defs::roce::aeth::{AethRepr, NakCode, Syndrome, CREDITS_UNLIMITED};
use hw_defs::roce::atomic_ack_eth::AtomicAckEthRepr;
use hw_defs::roce::atomic_eth::AtomicEthRepr;
use hw_defs::roce::bth::{BthRepr, DEFAULT_PKEY};
use hw_defs::roce::immdt::ImmDtRepr;
use hw_defs::roce::ipv4::Ipv4Repr;
use hw_defs::roce::ipv6::Ipv6Repr;
use hw_defs::roce::reth::RethRepr;
use hw_defs::roce::udp::{rxe_src_port, ROCEV2_PORT};
use hw_defs::roce::{DatagramRepr, FrameRepr, IpRepr, Opcode, PacketRepr, Psn, UdpRepr};

const REQUESTER_QPN: u32 = 0x11;
const RESPONDER_QPN: u32 = 0x12;
const REQUESTER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const RESPONDER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const REQUESTER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const RESPONDER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const RKEY: u32 = 0x1234;
const REMOTE_VA: u64 = 0x7f00_0000_1000;

/// Who sends a packet: the requester (to the responder's QP) or the responder.
#[derive(Clone, Copy)]
enum Sender {
    Requester,
    Responder,
}

fn bth(opcode: Opcode, to: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp: to,
        ack_req: opcode.is_request(),
        psn: Psn::new(psn),
    }
}

fn packet(opcode: Opcode, from: Sender, psn: u32) -> PacketRepr<'static> {
    let to = match from {
        Sender::Requester => RESPONDER_QPN,
        Sender::Responder => REQUESTER_QPN,
    };
    PacketRepr {
        deth: None,
        bth: bth(opcode, to, psn),
        reth: None,
        atomic_eth: None,
        aeth: None,
        atomic_ack_eth: None,
        immdt: None,
        payload: &[],
    }
}

fn ack(msn: u32) -> Option<AethRepr> {
    Some(AethRepr {
        syndrome: Syndrome::Ack {
            credit_code: CREDITS_UNLIMITED,
        },
        msn,
    })
}

fn ipv4(from: Sender) -> (IpRepr, [u8; 6], [u8; 6], u16) {
    let (src, dst, src_mac, dst_mac, qpn) = match from {
        Sender::Requester => (
            REQUESTER_IP,
            RESPONDER_IP,
            REQUESTER_MAC,
            RESPONDER_MAC,
            REQUESTER_QPN,
        ),
        Sender::Responder => (
            RESPONDER_IP,
            REQUESTER_IP,
            RESPONDER_MAC,
            REQUESTER_MAC,
            RESPONDER_QPN,
        ),
    };
    let ip = IpRepr::Ipv4(Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        protocol: 17,
        payload_len: 0,
        ttl: 64,
        dscp_ecn: 0,
        ident: 0,
        dont_frag: true,
    });
    (ip, src_mac, dst_mac, rxe_src_port(qpn))
}

fn frame(from: Sender, ip: Option<IpRepr>, packet: PacketRepr<'_>) -> FrameRepr<'_> {
    let (v4, src_mac, dst_mac, src_port) = ipv4(from);
    FrameRepr {
        src_mac,
        dst_mac,
        datagram: DatagramRepr {
            ip: ip.unwrap_or(v4),
            udp: UdpRepr {
                src_port,
                dst_port: ROCEV2_PORT,
            },
            packet,
        },
    }
}

fn packets() -> Vec<(&'static str, FrameRepr<'static>)> {
    use Sender::{Requester, Responder};
    let reth = |len| {
        Some(RethRepr {
            va: REMOTE_VA,
            rkey: RKEY,
            dma_length: len,
        })
    };
    let atomic = |swap_add, compare| {
        Some(AtomicEthRepr {
            va: REMOTE_VA + 0x1000,
            rkey: RKEY,
            swap_add,
            compare,
        })
    };
    const WRITE: &[u8] = b"hello, world!";
    const READ: &[u8] = &[0xa5; 64];
    vec![
        (
            "RDMA WRITE Only",
            frame(
                Requester,
                None,
                PacketRepr {
                    deth: None,
                    reth: reth(WRITE.len() as u32),
                    payload: WRITE,
                    ..packet(Opcode::RdmaWriteOnly, Requester, 0x100)
                },
            ),
        ),
        (
            "RDMA WRITE Only with Immediate",
            frame(
                Requester,
                None,
                PacketRepr {
                    deth: None,
                    reth: reth(8),
                    immdt: Some(ImmDtRepr { imm: 0xcafe_babe }),
                    payload: b"notified",
                    ..packet(Opcode::RdmaWriteOnlyWithImmediate, Requester, 0x101)
                },
            ),
        ),
        (
            "SEND Only",
            frame(
                Requester,
                None,
                PacketRepr {
                    deth: None,
                    payload: b"a send to a receive WQE",
                    ..packet(Opcode::SendOnly, Requester, 0x102)
                },
            ),
        ),
        (
            "RDMA READ Request",
            frame(
                Requester,
                None,
                PacketRepr {
                    deth: None,
                    reth: reth(READ.len() as u32),
                    ..packet(Opcode::RdmaReadRequest, Requester, 0x103)
                },
            ),
        ),
        (
            "RDMA READ response Only",
            frame(
                Responder,
                None,
                PacketRepr {
                    deth: None,
                    aeth: ack(4),
                    payload: READ,
                    ..packet(Opcode::RdmaReadResponseOnly, Responder, 0x103)
                },
            ),
        ),
        (
            "Acknowledge",
            frame(
                Responder,
                None,
                PacketRepr {
                    deth: None,
                    aeth: ack(3),
                    ..packet(Opcode::Acknowledge, Responder, 0x102)
                },
            ),
        ),
        (
            "CmpSwap",
            frame(
                Requester,
                None,
                PacketRepr {
                    deth: None,
                    atomic_eth: atomic(2, 1),
                    ..packet(Opcode::CompareSwap, Requester, 0x104)
                },
            ),
        ),
        (
            "FetchAdd",
            frame(
                Requester,
                None,
                PacketRepr {
                    deth: None,
                    atomic_eth: atomic(5, 0),
                    ..packet(Opcode::FetchAdd, Requester, 0x105)
                },
            ),
        ),
        (
            "Atomic Acknowledge",
            frame(
                Responder,
                None,
                PacketRepr {
                    deth: None,
                    aeth: ack(6),
                    atomic_ack_eth: Some(AtomicAckEthRepr { orig_rem_dt: 41 }),
                    ..packet(Opcode::AtomicAcknowledge, Responder, 0x105)
                },
            ),
        ),
        (
            "RNR NAK (timer code 14)",
            frame(
                Responder,
                None,
                PacketRepr {
                    deth: None,
                    aeth: Some(AethRepr {
                        syndrome: Syndrome::RnrNak { timer_code: 14 },
                        msn: 6,
                    }),
                    ..packet(Opcode::Acknowledge, Responder, 0x106)
                },
            ),
        ),
        (
            "NAK remote access error",
            frame(
                Responder,
                None,
                PacketRepr {
                    deth: None,
                    aeth: Some(AethRepr {
                        syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                        msn: 6,
                    }),
                    ..packet(Opcode::Acknowledge, Responder, 0x107)
                },
            ),
        ),
        (
            "SEND Only with Immediate over IPv6, PSN at the wrap",
            frame(
                Requester,
                Some(IpRepr::Ipv6(Ipv6Repr {
                    src_addr: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
                    dst_addr: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
                    next_header: 17,
                    payload_len: 0,
                    hop_limit: 64,
                    traffic_class: 0,
                    flow_label: 0,
                })),
                PacketRepr {
                    deth: None,
                    immdt: Some(ImmDtRepr { imm: 7 }),
                    payload: b"v6",
                    ..packet(Opcode::SendOnlyWithImmediate, Requester, 0xff_ffff)
                },
            ),
        ),
    ]
}

/// The Wireshark fields and the values we wrote, for `tools/check-pcap`.
fn expected_fields(frame: &FrameRepr<'_>, bytes: &[u8]) -> Vec<(&'static str, String)> {
    let datagram = &frame.datagram;
    let packet = &datagram.packet;
    let bth = packet.bth;
    let mut fields = vec![
        ("infiniband.bth.opcode", u8::from(bth.opcode).to_string()),
        ("infiniband.bth.destqp", bth.dest_qp.to_string()),
        ("infiniband.bth.psn", bth.psn.value().to_string()),
        ("infiniband.bth.p_key", bth.pkey.to_string()),
        (
            "infiniband.bth.padcnt",
            hw_defs::roce::packet::pad_for(packet.payload.len()).to_string(),
        ),
        ("udp.srcport", datagram.udp.src_port.to_string()),
        ("udp.dstport", datagram.udp.dst_port.to_string()),
    ];
    match datagram.ip {
        IpRepr::Ipv4(ip) => {
            fields.push(("ip.src", format!("text:{}", ip.src_addr)));
            fields.push(("ip.dst", format!("text:{}", ip.dst_addr)));
            // 1: the header checksum verified good. 3: UDP checksum not present (zero).
            fields.push(("ip.checksum.status", "1".into()));
            fields.push(("udp.checksum.status", "3".into()));
        }
        IpRepr::Ipv6(ip) => {
            fields.push(("ipv6.src", format!("text:{}", ip.src_addr)));
            fields.push(("ipv6.dst", format!("text:{}", ip.dst_addr)));
            fields.push(("udp.checksum.status", "1".into()));
        }
    }
    if let Some(reth) = packet.reth {
        fields.push(("infiniband.reth.va", reth.va.to_string()));
        fields.push(("infiniband.reth.r_key", reth.rkey.to_string()));
        fields.push(("infiniband.reth.dmalen", reth.dma_length.to_string()));
    }
    if let Some(atomic) = packet.atomic_eth {
        // Wireshark shows the AtomicETH address and key in the RETH fields.
        fields.push(("infiniband.reth.va", atomic.va.to_string()));
        fields.push(("infiniband.reth.r_key", atomic.rkey.to_string()));
        fields.push(("infiniband.atomiceth.swapdt", atomic.swap_add.to_string()));
        fields.push(("infiniband.atomiceth.cmpdt", atomic.compare.to_string()));
    }
    if let Some(aeth) = packet.aeth {
        fields.push((
            "infiniband.aeth.syndrome",
            u8::from(aeth.syndrome).to_string(),
        ));
        fields.push(("infiniband.aeth.msn", aeth.msn.to_string()));
    }
    if let Some(ack) = packet.atomic_ack_eth {
        fields.push((
            "infiniband.atomicacketh.origremdt",
            ack.orig_rem_dt.to_string(),
        ));
    }
    if let Some(immdt) = packet.immdt {
        fields.push(("infiniband.immdt", format!("bytes:{:08x}", immdt.imm)));
    }
    // Wireshark shows the ICRC bytes as a big-endian number; we store the CRC little-endian.
    let icrc = &bytes[bytes.len() - 4..];
    fields.push((
        "infiniband.invariant.crc",
        u32::from_be_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]).to_string(),
    ));
    fields
}

fn main() {
    let Some(out) = std::env::args_os().nth(1) else {
        eprintln!("usage: cargo run -p hw-defs --example pcap -- OUT.pcap");
        std::process::exit(2);
    };
    let mut capture = Capture::new();
    for (i, (name, frame)) in packets().iter().enumerate() {
        let bytes = match frame.to_vec() {
            Ok(bytes) => bytes,
            Err(e) => {
                eprintln!("cannot build {name}: {e}");
                std::process::exit(1);
            }
        };
        capture.push(Duration::from_millis(i as u64), &bytes);
        let fields: Vec<String> = expected_fields(frame, &bytes)
            .into_iter()
            .map(|(field, value)| format!("{field}={value}"))
            .collect();
        println!("{}\t{}\t{}", i + 1, name, fields.join("\t"));
    }
    if let Err(e) = std::fs::write(&out, capture.as_bytes()) {
        eprintln!("cannot write {}: {e}", out.to_string_lossy());
        std::process::exit(1);
    }
}
