//! The invariant CRC of RoCEv2, exactly as Linux rxe computes it (`rxe_icrc.c`).
//!
//! The CRC is CRC-32 (the Ethernet/zlib polynomial) over:
//! 1. eight 0xff bytes standing in for the InfiniBand LRH (rxe starts from the register value
//!    those leave behind, 0xdebb20e3);
//! 2. the IP header with its variant fields masked to ones: IPv4 TOS, TTL and header checksum;
//!    IPv6 traffic class, flow label and hop limit;
//! 3. the UDP header with its checksum masked to ones;
//! 4. the BTH with byte 4 (FECN, BECN and the reserved bits) masked to ones;
//! 5. the rest of the packet up to the ICRC: extension headers, payload and pad.
//!
//! The result is inverted and stored in the packet's last four bytes little-endian (rxe stores
//! the `u32` in host order on a little-endian machine, and interoperating stacks follow it).
//! Numerically it equals `zlib.crc32(b"\xff" * 8 + masked_bytes)`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::crc32;
use super::ipv4::{self, Ipv4Packet};
use super::ipv6::{self, Ipv6Packet};
use super::{bth, udp};
use crate::error::{check_len, Error};

/// Length of the ICRC.
pub const ICRC_LEN: usize = 4;
/// The CRC register after eight 0xff bytes from the all-ones start: rxe's starting value.
pub const LRH_SEED: u32 = 0xdebb_20e3;

const LAYOUT: &str = "RoCEv2 datagram";
const MASKED_LEN_MAX: usize = ipv6::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN;

/// The IP header fields the ICRC covers that a UDP socket does not hand the receiver; with
/// them, the addresses and the ports the IP and UDP headers can be rebuilt for the ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFields {
    /// IPv4 (no options).
    V4 {
        /// The source address.
        src: Ipv4Addr,
        /// The destination address.
        dst: Ipv4Addr,
        /// The identification.
        ident: u16,
        /// The don't-fragment flag.
        dont_frag: bool,
    },
    /// IPv6 (no extension headers).
    V6 {
        /// The source address.
        src: Ipv6Addr,
        /// The destination address.
        dst: Ipv6Addr,
    },
}

impl IpFields {
    /// What our senders emit, as rxe does: IPv4 with DF set and IP ID 0, or plain IPv6.
    /// Fails if the two addresses are of different families.
    pub fn rxe(src: IpAddr, dst: IpAddr) -> Result<Self, Error> {
        match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Ok(IpFields::V4 {
                src,
                dst,
                ident: 0,
                dont_frag: true,
            }),
            (IpAddr::V6(src), IpAddr::V6(dst)) => Ok(IpFields::V6 { src, dst }),
            _ => Err(Error::BadField {
                layout: LAYOUT,
                field: "address family",
                value: 0,
                expected: "source and destination of the same family",
            }),
        }
    }
}

/// A CRC-32 register update (IEEE 802.3, reflected polynomial 0xEDB88320, no inversion on
/// entry or exit, like Linux's `crc32_le`): what the ICRC is made of. [`crc32_register`] is
/// this crate's own (a table, slice-by-8); a user with a faster one (a carry-less multiply,
/// as `crc32fast` has) passes it to the `_with` functions.
pub type CrcRegister = fn(u32, &[u8]) -> u32;

/// This crate's CRC-32 register update (slice-by-8 tables): see [`CrcRegister`].
pub fn crc32_register(crc: u32, data: &[u8]) -> u32 {
    crc32::update(crc, data)
}

/// Computes the ICRC of `packet` (BTH through ICRC, the ICRC itself not covered) sent between
/// `ip` with UDP ports `src_port` and `dst_port`: what a receiver on a UDP socket needs.
pub fn compute_for_udp_payload(
    ip: IpFields,
    src_port: u16,
    dst_port: u16,
    packet: &[u8],
) -> Result<u32, Error> {
    compute_for_udp_payload_with(crc32_register, ip, src_port, dst_port, packet)
}

