//! CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), the CRC the ICRC uses.
//!
//! [`update`] is the bare register update, with no inversion on entry or exit, like Linux's
//! `crc32_le`: rxe seeds it with a precomputed register and inverts only at the end. The table
//! is slice-by-8, built at compile time.

const POLYNOMIAL: u32 = 0xedb8_8320;

const fn make_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                POLYNOMIAL ^ (crc >> 1)
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][i] = crc;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut slice = 1;
        while slice < 8 {
            let previous = tables[slice - 1][i];
            tables[slice][i] = (previous >> 8) ^ tables[0][(previous & 0xff) as usize];
            slice += 1;
        }
        i += 1;
    }
    tables
}

static TABLES: [[u32; 256]; 8] = make_tables();

/// Feeds `data` into the CRC register `crc` and returns the new register.
pub(crate) fn update(mut crc: u32, data: &[u8]) -> u32 {
    let t = &TABLES;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ crc;
        let hi = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][(hi & 0xff) as usize]
            ^ t[2][((hi >> 8) & 0xff) as usize]
            ^ t[1][((hi >> 16) & 0xff) as usize]
            ^ t[0][(hi >> 24) as usize];
    }
    for &byte in chunks.remainder() {
        crc = (crc >> 8) ^ t[0][((crc ^ u32::from(byte)) & 0xff) as usize];
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The standard CRC-32 (zlib, Ethernet): register starts all ones, result inverted.
    fn crc32(data: &[u8]) -> u32 {
        !update(!0, data)
    }

    #[test]
    fn check_value_of_the_standard_crc32() {
        // The catalogue check value of CRC-32/ISO-HDLC over the ASCII digits 1..9.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn slice_by_eight_agrees_with_bytewise_on_every_length() {
        let data: Vec<u8> = (0..67u32).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..data.len() {
            let bytewise = data[..len].iter().fold(!0u32, |crc, &b| {
                (crc >> 8) ^ TABLES[0][((crc ^ u32::from(b)) & 0xff) as usize]
            });
            assert_eq!(update(!0, &data[..len]), bytewise, "length {len}");
        }
    }

    #[test]
    fn updates_chain_like_one_pass() {
        let data = b"the quick brown fox jumps over the lazy dog";
        let split = update(update(!0, &data[..13]), &data[13..]);
        assert_eq!(split, update(!0, data));
    }
}
