//! The inline data segment (`struct mlx5_wqe_inl_data_seg`): a 4-byte header whose byte count
//! carries the `MLX5_INLINE_SEG` flag, followed by the payload itself. The payload continues at
//! the start of the send ring when it reaches the ring's end, as libmlx5 writes it.

use crate::bytes::{be_u32, put_be_u32};
use crate::error::Error;

use super::wqe::SEND_WQE_DS;

/// Byte ranges of the inline segment header, named as `mlx5dv.h` names them.
pub(crate) mod field {
    use core::ops::Range;
    /// Payload length with [`super::INLINE_SEG`] set.
    pub const BYTE_COUNT: Range<usize> = 0..4;
}

/// Size of the inline segment header in bytes.
pub const HEADER_SIZE: usize = 4;

/// `MLX5_INLINE_SEG`: the flag in the byte count that marks an inline segment.
pub const INLINE_SEG: u32 = 0x8000_0000;

fixed_view!(
    /// A view of an inline segment header over a byte buffer.
    InlineSeg,
    HEADER_SIZE,
    "mlx5 inline segment"
);

impl<T: AsRef<[u8]>> InlineSeg<T> {
    /// The raw byte count, flag included.
    pub fn raw_byte_count(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::BYTE_COUNT])
    }

    /// Whether the inline flag is set (otherwise these bytes start a data segment).
    pub fn is_inline(&self) -> bool {
        self.raw_byte_count() & INLINE_SEG != 0
    }

    /// The payload length, flag removed.
    pub fn payload_len(&self) -> u32 {
        self.raw_byte_count() & !INLINE_SEG
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> InlineSeg<T> {
    /// Sets the payload length and the inline flag.
    pub fn set_payload_len(&mut self, len: u32) {
        put_be_u32(
            &mut self.buffer.as_mut()[field::BYTE_COUNT],
            (len & !INLINE_SEG) | INLINE_SEG,
        );
    }
}

/// Inline payload as it lies in a ring: `head` up to the ring's end, then `tail` from its
/// start (empty unless the payload wraps).
#[derive(Debug, Clone, Copy, Default)]
pub struct InlineData<'a> {
    /// The part before the ring's end.
    pub head: &'a [u8],
    /// The part that continues at the ring's start.
    pub tail: &'a [u8],
}

impl<'a> InlineData<'a> {
    /// Payload held in one piece.
    pub fn new(payload: &'a [u8]) -> Self {
        InlineData {
            head: payload,
            tail: &[],
        }
    }

    /// The payload length.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the payload into the front of `out`; returns the bytes copied (all, or as many
    /// as fit).
    pub fn copy_to(&self, out: &mut [u8]) -> usize {
        let head = self.head.len().min(out.len());
        out[..head].copy_from_slice(&self.head[..head]);
        let tail = self.tail.len().min(out.len() - head);
        out[head..head + tail].copy_from_slice(&self.tail[..tail]);
        head + tail
    }

    /// The payload bytes in order.
    pub fn bytes(&self) -> impl Iterator<Item = u8> + 'a {
        self.head.iter().chain(self.tail.iter()).copied()
    }
}

impl PartialEq for InlineData<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.bytes().eq(other.bytes())
    }
}

impl Eq for InlineData<'_> {}

fn check_ring_offset(ring: &[u8], offset: usize) -> Result<(), Error> {
    if ring.is_empty() || ring.len() % SEND_WQE_DS != 0 {
        return Err(Error::BadField {
            layout: "mlx5 send ring",
            field: "length",
            value: ring.len() as u64,
            expected: "a non-zero multiple of 16",
        });
    }
    if offset % SEND_WQE_DS != 0 || offset >= ring.len() {
        return Err(Error::BadField {
            layout: "mlx5 inline segment",
            field: "offset",
            value: offset as u64,
            expected: "a 16-byte aligned offset inside the ring",
        });
    }
    Ok(())
}

/// Writes an inline segment at byte `offset` of the send ring `ring`: the header, then
/// `payload`, continuing at the ring's start when it reaches the end. Returns the 16-byte
/// units the segment takes. An empty payload writes nothing and takes none, as in libmlx5.
pub fn write_wrapped(ring: &mut [u8], offset: usize, payload: &[u8]) -> Result<usize, Error> {
    write_data_wrapped(ring, offset, InlineData::new(payload))
}

