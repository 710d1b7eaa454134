//! The datagram segment of a UD send WQE (`struct mlx5_wqe_datagram_seg`, which is one
//! `struct mlx5_wqe_av`): where a UD SEND goes. It follows the control segment, before the
//! data; a UD QP's driver writes one per datagram (`docs/softnic.md`, "UD QPs").
//!
//! The fields are mirrored as `mlx5dv.h` lays them out; what rdma-core's `mlx5_create_ah`
//! puts in the ones railshift does not set (the SL, the static rate, the RoCE source port in
//! `rlid`, the GRH flags) is the provider's to decide when it sends UD on a ConnectX.

use crate::bytes::{be_u32, put_be_u32};
use crate::error::Error;

/// Byte ranges of the address vector, named as `mlx5dv.h` names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const QKEY: Range<usize> = 0..4;
    pub const QKEY_RESERVED: Range<usize> = 4..8;
    pub const DQP_DCT: Range<usize> = 8..12;
    pub const STAT_RATE_SL: usize = 12;
    pub const FL_MLID: usize = 13;
    pub const RLID: Range<usize> = 14..16;
    pub const RESERVED0: Range<usize> = 16..20;
    pub const RMAC: Range<usize> = 20..26;
    pub const TCLASS: usize = 26;
    pub const HOP_LIMIT: usize = 27;
    pub const GRH_GID_FL: Range<usize> = 28..32;
    pub const RGID: Range<usize> = 32..48;
}

/// Size of the datagram segment in bytes (three 16-byte data segments' worth).
pub const SIZE: usize = field::RGID.end;

/// `MLX5_EXTENDED_UD_AV`: set in `dqp_dct` when the address vector is the extended 48-byte
/// one (with the GRH fields), which RoCE always needs.
pub const EXTENDED_UD_AV: u32 = 0x8000_0000;

/// Destination QP numbers are 24 bits.
const QPN_MASK: u32 = 0x00ff_ffff;

fixed_view!(
    /// A view of a datagram segment over a byte buffer.
    DatagramSeg,
    SIZE,
    "mlx5 datagram segment"
);

impl<T: AsRef<[u8]>> DatagramSeg<T> {
    /// The queue key the destination QP must have.
    pub fn qkey(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::QKEY])
    }

    /// The destination QP number (24 bits, without the extended-AV flag).
    pub fn dqp(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::DQP_DCT]) & QPN_MASK
    }

    /// Whether the extended-AV flag is set.
    pub fn is_extended(&self) -> bool {
        be_u32(&self.buffer.as_ref()[field::DQP_DCT]) & EXTENDED_UD_AV != 0
    }

    /// The destination MAC.
    pub fn rmac(&self) -> [u8; 6] {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.buffer.as_ref()[field::RMAC]);
        mac
    }

    /// The IP traffic class.
    pub fn tclass(&self) -> u8 {
        self.buffer.as_ref()[field::TCLASS]
    }

    /// The IP hop limit (TTL).
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// The destination GID.
    pub fn rgid(&self) -> [u8; 16] {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&self.buffer.as_ref()[field::RGID]);
        gid
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DatagramSeg<T> {
    /// Sets the queue key.
    pub fn set_qkey(&mut self, qkey: u32) {
        put_be_u32(&mut self.buffer.as_mut()[field::QKEY], qkey);
    }

    /// Sets the destination QP number (its low 24 bits) with the extended-AV flag.
    pub fn set_dqp_extended(&mut self, qpn: u32) {
        put_be_u32(
            &mut self.buffer.as_mut()[field::DQP_DCT],
            (qpn & QPN_MASK) | EXTENDED_UD_AV,
        );
    }

    /// Sets the destination MAC.
    pub fn set_rmac(&mut self, mac: [u8; 6]) {
        self.buffer.as_mut()[field::RMAC].copy_from_slice(&mac);
    }

    /// Sets the IP traffic class.
    pub fn set_tclass(&mut self, tclass: u8) {
        self.buffer.as_mut()[field::TCLASS] = tclass;
    }

    /// Sets the IP hop limit (TTL).
    pub fn set_hop_limit(&mut self, hop_limit: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = hop_limit;
    }

    /// Sets the destination GID.
    pub fn set_rgid(&mut self, gid: [u8; 16]) {
        self.buffer.as_mut()[field::RGID].copy_from_slice(&gid);
    }

    /// Zeroes the fields railshift does not set (the reserved words, SL and rate, `fl_mlid`,
    /// `rlid`, `grh_gid_fl`).
    pub fn clear_unset(&mut self) {
        let buf = self.buffer.as_mut();
        buf[field::QKEY_RESERVED].fill(0);
        buf[field::STAT_RATE_SL] = 0;
        buf[field::FL_MLID] = 0;
        buf[field::RLID].fill(0);
        buf[field::RESERVED0].fill(0);
        buf[field::GRH_GID_FL].fill(0);
    }
}

