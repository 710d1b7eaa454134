//! The data patterns `--check` writes and verifies: every iteration (or slot) gets its own
//! bytes, so stale, misplaced or torn data shows.

/// Word `k` of the pattern of `seq`.
#[inline]
fn word(seq: u64, k: u64) -> u64 {
    (seq.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ k.wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// Fills `out` with the pattern of `seq`.
pub fn fill(out: &mut [u8], seq: u64) {
    let mut chunks = out.chunks_exact_mut(8);
    let mut k = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&word(seq, k).to_le_bytes());
        k += 1;
    }
    let tail = chunks.into_remainder();
    let w = word(seq, k).to_le_bytes();
    tail.copy_from_slice(&w[..tail.len()]);
}

/// Bytes of `data` that differ from the pattern of `seq`.
pub fn mismatches(data: &[u8], seq: u64) -> u64 {
    let mut bad = 0u64;
    let mut chunks = data.chunks_exact(8);
    let mut k = 0u64;
    for c in &mut chunks {
        let want = word(seq, k).to_le_bytes();
        if c != want {
            bad += c.iter().zip(want).filter(|(a, b)| **a != *b).count() as u64;
        }
        k += 1;
    }
    let tail = chunks.remainder();
    let want = word(seq, k).to_le_bytes();
    bad + tail.iter().zip(want).filter(|(a, b)| **a != *b).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_verifies_and_another_iterations_does_not() {
        let mut b = vec![0u8; 77];
        fill(&mut b, 5);
        assert_eq!(mismatches(&b, 5), 0);
        assert!(mismatches(&b, 6) > 70);
        b[76] ^= 1;
        assert_eq!(mismatches(&b, 5), 1);
    }
}