/// [`write_wrapped`] for a payload held in two pieces (as [`read_wrapped`] returns it).
pub fn write_data_wrapped(
    ring: &mut [u8],
    offset: usize,
    payload: InlineData<'_>,
) -> Result<usize, Error> {
    check_ring_offset(ring, offset)?;
    let len = payload.len();
    if len == 0 {
        return Ok(0);
    }
    if HEADER_SIZE + len > ring.len() || len as u64 >= u64::from(INLINE_SEG) {
        return Err(Error::LengthMismatch {
            layout: "mlx5 inline segment",
            field: "byte_count",
            stated: len,
            actual: ring.len() - HEADER_SIZE,
        });
    }
    InlineSeg::new_unchecked(&mut ring[offset..]).set_payload_len(len as u32);
    let mut at = offset + HEADER_SIZE;
    for piece in [payload.head, payload.tail] {
        let mut rest = piece;
        while !rest.is_empty() {
            if at == ring.len() {
                at = 0;
            }
            let n = rest.len().min(ring.len() - at);
            ring[at..at + n].copy_from_slice(&rest[..n]);
            at += n;
            rest = &rest[n..];
        }
    }
    Ok(super::wqe::inline_ds(len))
}

/// Reads the inline segment at byte `offset` of the send ring `ring`, following the payload
/// across the ring's end.
pub fn read_wrapped(ring: &[u8], offset: usize) -> Result<InlineData<'_>, Error> {
    check_ring_offset(ring, offset)?;
    let seg = InlineSeg::new_unchecked(&ring[offset..]);
    if !seg.is_inline() {
        return Err(Error::BadField {
            layout: "mlx5 inline segment",
            field: "byte_count",
            value: u64::from(seg.raw_byte_count()),
            expected: "the MLX5_INLINE_SEG flag set",
        });
    }
    let len = seg.payload_len() as usize;
    if HEADER_SIZE + len > ring.len() {
        return Err(Error::LengthMismatch {
            layout: "mlx5 inline segment",
            field: "byte_count",
            stated: len,
            actual: ring.len() - HEADER_SIZE,
        });
    }
    let start = offset + HEADER_SIZE;
    let head = len.min(ring.len() - start);
    Ok(InlineData {
        head: &ring[start..start + head],
        tail: &ring[..len - head],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_carries_the_length_with_the_inline_flag() {
        let mut buf = [0u8; 4];
        InlineSeg::new_unchecked(&mut buf[..]).set_payload_len(0x2c);
        assert_eq!(buf, [0x80, 0x00, 0x00, 0x2c]);
        let seg = InlineSeg::new_checked(&buf[..]).unwrap();
        assert!(seg.is_inline());
        assert_eq!(seg.payload_len(), 0x2c);
    }

    #[test]
    fn payload_that_fits_is_written_after_the_header() {
        let mut ring = [0u8; 128];
        let ds = write_wrapped(&mut ring, 16, b"hello").unwrap();
        assert_eq!(ds, 1);
        assert_eq!(
            &ring[16..25],
            &[0x80, 0, 0, 5, b'h', b'e', b'l', b'l', b'o']
        );
        let data = read_wrapped(&ring, 16).unwrap();
        assert_eq!(data.head, b"hello");
        assert!(data.tail.is_empty());
    }

    #[test]
    fn payload_wraps_to_the_start_of_the_ring() {
        // Header at the last 16-byte unit of a 2-block ring: 12 payload bytes fit before the
        // end, the other 8 continue at offset 0.
        let mut ring = [0u8; 128];
        let payload: Vec<u8> = (1..=20).collect();
        let ds = write_wrapped(&mut ring, 112, &payload).unwrap();
        assert_eq!(ds, 2);
        assert_eq!(&ring[112..116], &[0x80, 0, 0, 20]);
        assert_eq!(&ring[116..128], &payload[..12]);
        assert_eq!(&ring[..8], &payload[12..]);
        let data = read_wrapped(&ring, 112).unwrap();
        assert_eq!(data.len(), 20);
        assert_eq!(data.head, &payload[..12]);
        assert_eq!(data.tail, &payload[12..]);
        let mut out = [0u8; 20];
        assert_eq!(data.copy_to(&mut out), 20);
        assert_eq!(&out[..], &payload[..]);
    }

    #[test]
    fn a_data_segment_is_not_read_as_inline() {
        let ring = [0u8; 64];
        assert!(matches!(
            read_wrapped(&ring, 0),
            Err(Error::BadField {
                field: "byte_count",
                ..
            })
        ));
    }

    #[test]
    fn a_length_beyond_the_ring_is_rejected() {
        let mut ring = [0u8; 64];
        ring[..4].copy_from_slice(&[0x80, 0, 0, 61]);
        assert!(matches!(
            read_wrapped(&ring, 0),
            Err(Error::LengthMismatch { .. })
        ));
        assert!(write_wrapped(&mut ring, 0, &[0u8; 61]).is_err());
    }

    #[test]
    fn misaligned_or_outside_offsets_are_rejected() {
        let ring = [0u8; 64];
        assert!(read_wrapped(&ring, 4).is_err());
        assert!(read_wrapped(&ring, 64).is_err());
        assert!(read_wrapped(&[], 0).is_err());
    }
}
