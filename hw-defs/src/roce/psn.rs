//! 24-bit packet sequence numbers and their wrap-around arithmetic.
//!
//! PSNs count modulo 2^24. Two PSNs are ordered by the signed 24-bit difference between them,
//! exactly as rxe's `psn_compare` does: `b` is after `a` when `b - a` (mod 2^24), read as a
//! signed 24-bit number, is positive. That ordering only means something within a window of
//! 2^23; it is not transitive across the whole ring, so [`Psn`] has no `Ord`.

use core::cmp::Ordering;
use core::fmt;

/// A 24-bit packet sequence number. The high byte is always zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The number of distinct PSNs, 2^24.
    pub const MODULUS: u32 = 1 << 24;
    /// The mask of the 24 PSN bits.
    pub const MASK: u32 = Self::MODULUS - 1;
    /// Half the ring, 2^23: the widest window in which the ordering is meaningful.
    pub const HALF: u32 = 1 << 23;

    /// The PSN `value` mod 2^24 (the high byte is dropped).
    #[inline]
    pub const fn new(value: u32) -> Self {
        Psn(value & Self::MASK)
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` mod 2^24.
    #[inline]
    #[must_use]
    pub const fn add(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n` mod 2^24.
    #[inline]
    #[must_use]
    pub const fn sub(self, n: u32) -> Self {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The next PSN, `self + 1` mod 2^24.
    #[inline]
    #[must_use]
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// How far forward `later` is from `self`: `later - self` mod 2^24, in `0..2^24`.
    #[inline]
    pub const fn distance_to(self, later: Psn) -> u32 {
        later.0.wrapping_sub(self.0) & Self::MASK
    }

    /// `self - other` as a signed 24-bit number, in `-2^23..2^23` (rxe's `psn_compare`).
    ///
    /// Positive means `self` is after `other`. A difference of exactly 2^23 reads as `-2^23`
    /// from both sides, as in rxe: each PSN is then "before" the other.
    #[inline]
    pub const fn delta(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Orders `self` against `other` within the 2^23 window.
    #[inline]
    pub const fn compare(self, other: Psn) -> Ordering {
        let delta = self.delta(other);
        if delta < 0 {
            Ordering::Less
        } else if delta > 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }

    /// Whether `self` comes before `other` within the window.
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.delta(other) < 0
    }

    /// Whether `self` comes after `other` within the window.
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        self.delta(other) > 0
    }

    /// Whether `self` lies in the half-open range `[start, end)` walked forward from `start`.
    #[inline]
    pub const fn is_in(self, start: Psn, end: Psn) -> bool {
        start.distance_to(self) < start.distance_to(end)
    }
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> u32 {
        psn.0
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAST: Psn = Psn::new(Psn::MASK);

    #[test]
    fn new_drops_the_high_byte() {
        assert_eq!(Psn::new(0x0123_4567).value(), 0x23_4567);
    }

    #[test]
    fn add_wraps_from_the_last_psn_to_zero() {
        assert_eq!(LAST.next(), Psn::new(0));
        assert_eq!(LAST.add(5), Psn::new(4));
        assert_eq!(Psn::new(3).add(Psn::MODULUS), Psn::new(3));
    }

    #[test]
    fn sub_wraps_from_zero_to_the_last_psn() {
        assert_eq!(Psn::new(0).sub(1), LAST);
        assert_eq!(Psn::new(2).sub(4), Psn::new(Psn::MASK - 1));
    }

    #[test]
    fn distance_counts_forward_across_the_wrap() {
        assert_eq!(LAST.distance_to(Psn::new(0)), 1);
        assert_eq!(Psn::new(0xff_fff0).distance_to(Psn::new(0x10)), 0x20);
        assert_eq!(
            Psn::new(0x10).distance_to(Psn::new(0xff_fff0)),
            Psn::MODULUS - 0x20
        );
        assert_eq!(Psn::new(7).distance_to(Psn::new(7)), 0);
    }

    #[test]
    fn zero_is_after_the_last_psn() {
        assert!(Psn::new(0).is_after(LAST));
        assert!(LAST.is_before(Psn::new(0)));
        assert_eq!(Psn::new(0).delta(LAST), 1);
        assert_eq!(LAST.delta(Psn::new(0)), -1);
    }

    #[test]
    fn ordering_holds_up_to_just_under_half_the_ring() {
        let base = Psn::new(0xff_ff00);
        let far = base.add(Psn::HALF - 1);
        assert!(far.is_after(base));
        assert!(base.is_before(far));
        assert_eq!(far.compare(base), Ordering::Greater);
        // One more step and the far PSN is behind the base instead.
        let beyond = base.add(Psn::HALF + 1);
        assert!(beyond.is_before(base));
    }

    #[test]
    fn exactly_half_the_ring_apart_reads_as_before_from_both_sides() {
        let a = Psn::new(0x10);
        let b = a.add(Psn::HALF);
        assert_eq!(a.delta(b), -(Psn::HALF as i32));
        assert_eq!(b.delta(a), -(Psn::HALF as i32));
    }

    #[test]
    fn equal_psns_compare_equal() {
        assert_eq!(LAST.compare(LAST), Ordering::Equal);
        assert!(!LAST.is_before(LAST) && !LAST.is_after(LAST));
    }

    #[test]
    fn range_membership_crosses_the_wrap() {
        let start = Psn::new(0xff_fffe);
        let end = Psn::new(2);
        assert!(Psn::new(0xff_fffe).is_in(start, end));
        assert!(LAST.is_in(start, end));
        assert!(Psn::new(0).is_in(start, end));
        assert!(Psn::new(1).is_in(start, end));
        assert!(!Psn::new(2).is_in(start, end));
        assert!(!Psn::new(0xff_fffd).is_in(start, end));
    }
}
