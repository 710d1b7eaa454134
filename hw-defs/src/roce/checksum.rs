//! The Internet checksum (RFC 1071): the ones'-complement sum of 16-bit big-endian words.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The ones'-complement sum of `data` folded to 16 bits (not inverted). An odd trailing byte
/// is padded with zero.
pub(crate) fn sum(data: &[u8]) -> u16 {
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(2);
    for pair in &mut chunks {
        acc += u64::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(u16::from_be_bytes([*last, 0]));
    }
    fold(acc)
}

/// Adds ones'-complement partial sums.
pub(crate) fn combine(parts: &[u16]) -> u16 {
    fold(parts.iter().map(|&p| u64::from(p)).sum())
}

fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The partial sum of the IPv4 pseudo-header for UDP.
pub(crate) fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: u32) -> u16 {
    let mut header = [0u8; 12];
    header[0..4].copy_from_slice(&src.octets());
    header[4..8].copy_from_slice(&dst.octets());
    header[9] = protocol;
    header[10..12].copy_from_slice(&(length as u16).to_be_bytes());
    sum(&header)
}

/// The partial sum of the IPv6 pseudo-header for UDP.
pub(crate) fn pseudo_header_v6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, length: u32) -> u16 {
    let mut header = [0u8; 40];
    header[0..16].copy_from_slice(&src.octets());
    header[16..32].copy_from_slice(&dst.octets());
    header[32..36].copy_from_slice(&length.to_be_bytes());
    header[39] = next_header;
    sum(&header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example_sums_to_ddf2() {
        // RFC 1071 section 3 works this example by hand.
        assert_eq!(
            sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0xddf2
        );
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    #[test]
    fn combining_partial_sums_equals_one_sum() {
        let data = [0xffu8, 0xff, 0x00, 0x01, 0x80, 0x00, 0x80, 0x00];
        assert_eq!(combine(&[sum(&data[..4]), sum(&data[4..])]), sum(&data));
    }
}
