//! Doorbell records: the small host-memory records through which the driver tells the device
//! how far it has written (a QP's receive and send counters) and consumed (a CQ's consumer
//! index). All fields are big-endian 32-bit words.

use crate::bytes::{be_u32, put_be_u32};

/// Byte ranges of a QP doorbell record (`__be32 db[2]`, indexed by `MLX5_RCV_DBR` and
/// `MLX5_SND_DBR`).
pub(crate) mod field {
    use core::ops::Range;
    /// `db[MLX5_RCV_DBR]`: the receive counter mod 2^16.
    pub const RCV_DBR: Range<usize> = 0..4;
    /// `db[MLX5_SND_DBR]`: the send producer counter (in basic blocks) mod 2^16.
    pub const SND_DBR: Range<usize> = 4..8;
}

/// Byte ranges of a CQ doorbell record (`__be32 dbrec[2]`).
pub(crate) mod cq_field {
    use core::ops::Range;
    /// `dbrec[MLX5_CQ_SET_CI]`: the consumer index mod 2^24.
    pub const SET_CI: Range<usize> = 0..4;
    /// `dbrec[MLX5_CQ_ARM_DB]`: arm `sequence[29:28] command[24] consumer_index[23:0]`.
    pub const ARM_DB: Range<usize> = 4..8;
}

/// `MLX5_RCV_DBR`: word index of the receive counter.
pub const RCV_DBR: usize = 0;
/// `MLX5_SND_DBR`: word index of the send counter.
pub const SND_DBR: usize = 1;
/// Size of a QP doorbell record in bytes.
pub const SIZE: usize = 8;
/// Size of a CQ doorbell record in bytes.
pub const CQ_SIZE: usize = 8;
/// `MLX5_CQ_DOORBELL`: offset of the CQ arm doorbell register in the UAR page.
pub const CQ_DOORBELL_UAR_OFFSET: usize = 0x20;
/// `MLX5_CQ_DB_REQ_NOT_SOL`: arm for solicited completions only.
pub const CQ_DB_REQ_NOT_SOL: u32 = 1 << 24;
/// `MLX5_CQ_DB_REQ_NOT`: arm for the next completion.
pub const CQ_DB_REQ_NOT: u32 = 0;

const COUNTER_MASK: u32 = 0xffff;
const CI_MASK: u32 = 0x00ff_ffff;

fixed_view!(
    /// A view of a QP doorbell record.
    DoorbellRecord,
    SIZE,
    "mlx5 doorbell record"
);

impl<T: AsRef<[u8]>> DoorbellRecord<T> {
    /// The receive counter: receive WQEs posted, mod 2^16.
    pub fn recv_counter(&self) -> u16 {
        (be_u32(&self.buffer.as_ref()[field::RCV_DBR]) & COUNTER_MASK) as u16
    }

    /// The send counter: basic blocks produced, mod 2^16.
    pub fn send_counter(&self) -> u16 {
        (be_u32(&self.buffer.as_ref()[field::SND_DBR]) & COUNTER_MASK) as u16
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DoorbellRecord<T> {
    /// Publishes the receive counter (written as libmlx5 does: `htobe32(head & 0xffff)`).
    pub fn set_recv_counter(&mut self, counter: u16) {
        put_be_u32(
            &mut self.buffer.as_mut()[field::RCV_DBR],
            u32::from(counter),
        );
    }

    /// Publishes the send counter (`htobe32(cur_post & 0xffff)`).
    pub fn set_send_counter(&mut self, counter: u16) {
        put_be_u32(
            &mut self.buffer.as_mut()[field::SND_DBR],
            u32::from(counter),
        );
    }
}

fixed_view!(
    /// A view of a CQ doorbell record.
    CqDoorbellRecord,
    CQ_SIZE,
    "mlx5 CQ doorbell record"
);

impl<T: AsRef<[u8]>> CqDoorbellRecord<T> {
    /// The consumer index, mod 2^24: CQEs software has consumed.
    pub fn consumer_index(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[cq_field::SET_CI]) & CI_MASK
    }

    /// The raw arm word.
    pub fn arm_word(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[cq_field::ARM_DB])
    }

    /// The arm sequence number (2 bits).
    pub fn arm_sequence(&self) -> u8 {
        ((self.arm_word() >> 28) & 0x3) as u8
    }

    /// Whether the CQ is armed for solicited completions only.
    pub fn arm_solicited_only(&self) -> bool {
        self.arm_word() & CQ_DB_REQ_NOT_SOL != 0
    }

    /// The consumer index the arm request was made at.
    pub fn arm_consumer_index(&self) -> u32 {
        self.arm_word() & CI_MASK
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CqDoorbellRecord<T> {
    /// Publishes the consumer index (`htobe32(cons_index & 0xffffff)`).
    pub fn set_consumer_index(&mut self, ci: u32) {
        put_be_u32(&mut self.buffer.as_mut()[cq_field::SET_CI], ci & CI_MASK);
    }

    /// Writes the arm word as libmlx5's `mlx5_arm_cq` does:
    /// `sequence << 28 | command | (ci & 0xffffff)`.
    pub fn set_arm(&mut self, sequence: u8, solicited_only: bool, ci: u32) {
        let command = if solicited_only {
            CQ_DB_REQ_NOT_SOL
        } else {
            CQ_DB_REQ_NOT
        };
        put_be_u32(
            &mut self.buffer.as_mut()[cq_field::ARM_DB],
            (u32::from(sequence & 0x3) << 28) | command | (ci & CI_MASK),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receive_counter_is_first_and_send_counter_second_both_big_endian() {
        let mut buf = [0xffu8; 8];
        let mut rec = DoorbellRecord::new_checked(&mut buf[..]).unwrap();
        rec.set_recv_counter(0x0102);
        rec.set_send_counter(0xa0b0);
        assert_eq!(buf, [0, 0, 0x01, 0x02, 0, 0, 0xa0, 0xb0]);
        let rec = DoorbellRecord::new_unchecked(&buf[..]);
        assert_eq!(rec.recv_counter(), 0x0102);
        assert_eq!(rec.send_counter(), 0xa0b0);
        assert_eq!(field::RCV_DBR.start, RCV_DBR * 4);
        assert_eq!(field::SND_DBR.start, SND_DBR * 4);
    }

    #[test]
    fn consumer_index_keeps_twenty_four_bits() {
        let mut buf = [0u8; 8];
        let mut rec = CqDoorbellRecord::new_checked(&mut buf[..]).unwrap();
        rec.set_consumer_index(0x0123_4567);
        assert_eq!(&buf[..4], &[0x00, 0x23, 0x45, 0x67]);
        assert_eq!(
            CqDoorbellRecord::new_unchecked(&buf[..]).consumer_index(),
            0x23_4567
        );
    }

    #[test]
    fn arm_word_packs_sequence_command_and_index() {
        let mut buf = [0u8; 8];
        let mut rec = CqDoorbellRecord::new_unchecked(&mut buf[..]);
        rec.set_arm(2, true, 0x12_3456);
        assert_eq!(&buf[4..], &[0x21, 0x12, 0x34, 0x56]);
        let rec = CqDoorbellRecord::new_unchecked(&buf[..]);
        assert_eq!(rec.arm_sequence(), 2);
        assert!(rec.arm_solicited_only());
        assert_eq!(rec.arm_consumer_index(), 0x12_3456);
    }

    #[test]
    fn short_buffers_are_rejected() {
        assert!(DoorbellRecord::new_checked(&[0u8; 7][..]).is_err());
        assert!(CqDoorbellRecord::new_checked(&[0u8; 4][..]).is_err());
    }
}
