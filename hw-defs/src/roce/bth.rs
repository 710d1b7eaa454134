//! The Base Transport Header: 12 bytes at the start of every InfiniBand transport packet.

use super::opcode::Opcode;
use super::psn::Psn;
use crate::bytes::{be_u16, be_u24, put_be_u16, put_be_u24};
use crate::error::Error;

/// Byte ranges of the BTH (IBA 9.2), named as the spec names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    /// `SE[7] M[6] PadCnt[5:4] TVer[3:0]`.
    pub const SE_M_PAD_TVER: usize = 1;
    pub const P_KEY: Range<usize> = 2..4;
    /// `FECN[7] BECN[6] Resv6a[5:0]`; rxe calls the whole byte `resv8a`, and the ICRC masks it.
    pub const FECN_BECN_RESV6A: usize = 4;
    pub const DEST_QP: Range<usize> = 5..8;
    /// `AckReq[7] Resv7[6:0]`.
    pub const ACKREQ_RESV7: usize = 8;
    pub const PSN: Range<usize> = 9..12;
}

/// Length of the BTH.
pub const HEADER_LEN: usize = field::PSN.end;
/// The default partition key, full membership.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// The transport header version this crate speaks.
pub const TVER: u8 = 0;

const LAYOUT: &str = "BTH";
const SE: u8 = 0x80;
const MIG: u8 = 0x40;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

fixed_view!(
    /// A view of a BTH over a byte buffer.
    Bth,
    HEADER_LEN,
    LAYOUT
);

impl<T: AsRef<[u8]>> Bth<T> {
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.buffer.as_ref()[field::OPCODE])
    }

    fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::SE_M_PAD_TVER]
    }

    /// The solicited-event bit.
    pub fn solicited(&self) -> bool {
        self.flags() & SE != 0
    }

    /// The migration-request bit.
    pub fn mig_req(&self) -> bool {
        self.flags() & MIG != 0
    }

    /// The pad count: bytes (0..=3) after the payload that round it up to 4 bytes.
    pub fn pad_count(&self) -> u8 {
        (self.flags() >> 4) & 0x3
    }

    /// The transport header version.
    pub fn tver(&self) -> u8 {
        self.flags() & 0x0f
    }

    /// The partition key.
    pub fn pkey(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::P_KEY])
    }

    /// The forward explicit congestion notification bit.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN_RESV6A] & FECN != 0
    }

    /// The backward explicit congestion notification bit.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN_RESV6A] & BECN != 0
    }

    /// The destination QP (24 bits).
    pub fn dest_qp(&self) -> u32 {
        be_u24(&self.buffer.as_ref()[field::DEST_QP])
    }

    /// The acknowledge-request bit.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACKREQ_RESV7] & ACK_REQ != 0
    }

    /// The packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(be_u24(&self.buffer.as_ref()[field::PSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    /// Sets the opcode.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = opcode.into();
    }

    /// Sets SE, M, the pad count (2 bits) and TVer (4 bits).
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8, tver: u8) {
        self.buffer.as_mut()[field::SE_M_PAD_TVER] = (u8::from(solicited) << 7)
            | (u8::from(mig_req) << 6)
            | ((pad_count & 0x3) << 4)
            | (tver & 0x0f);
    }

    /// Sets the pad count, leaving the other flag bits.
    pub fn set_pad_count(&mut self, pad_count: u8) {
        let b = &mut self.buffer.as_mut()[field::SE_M_PAD_TVER];
        *b = (*b & !0x30) | ((pad_count & 0x3) << 4);
    }

    /// Sets the partition key.
    pub fn set_pkey(&mut self, pkey: u16) {
        put_be_u16(&mut self.buffer.as_mut()[field::P_KEY], pkey);
    }

    /// Sets FECN and BECN; the reserved bits become zero.
    pub fn set_congestion(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::FECN_BECN_RESV6A] =
            (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }

    /// Sets the destination QP (the high byte of `qpn` is dropped).
    pub fn set_dest_qp(&mut self, qpn: u32) {
        put_be_u24(&mut self.buffer.as_mut()[field::DEST_QP], qpn);
    }

    /// Sets the acknowledge-request bit; the reserved bits become zero.
    pub fn set_ack_req(&mut self, ack_req: bool) {
        self.buffer.as_mut()[field::ACKREQ_RESV7] = u8::from(ack_req) << 7;
    }

    /// Sets the packet sequence number.
    pub fn set_psn(&mut self, psn: Psn) {
        put_be_u24(&mut self.buffer.as_mut()[field::PSN], psn.value());
    }
}