/// [`compute_for_udp_payload`] with the CRC register update `crc`.
pub fn compute_for_udp_payload_with(
    crc: CrcRegister,
    ip: IpFields,
    src_port: u16,
    dst_port: u16,
    packet: &[u8],
) -> Result<u32, Error> {
    check_len(LAYOUT, packet, bth::HEADER_LEN + ICRC_LEN)?;
    let udp_len = udp::HEADER_LEN + packet.len();
    let mut headers = [0u8; ipv6::HEADER_LEN + udp::HEADER_LEN];
    let ip_len = match ip {
        IpFields::V4 {
            src,
            dst,
            ident,
            dont_frag,
        } => {
            let total = ipv4::HEADER_LEN + udp_len;
            if total > usize::from(u16::MAX) {
                return Err(Error::LengthMismatch {
                    layout: LAYOUT,
                    field: "IPv4 total length",
                    stated: total,
                    actual: usize::from(u16::MAX),
                });
            }
            let h = &mut headers[..ipv4::HEADER_LEN];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            h[4..6].copy_from_slice(&ident.to_be_bytes());
            h[6] = if dont_frag { 0x40 } else { 0 };
            h[9] = ipv4::PROTOCOL_UDP;
            h[12..16].copy_from_slice(&src.octets());
            h[16..20].copy_from_slice(&dst.octets());
            ipv4::HEADER_LEN
        }
        IpFields::V6 { src, dst } => {
            if udp_len > usize::from(u16::MAX) {
                return Err(Error::LengthMismatch {
                    layout: LAYOUT,
                    field: "IPv6 payload length",
                    stated: udp_len,
                    actual: usize::from(u16::MAX),
                });
            }
            let h = &mut headers[..ipv6::HEADER_LEN];
            h[0] = 0x60;
            h[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            h[6] = ipv4::PROTOCOL_UDP;
            h[8..24].copy_from_slice(&src.octets());
            h[24..40].copy_from_slice(&dst.octets());
            ipv6::HEADER_LEN
        }
    };
    let u = &mut headers[ip_len..ip_len + udp::HEADER_LEN];
    u[0..2].copy_from_slice(&src_port.to_be_bytes());
    u[2..4].copy_from_slice(&dst_port.to_be_bytes());
    u[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    Ok(icrc_over(
        crc,
        &headers[..ip_len + udp::HEADER_LEN],
        ip_len,
        packet,
    ))
}

/// Checks the ICRC `packet` carries against the one computed for it (see
/// [`compute_for_udp_payload`]).
pub fn verify_udp_payload(
    ip: IpFields,
    src_port: u16,
    dst_port: u16,
    packet: &[u8],
) -> Result<(), Error> {
    verify_udp_payload_with(crc32_register, ip, src_port, dst_port, packet)
}

/// [`verify_udp_payload`] with the CRC register update `crc`.
pub fn verify_udp_payload_with(
    crc: CrcRegister,
    ip: IpFields,
    src_port: u16,
    dst_port: u16,
    packet: &[u8],
) -> Result<(), Error> {
    let computed = compute_for_udp_payload_with(crc, ip, src_port, dst_port, packet)?;
    check(computed, packet)
}

/// Computes the ICRC of a whole RoCEv2 datagram: IP header, UDP header, BTH through ICRC.
/// Bytes after the length the IP header states (Ethernet padding) are ignored.
pub fn compute(datagram: &[u8]) -> Result<u32, Error> {
    let (ip_len, end) = split_datagram(datagram)?;
    let udp_end = ip_len + udp::HEADER_LEN;
    Ok(icrc_over(
        crc32_register,
        &datagram[..udp_end],
        ip_len,
        &datagram[udp_end..end],
    ))
}

/// Computes the ICRC of a whole datagram and writes it into its last four bytes (within the
/// IP length). Returns the ICRC.
pub fn fill(datagram: &mut [u8]) -> Result<u32, Error> {
    let (_, end) = split_datagram(datagram)?;
    let icrc = compute(datagram)?;
    datagram[end - ICRC_LEN..end].copy_from_slice(&icrc.to_le_bytes());
    Ok(icrc)
}

/// Checks the ICRC a whole datagram carries.
pub fn verify(datagram: &[u8]) -> Result<(), Error> {
    let (_, end) = split_datagram(datagram)?;
    check(compute(datagram)?, &datagram[..end])
}

fn check(computed: u32, packet: &[u8]) -> Result<(), Error> {
    let at = packet.len() - ICRC_LEN;
    let carried = u32::from_le_bytes([packet[at], packet[at + 1], packet[at + 2], packet[at + 3]]);
    if carried == computed {
        Ok(())
    } else {
        Err(Error::IcrcMismatch { carried, computed })
    }
}

/// Finds the IP header length and the end of the datagram, checking there is room for UDP,
/// BTH and ICRC and that the IP header is one RoCEv2 allows.
fn split_datagram(datagram: &[u8]) -> Result<(usize, usize), Error> {
    check_len(LAYOUT, datagram, 1)?;
    let (ip_len, end, protocol) = match datagram[0] >> 4 {
        4 => {
            let ip = Ipv4Packet::new_checked(datagram)?;
            if ip.header_len() != ipv4::HEADER_LEN {
                return Err(Error::BadField {
                    layout: LAYOUT,
                    field: "IPv4 IHL",
                    value: ip.header_len() as u64 / 4,
                    expected: "5 (the ICRC does not cover IPv4 options)",
                });
            }
            (
                ipv4::HEADER_LEN,
                usize::from(ip.total_length()),
                ip.protocol(),
            )
        }
        6 => {
            let ip = Ipv6Packet::new_checked(datagram)?;
            (
                ipv6::HEADER_LEN,
                ipv6::HEADER_LEN + usize::from(ip.payload_len()),
                ip.next_header(),
            )
        }
        version => {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "IP version",
                value: u64::from(version),
                expected: "4 or 6",
            })
        }
    };
    if protocol != ipv4::PROTOCOL_UDP {
        return Err(Error::BadField {
            layout: LAYOUT,
            field: "IP protocol",
            value: u64::from(protocol),
            expected: "17 (UDP, no IPv6 extension headers)",
        });
    }
    let needed = ip_len + udp::HEADER_LEN + bth::HEADER_LEN + ICRC_LEN;
    if end < needed {
        return Err(Error::Truncated {
            layout: LAYOUT,
            needed,
            available: end,
        });
    }
    Ok((ip_len, end))
}