/// A parsed datagram segment: the fields a UD SEND needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatagramSegRepr {
    /// The queue key the destination QP must have.
    pub qkey: u32,
    /// The destination QP number (24 bits).
    pub dqp: u32,
    /// The destination MAC.
    pub rmac: [u8; 6],
    /// The IP traffic class.
    pub tclass: u8,
    /// The IP hop limit.
    pub hop_limit: u8,
    /// The destination GID.
    pub rgid: [u8; 16],
}

impl DatagramSegRepr {
    /// Parses a datagram segment. Only the extended (48-byte) address vector is accepted:
    /// RoCE needs its GRH fields, and a short one would leave them unset.
    pub fn parse<T: AsRef<[u8]>>(seg: &DatagramSeg<T>) -> Result<Self, Error> {
        seg.check_len()?;
        if !seg.is_extended() {
            return Err(Error::BadField {
                layout: "mlx5 datagram segment",
                field: "dqp_dct",
                value: u64::from(be_u32(&seg.buffer.as_ref()[field::DQP_DCT])),
                expected: "MLX5_EXTENDED_UD_AV set (RoCE needs the GRH fields)",
            });
        }
        Ok(DatagramSegRepr {
            qkey: seg.qkey(),
            dqp: seg.dqp(),
            rmac: seg.rmac(),
            tclass: seg.tclass(),
            hop_limit: seg.hop_limit(),
            rgid: seg.rgid(),
        })
    }

    /// Writes the whole segment (extended address vector; the fields not set are zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, seg: &mut DatagramSeg<T>) {
        seg.clear_unset();
        seg.set_qkey(self.qkey);
        seg.set_dqp_extended(self.dqp);
        seg.set_rmac(self.rmac);
        seg.set_tclass(self.tclass);
        seg.set_hop_limit(self.hop_limit);
        seg.set_rgid(self.rgid);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const GOLDEN: [u8; 48] = [
        0x11, 0x22, 0x33, 0x44, 0, 0, 0, 0, // qkey, reserved
        0x80, 0x00, 0x01, 0x23, // dqp_dct: extended, QP 0x123
        0, 0, 0, 0, // stat_rate_sl, fl_mlid, rlid
        0, 0, 0, 0, // reserved0
        0x02, 0x00, 0x00, 0x00, 0x00, 0x07, // rmac
        0x00, 0x40, // tclass, hop_limit 64
        0, 0, 0, 0, // grh_gid_fl
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 2, // rgid (IPv4-mapped)
    ];

    /// The segment of the golden bytes (other modules' UD tests use it too).
    pub(crate) fn repr() -> DatagramSegRepr {
        DatagramSegRepr {
            qkey: 0x1122_3344,
            dqp: 0x123,
            rmac: [2, 0, 0, 0, 0, 7],
            tclass: 0,
            hop_limit: 64,
            rgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 2],
        }
    }

    #[test]
    fn golden_bytes_round_trip() {
        let parsed =
            DatagramSegRepr::parse(&DatagramSeg::new_checked(&GOLDEN[..]).unwrap()).unwrap();
        assert_eq!(parsed, repr());
        let mut buf = [0xaau8; 48];
        repr().emit(&mut DatagramSeg::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn a_short_address_vector_or_buffer_is_refused() {
        let mut short_av = GOLDEN;
        short_av[8] = 0;
        assert!(DatagramSegRepr::parse(&DatagramSeg::new_checked(&short_av[..]).unwrap()).is_err());
        assert!(DatagramSeg::new_checked(&GOLDEN[..47]).is_err());
    }
}
