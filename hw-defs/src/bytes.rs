//! Big-endian field access for the layouts. Each helper takes a slice of exactly the field's
//! width (a `field::` range applied to a checked buffer), so the index operations cannot fail.

#[inline]
pub(crate) fn be_u16(s: &[u8]) -> u16 {
    u16::from_be_bytes([s[0], s[1]])
}

/// A 24-bit big-endian field (QPN, PSN, MSN).
#[inline]
pub(crate) fn be_u24(s: &[u8]) -> u32 {
    u32::from_be_bytes([0, s[0], s[1], s[2]])
}

#[inline]
pub(crate) fn be_u32(s: &[u8]) -> u32 {
    u32::from_be_bytes([s[0], s[1], s[2], s[3]])
}

#[inline]
pub(crate) fn be_u64(s: &[u8]) -> u64 {
    u64::from_be_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
}

#[inline]
pub(crate) fn put_be_u16(s: &mut [u8], value: u16) {
    s[..2].copy_from_slice(&value.to_be_bytes());
}

/// Writes the low 24 bits of `value`; the caller has masked or checked the high byte.
#[inline]
pub(crate) fn put_be_u24(s: &mut [u8], value: u32) {
    s[..3].copy_from_slice(&value.to_be_bytes()[1..]);
}

#[inline]
pub(crate) fn put_be_u32(s: &mut [u8], value: u32) {
    s[..4].copy_from_slice(&value.to_be_bytes());
}

#[inline]
pub(crate) fn put_be_u64(s: &mut [u8], value: u64) {
    s[..8].copy_from_slice(&value.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twenty_four_bit_fields_are_big_endian_and_ignore_the_high_byte() {
        let mut buf = [0xaa; 4];
        put_be_u24(&mut buf[1..], 0xff12_3456);
        assert_eq!(buf, [0xaa, 0x12, 0x34, 0x56]);
        assert_eq!(be_u24(&buf[1..]), 0x12_3456);
    }

    #[test]
    fn wide_fields_round_trip_big_endian() {
        let mut buf = [0u8; 8];
        put_be_u64(&mut buf, 0x0102_0304_0506_0708);
        assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(be_u64(&buf), 0x0102_0304_0506_0708);
        put_be_u32(&mut buf[4..], 0xdead_beef);
        assert_eq!(be_u32(&buf[4..]), 0xdead_beef);
        put_be_u16(&mut buf[2..], 0xcafe);
        assert_eq!(be_u16(&buf[2..]), 0xcafe);
    }
}