/// The ICRC over `ip_udp` (IP header of `ip_len` bytes, then the UDP header) and `packet`
/// (BTH through ICRC). The caller has checked the lengths.
fn icrc_over(crc: CrcRegister, ip_udp: &[u8], ip_len: usize, packet: &[u8]) -> u32 {
    let masked_len = ip_udp.len() + bth::HEADER_LEN;
    let mut masked = [0u8; MASKED_LEN_MAX];
    masked[..ip_udp.len()].copy_from_slice(ip_udp);
    masked[ip_udp.len()..masked_len].copy_from_slice(&packet[..bth::HEADER_LEN]);
    if ip_len == ipv4::HEADER_LEN {
        masked[1] = 0xff; // TOS
        masked[8] = 0xff; // TTL
        masked[10] = 0xff; // header checksum
        masked[11] = 0xff;
    } else {
        masked[0] |= 0x0f; // low nibble of the traffic class
        masked[1] = 0xff; // rest of the traffic class and the flow label
        masked[2] = 0xff;
        masked[3] = 0xff;
        masked[7] = 0xff; // hop limit
    }
    masked[ip_len + 6] = 0xff; // UDP checksum
    masked[ip_len + 7] = 0xff;
    masked[ip_udp.len() + 4] = 0xff; // BTH FECN, BECN, reserved
    let register = crc(LRH_SEED, &masked[..masked_len]);
    let register = crc(register, &packet[bth::HEADER_LEN..packet.len() - ICRC_LEN]);
    !register
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_is_eight_ff_bytes_through_the_crc_register() {
        assert_eq!(crc32::update(!0, &[0xff; 8]), LRH_SEED);
    }

    #[test]
    fn rxe_fields_are_df_and_ident_zero() {
        let ip = IpFields::rxe(
            Ipv4Addr::new(198, 18, 0, 1).into(),
            Ipv4Addr::new(198, 18, 0, 2).into(),
        )
        .unwrap();
        assert!(matches!(
            ip,
            IpFields::V4 {
                ident: 0,
                dont_frag: true,
                ..
            }
        ));
        assert!(IpFields::rxe(Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()).is_err());
    }

    #[test]
    fn datagrams_without_room_for_bth_and_icrc_are_refused() {
        let mut datagram = [0u8; 20 + 8 + 12];
        datagram[0] = 0x45;
        datagram[3] = 40;
        datagram[9] = 17;
        assert!(matches!(compute(&datagram), Err(Error::Truncated { .. })));
    }

    #[test]
    fn non_udp_datagrams_are_refused() {
        let mut datagram = [0u8; 60];
        datagram[0] = 0x45;
        datagram[3] = 60;
        datagram[9] = 6;
        assert!(matches!(
            compute(&datagram),
            Err(Error::BadField {
                field: "IP protocol",
                ..
            })
        ));
    }
}