/// A parsed BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// The opcode.
    pub opcode: Opcode,
    /// The solicited-event bit.
    pub solicited: bool,
    /// The migration-request bit.
    pub mig_req: bool,
    /// The pad count. Emitting a whole packet computes it from the payload instead.
    pub pad_count: u8,
    /// The partition key.
    pub pkey: u16,
    /// The FECN bit.
    pub fecn: bool,
    /// The BECN bit.
    pub becn: bool,
    /// The destination QP (24 bits).
    pub dest_qp: u32,
    /// The acknowledge-request bit.
    pub ack_req: bool,
    /// The packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Parses a BTH; a transport version other than 0 is refused, as rxe refuses it.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<Self, Error> {
        bth.check_len()?;
        if bth.tver() != TVER {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "TVer",
                value: u64::from(bth.tver()),
                expected: "0",
            });
        }
        Ok(BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Writes the whole BTH; reserved bits are zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        bth.set_opcode(self.opcode);
        bth.set_flags(self.solicited, self.mig_req, self.pad_count, TVER);
        bth.set_pkey(self.pkey);
        bth.set_congestion(self.fecn, self.becn);
        bth.set_dest_qp(self.dest_qp);
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RDMA WRITE Only, solicited, pad 2, default P_Key, BECN, QP 0x000123, AckReq, PSN
    /// 0xfffffe: written out by hand from IBA figure 9-2.
    const GOLDEN: [u8; 12] = [
        0x0a, // opcode
        0xa0, // SE=1 M=0 PadCnt=2 TVer=0
        0xff, 0xff, // P_Key
        0x40, // FECN=0 BECN=1
        0x00, 0x01, 0x23, // DestQP
        0x80, // AckReq
        0xff, 0xff, 0xfe, // PSN
    ];

    fn golden_repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::RdmaWriteOnly,
            solicited: true,
            mig_req: false,
            pad_count: 2,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: true,
            dest_qp: 0x123,
            ack_req: true,
            psn: Psn::new(0xff_fffe),
        }
    }

    #[test]
    fn golden_bytes_parse_to_the_fields_written() {
        let bth = Bth::new_checked(&GOLDEN[..]).unwrap();
        assert_eq!(BthRepr::parse(&bth).unwrap(), golden_repr());
    }

    #[test]
    fn repr_emits_the_golden_bytes() {
        let mut buf = [0x5au8; 12];
        golden_repr().emit(&mut Bth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn another_transport_version_is_refused() {
        let mut buf = GOLDEN;
        buf[1] |= 0x01;
        assert!(matches!(
            BthRepr::parse(&Bth::new_unchecked(&buf[..])),
            Err(Error::BadField { field: "TVer", .. })
        ));
    }

    #[test]
    fn set_pad_count_keeps_the_other_flags() {
        let mut buf = GOLDEN;
        let mut bth = Bth::new_unchecked(&mut buf[..]);
        bth.set_pad_count(3);
        assert_eq!(bth.pad_count(), 3);
        assert!(bth.solicited());
        assert_eq!(bth.tver(), 0);
    }

    #[test]
    fn short_buffer_is_rejected() {
        assert!(Bth::new_checked(&GOLDEN[..11]).is_err());
    }
}
