//! Receive WQEs: a slot of the receive ring holding up to `stride / 16` data segments, ended by
//! an invalid-lkey (0x100) segment when fewer are used, as libmlx5 writes them.

use super::data_seg::{self, DataSeg, DataSegRepr};
use crate::error::Error;

/// The byte offset of receive WQE `counter` in a ring of `wqe_count` slots (a power of two) of
/// `stride` bytes each.
pub const fn recv_wqe_offset(counter: u32, wqe_count: usize, stride: usize) -> usize {
    ((counter as usize) & wqe_count.wrapping_sub(1)) * stride
}

/// A view of one receive WQE slot.
#[derive(Debug, Clone)]
pub struct RecvWqe<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RecvWqe<T> {
    /// Wraps a slot after checking it is a non-zero multiple of 16 bytes.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let len = buffer.as_ref().len();
        if len == 0 || len % data_seg::SIZE != 0 {
            return Err(Error::BadField {
                layout: "mlx5 receive WQE",
                field: "stride",
                value: len as u64,
                expected: "a non-zero multiple of 16 bytes",
            });
        }
        Ok(RecvWqe { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// How many data segments the slot holds.
    pub fn capacity(&self) -> usize {
        self.buffer.as_ref().len() / data_seg::SIZE
    }

    fn seg(&self, i: usize) -> DataSeg<&[u8]> {
        let at = i * data_seg::SIZE;
        DataSeg::new_unchecked(&self.buffer.as_ref()[at..at + data_seg::SIZE])
    }

    /// The number of scatter entries before the terminator (or the capacity, if none).
    pub fn sge_count(&self) -> usize {
        (0..self.capacity())
            .find(|&i| self.seg(i).is_terminator())
            .unwrap_or(self.capacity())
    }

    /// The scatter entries, in order, up to the terminator.
    pub fn sges(&self) -> impl Iterator<Item = DataSegRepr> + '_ {
        (0..self.sge_count()).map(|i| {
            let seg = self.seg(i);
            DataSegRepr {
                byte_count: seg.byte_count(),
                lkey: seg.lkey(),
                addr: seg.addr(),
            }
        })
    }

    /// The bytes the scatter list can take.
    pub fn capacity_bytes(&self) -> u64 {
        self.sges().map(|s| u64::from(s.byte_count)).sum()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RecvWqe<T> {
    /// Writes `sges` into the slot, and the terminator after them if the slot has room.
    pub fn write(&mut self, sges: &[DataSegRepr]) -> Result<(), Error> {
        if sges.len() > self.capacity() {
            return Err(Error::LengthMismatch {
                layout: "mlx5 receive WQE",
                field: "sge count",
                stated: sges.len(),
                actual: self.capacity(),
            });
        }
        let capacity = self.capacity();
        let buf = self.buffer.as_mut();
        let terminator = (sges.len() < capacity).then_some(DataSegRepr::TERMINATOR);
        for (i, sge) in sges.iter().chain(terminator.iter()).enumerate() {
            let at = i * data_seg::SIZE;
            sge.emit(&mut DataSeg::new_unchecked(
                &mut buf[at..at + data_seg::SIZE],
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(i: u32) -> DataSegRepr {
        DataSegRepr {
            byte_count: 64 * (i + 1),
            lkey: 0x10 + i,
            addr: 0x1000 * u64::from(i),
        }
    }

    #[test]
    fn a_short_list_is_ended_by_the_invalid_lkey() {
        let mut slot = RecvWqe::new_checked([0xffu8; 64]).unwrap();
        slot.write(&[sge(0), sge(1)]).unwrap();
        let bytes = slot.clone().into_inner();
        assert_eq!(
            &bytes[32..48],
            &[0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(slot.sge_count(), 2);
        assert_eq!(slot.sges().collect::<Vec<_>>(), vec![sge(0), sge(1)]);
        assert_eq!(slot.capacity_bytes(), 64 + 128);
    }

    #[test]
    fn a_full_list_has_no_terminator() {
        let mut slot = RecvWqe::new_checked([0u8; 32]).unwrap();
        slot.write(&[sge(0), sge(1)]).unwrap();
        assert_eq!(slot.sge_count(), 2);
        assert!(slot.write(&[sge(0), sge(1), sge(2)]).is_err());
    }

    #[test]
    fn slot_offsets_wrap_at_the_ring() {
        assert_eq!(recv_wqe_offset(5, 4, 32), 32);
        assert_eq!(recv_wqe_offset(u32::MAX, 8, 64), 7 * 64);
    }

    #[test]
    fn a_slot_must_be_whole_segments() {
        assert!(RecvWqe::new_checked([0u8; 24]).is_err());
        assert!(RecvWqe::new_checked([0u8; 0]).is_err());
    }
}
