//! A whole InfiniBand transport packet as it rides in a RoCEv2 UDP datagram: BTH, the extension
//! headers its opcode calls for, payload, pad, and the 4-byte ICRC.
//!
//! The ICRC covers the IP and UDP headers too, so this layer neither checks nor computes it:
//! [`PacketRepr::emit`] leaves it zero and [`super::icrc`] fills or verifies it over the whole
//! datagram.

use super::aeth::{self, Aeth, AethRepr};
use super::atomic_ack_eth::{self, AtomicAckEth, AtomicAckEthRepr};
use super::atomic_eth::{self, AtomicEth, AtomicEthRepr};
use super::bth::{self, Bth, BthRepr};
use super::deth::{self, Deth, DethRepr};
use super::icrc::ICRC_LEN;
use super::immdt::{self, ImmDt, ImmDtRepr};
use super::opcode::Opcode;
use super::reth::{self, Reth, RethRepr};
use crate::error::{check_len, Error};

const LAYOUT: &str = "RoCEv2 packet";

// The lengths come from the header modules, which import `opcode`: computing it there would
// make `opcode` import them back, a circle (`pmd/tests/imports_run_one_way.rs`).
impl Opcode {
    /// Bytes of BTH and extension headers (0 for an unknown opcode).
    pub fn header_len(self) -> usize {
        let Some(i) = self.info() else {
            return 0;
        };
        bth::HEADER_LEN
            + usize::from(i.deth) * deth::HEADER_LEN
            + usize::from(i.reth) * reth::HEADER_LEN
            + usize::from(i.atomic_eth) * atomic_eth::HEADER_LEN
            + usize::from(i.aeth) * aeth::HEADER_LEN
            + usize::from(i.atomic_ack_eth) * atomic_ack_eth::HEADER_LEN
            + usize::from(i.immdt) * immdt::HEADER_LEN
    }
}

/// Where each header of an opcode starts, in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderOffsets {
    /// DETH offset, if the opcode has one (a UD opcode: right after the BTH).
    pub deth: Option<usize>,
    /// RETH offset, if the opcode has one.
    pub reth: Option<usize>,
    /// AtomicETH offset, if the opcode has one.
    pub atomic_eth: Option<usize>,
    /// AETH offset, if the opcode has one.
    pub aeth: Option<usize>,
    /// AtomicAckETH offset, if the opcode has one.
    pub atomic_ack_eth: Option<usize>,
    /// ImmDt offset, if the opcode has one.
    pub immdt: Option<usize>,
    /// Where the payload starts (the end of the headers).
    pub payload: usize,
}

impl HeaderOffsets {
    /// The offsets for `opcode`; `None` for an unknown opcode.
    pub fn for_opcode(opcode: Opcode) -> Option<Self> {
        let info = opcode.info()?;
        let mut at = bth::HEADER_LEN;
        let mut place = |present: bool, len: usize| {
            present.then(|| {
                let here = at;
                at += len;
                here
            })
        };
        let deth = place(info.deth, deth::HEADER_LEN);
        let reth = place(info.reth, reth::HEADER_LEN);
        let atomic_eth = place(info.atomic_eth, atomic_eth::HEADER_LEN);
        let aeth = place(info.aeth, aeth::HEADER_LEN);
        let atomic_ack_eth = place(info.atomic_ack_eth, atomic_ack_eth::HEADER_LEN);
        let immdt = place(info.immdt, immdt::HEADER_LEN);
        Some(HeaderOffsets {
            deth,
            reth,
            atomic_eth,
            aeth,
            atomic_ack_eth,
            immdt,
            payload: at,
        })
    }
}

/// The pad that rounds a payload of `len` bytes up to a multiple of 4.
pub const fn pad_for(len: usize) -> u8 {
    ((4 - (len % 4)) % 4) as u8
}

/// A view of a transport packet (BTH through ICRC) over a byte buffer.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking it; accessors panic if it is not a whole packet of a
    /// known opcode.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking it is a whole packet of a known opcode.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks the opcode is known, the buffer holds its headers and the ICRC, and the pad
    /// count fits in what lies between them.
    pub fn check_len(&self) -> Result<(), Error> {
        let b = self.buffer.as_ref();
        check_len(LAYOUT, b, bth::HEADER_LEN + ICRC_LEN)?;
        let bth = Bth::new_unchecked(b);
        let opcode = bth.opcode();
        let offsets =
            HeaderOffsets::for_opcode(opcode).ok_or(Error::UnknownOpcode(opcode.into()))?;
        check_len(LAYOUT, b, offsets.payload + ICRC_LEN)?;
        let padded = b.len() - offsets.payload - ICRC_LEN;
        let pad = usize::from(bth.pad_count());
        if pad > padded {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "PadCnt",
                stated: pad,
                actual: padded,
            });
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The whole packet's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The BTH.
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(&self.buffer.as_ref()[..bth::HEADER_LEN])
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        self.bth().opcode()
    }

    fn offsets(&self) -> HeaderOffsets {
        HeaderOffsets::for_opcode(self.opcode()).unwrap_or(HeaderOffsets {
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            payload: bth::HEADER_LEN,
        })
    }

    fn slice(&self, at: Option<usize>, len: usize) -> Option<&[u8]> {
        at.map(|at| &self.buffer.as_ref()[at..at + len])
    }

    /// The DETH, if the opcode has one.
    pub fn deth(&self) -> Option<Deth<&[u8]>> {
        self.slice(self.offsets().deth, deth::HEADER_LEN)
            .map(Deth::new_unchecked)
    }

    /// The RETH, if the opcode has one.
    pub fn reth(&self) -> Option<Reth<&[u8]>> {
        self.slice(self.offsets().reth, reth::HEADER_LEN)
            .map(Reth::new_unchecked)
    }

    /// The AtomicETH, if the opcode has one.
    pub fn atomic_eth(&self) -> Option<AtomicEth<&[u8]>> {
        self.slice(self.offsets().atomic_eth, atomic_eth::HEADER_LEN)
            .map(AtomicEth::new_unchecked)
    }

    /// The AETH, if the opcode has one.
    pub fn aeth(&self) -> Option<Aeth<&[u8]>> {
        self.slice(self.offsets().aeth, aeth::HEADER_LEN)
            .map(Aeth::new_unchecked)
    }

    /// The AtomicAckETH, if the opcode has one.
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEth<&[u8]>> {
        self.slice(self.offsets().atomic_ack_eth, atomic_ack_eth::HEADER_LEN)
            .map(AtomicAckEth::new_unchecked)
    }

    /// The ImmDt, if the opcode has one.
    pub fn immdt(&self) -> Option<ImmDt<&[u8]>> {
        self.slice(self.offsets().immdt, immdt::HEADER_LEN)
            .map(ImmDt::new_unchecked)
    }

    /// The length of BTH and extension headers.
    pub fn header_len(&self) -> usize {
        self.offsets().payload
    }

    /// The payload without its pad.
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = b.len() - ICRC_LEN - usize::from(self.bth().pad_count());
        &b[self.header_len()..end]
    }

    /// The ICRC as the number rxe computes (it is stored little-endian).
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let at = b.len() - ICRC_LEN;
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// The BTH, writable.
    pub fn bth_mut(&mut self) -> Bth<&mut [u8]> {
        Bth::new_unchecked(&mut self.buffer.as_mut()[..bth::HEADER_LEN])
    }

    /// The payload without its pad, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        let pad = usize::from(self.bth().pad_count());
        let b = self.buffer.as_mut();
        let end = b.len() - ICRC_LEN - pad;
        &mut b[start..end]
    }

    /// Writes the ICRC (little-endian, as rxe stores it).
    pub fn set_icrc(&mut self, icrc: u32) {
        let b = self.buffer.as_mut();
        let at = b.len() - ICRC_LEN;
        b[at..].copy_from_slice(&icrc.to_le_bytes());
    }
}

/// A parsed transport packet. Which extension headers are `Some` is dictated by the opcode;
/// parse guarantees it and emit checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr<'a> {
    /// The BTH. On emit, `pad_count` is ignored and computed from the payload.
    pub bth: BthRepr,
    /// The DETH (UD opcodes).
    pub deth: Option<DethRepr>,
    /// The RETH.
    pub reth: Option<RethRepr>,
    /// The AtomicETH.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// The AETH.
    pub aeth: Option<AethRepr>,
    /// The AtomicAckETH.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// The ImmDt.
    pub immdt: Option<ImmDtRepr>,
    /// The payload, without pad.
    pub payload: &'a [u8],
}

impl<'a> PacketRepr<'a> {
    /// Parses a packet. Opcodes without payload must carry none (nor pad). Inlined: a
    /// receiver (softnic's engine, per packet) then keeps only the fields it reads.
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Self, Error> {
        packet.check_len()?;
        let bytes: &'a [u8] = (*packet.buffer).as_ref();
        let bth = BthRepr::parse(&Bth::new_unchecked(bytes))?;
        let offsets =
            HeaderOffsets::for_opcode(bth.opcode).ok_or(Error::UnknownOpcode(bth.opcode.into()))?;
        let end = bytes.len() - ICRC_LEN;
        if !bth.opcode.has_payload() && end != offsets.payload {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "payload",
                stated: 0,
                actual: end - offsets.payload,
            });
        }
        let at = |offset: usize, len: usize| &bytes[offset..offset + len];
        Ok(PacketRepr {
            bth,
            deth: match offsets.deth {
                Some(o) => Some(DethRepr::parse(&Deth::new_unchecked(at(
                    o,
                    deth::HEADER_LEN,
                )))?),
                None => None,
            },
            reth: match offsets.reth {
                Some(o) => Some(RethRepr::parse(&Reth::new_unchecked(at(
                    o,
                    reth::HEADER_LEN,
                )))?),
                None => None,
            },
            atomic_eth: match offsets.atomic_eth {
                Some(o) => Some(AtomicEthRepr::parse(&AtomicEth::new_unchecked(at(
                    o,
                    atomic_eth::HEADER_LEN,
                )))?),
                None => None,
            },
            aeth: match offsets.aeth {
                Some(o) => Some(AethRepr::parse(&Aeth::new_unchecked(at(
                    o,
                    aeth::HEADER_LEN,
                )))?),
                None => None,
            },
            atomic_ack_eth: match offsets.atomic_ack_eth {
                Some(o) => Some(AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(at(
                    o,
                    atomic_ack_eth::HEADER_LEN,
                )))?),
                None => None,
            },
            immdt: match offsets.immdt {
                Some(o) => Some(ImmDtRepr::parse(&ImmDt::new_unchecked(at(
                    o,
                    immdt::HEADER_LEN,
                )))?),
                None => None,
            },
            payload: &bytes[offsets.payload..end - usize::from(bth.pad_count)],
        })
    }

    /// Checks every extension header is present exactly when the opcode calls for it, and that
    /// only payload-carrying opcodes carry payload.
    pub fn check_headers(&self) -> Result<(), Error> {
        let opcode = self.bth.opcode;
        let code = u8::from(opcode);
        if opcode.info().is_none() {
            return Err(Error::UnknownOpcode(code));
        }
        let checks = [
            (self.deth.is_some(), opcode.has_deth(), "DETH"),
            (self.reth.is_some(), opcode.has_reth(), "RETH"),
            (
                self.atomic_eth.is_some(),
                opcode.has_atomic_eth(),
                "AtomicETH",
            ),
            (self.aeth.is_some(), opcode.has_aeth(), "AETH"),
            (
                self.atomic_ack_eth.is_some(),
                opcode.has_atomic_ack_eth(),
                "AtomicAckETH",
            ),
            (self.immdt.is_some(), opcode.has_immediate(), "ImmDt"),
        ];
        for (present, wanted, header) in checks {
            if present != wanted {
                return Err(Error::HeadersDisagreeWithOpcode {
                    opcode: code,
                    header,
                });
            }
        }
        // Payload-carrying opcodes may carry an empty payload (a zero-byte SEND).
        if !self.payload.is_empty() && !opcode.has_payload() {
            return Err(Error::HeadersDisagreeWithOpcode {
                opcode: code,
                header: "payload",
            });
        }
        Ok(())
    }

    /// The bytes the packet takes, ICRC included.
    pub fn buffer_len(&self) -> usize {
        self.bth.opcode.header_len()
            + self.payload.len()
            + usize::from(pad_for(self.payload.len()))
            + ICRC_LEN
    }

    /// Writes the packet into `buffer`, which must be exactly [`PacketRepr::buffer_len`]
    /// bytes. The pad bytes and the ICRC are written as zero; fill the ICRC with
    /// [`super::icrc`] once the IP and UDP headers are known.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        self.check_headers()?;
        let len = self.buffer_len();
        if buffer.len() != len {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "buffer",
                stated: len,
                actual: buffer.len(),
            });
        }
        let offsets = HeaderOffsets::for_opcode(self.bth.opcode)
            .ok_or(Error::UnknownOpcode(self.bth.opcode.into()))?;
        let pad = pad_for(self.payload.len());
        BthRepr {
            pad_count: pad,
            ..self.bth
        }
        .emit(&mut Bth::new_unchecked(&mut buffer[..bth::HEADER_LEN]));
        if let (Some(o), Some(r)) = (offsets.deth, self.deth) {
            r.emit(&mut Deth::new_unchecked(
                &mut buffer[o..o + deth::HEADER_LEN],
            ));
        }
        if let (Some(o), Some(r)) = (offsets.reth, self.reth) {
            r.emit(&mut Reth::new_unchecked(
                &mut buffer[o..o + reth::HEADER_LEN],
            ));
        }
        if let (Some(o), Some(r)) = (offsets.atomic_eth, self.atomic_eth) {
            r.emit(&mut AtomicEth::new_unchecked(
                &mut buffer[o..o + atomic_eth::HEADER_LEN],
            ));
        }
        if let (Some(o), Some(r)) = (offsets.aeth, self.aeth) {
            r.emit(&mut Aeth::new_unchecked(
                &mut buffer[o..o + aeth::HEADER_LEN],
            ));
        }
        if let (Some(o), Some(r)) = (offsets.atomic_ack_eth, self.atomic_ack_eth) {
            r.emit(&mut AtomicAckEth::new_unchecked(
                &mut buffer[o..o + atomic_ack_eth::HEADER_LEN],
            ));
        }
        if let (Some(o), Some(r)) = (offsets.immdt, self.immdt) {
            r.emit(&mut ImmDt::new_unchecked(
                &mut buffer[o..o + immdt::HEADER_LEN],
            ));
        }
        let payload_end = offsets.payload + self.payload.len();
        buffer[offsets.payload..payload_end].copy_from_slice(self.payload);
        buffer[payload_end..].fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roce::aeth::Syndrome;
    use crate::roce::psn::Psn;

    fn bth(opcode: Opcode, pad_count: u8) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count,
            pkey: bth::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: Psn::new(5),
        }
    }

    /// RDMA WRITE Only with Immediate, 3 payload bytes: BTH (pad 1), RETH, ImmDt, payload,
    /// one pad byte, ICRC (zero here). Written out by hand.
    const GOLDEN_WRITE_IMM: [u8; 40] = [
        0x0b, 0x10, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x05, // BTH
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x22, 0x00, 0x00, 0x00,
        0x03, // RETH: VA 0x1000, R_Key 0x22, length 3
        0xca, 0xfe, 0xba, 0xbe, // ImmDt
        0x61, 0x62, 0x63, // payload "abc"
        0x00, // pad
        0x00, 0x00, 0x00, 0x00, // ICRC
    ];

    fn golden_write_imm() -> PacketRepr<'static> {
        PacketRepr {
            deth: None,
            bth: bth(Opcode::RdmaWriteOnlyWithImmediate, 1),
            reth: Some(RethRepr {
                va: 0x1000,
                rkey: 0x22,
                dma_length: 3,
            }),
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: Some(ImmDtRepr { imm: 0xcafe_babe }),
            payload: b"abc",
        }
    }

    #[test]
    fn golden_write_with_immediate_parses() {
        let packet = Packet::new_checked(&GOLDEN_WRITE_IMM[..]).unwrap();
        assert_eq!(packet.header_len(), 32);
        assert_eq!(packet.payload(), b"abc");
        assert_eq!(PacketRepr::parse(&packet).unwrap(), golden_write_imm());
    }

    #[test]
    fn golden_write_with_immediate_emits() {
        let repr = golden_write_imm();
        assert_eq!(repr.buffer_len(), 40);
        let mut buf = [0xeeu8; 40];
        repr.emit(&mut buf).unwrap();
        assert_eq!(buf, GOLDEN_WRITE_IMM);
    }

    /// UD SEND Only with Immediate to QP 0x11 at PSN 5, Q_Key 0x8001_0203 from QP 0x1234, one
    /// pad byte, ICRC (zero here). Written out by hand.
    const GOLDEN_UD_SEND_IMM: [u8; 32] = [
        0x65, 0x10, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x05, // BTH
        0x80, 0x01, 0x02, 0x03, 0x00, 0x00, 0x12, 0x34, // DETH
        0xca, 0xfe, 0xba, 0xbe, // ImmDt
        0x61, 0x62, 0x63, // payload "abc"
        0x00, // pad
        0x00, 0x00, 0x00, 0x00, // ICRC
    ];

    #[test]
    fn a_ud_send_carries_its_deth_right_after_the_bth() {
        let mut bth = bth(Opcode::UdSendOnlyWithImmediate, 1);
        bth.ack_req = false;
        let repr = PacketRepr {
            deth: Some(DethRepr {
                qkey: 0x8001_0203,
                src_qp: 0x1234,
            }),
            bth,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: Some(ImmDtRepr { imm: 0xcafe_babe }),
            payload: b"abc",
        };
        let mut buf = [0xeeu8; 32];
        repr.emit(&mut buf).unwrap();
        assert_eq!(buf, GOLDEN_UD_SEND_IMM);
        let packet = Packet::new_checked(&GOLDEN_UD_SEND_IMM[..]).unwrap();
        assert_eq!(packet.header_len(), 24);
        assert_eq!(packet.deth().unwrap().src_qp(), 0x1234);
        assert_eq!(PacketRepr::parse(&packet).unwrap(), repr);
        // A UD opcode without its DETH, or an RC one with a DETH, is refused.
        let without = PacketRepr { deth: None, ..repr };
        assert!(without.emit(&mut buf).is_err());
        let mut rc = golden_write_imm();
        rc.deth = repr.deth;
        assert!(rc.emit(&mut [0u8; 40]).is_err());
    }

    #[test]
    fn emit_computes_the_pad_from_the_payload() {
        let repr = PacketRepr {
            deth: None,
            bth: bth(Opcode::SendOnly, 3), // wrong on purpose: emit ignores it
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            payload: &[1, 2, 3, 4, 5],
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        assert_eq!(buf.len(), 12 + 5 + 3 + 4);
        repr.emit(&mut buf).unwrap();
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(packet.bth().pad_count(), 3);
        assert_eq!(packet.payload(), &[1, 2, 3, 4, 5]);
    }

    #[test]
    fn an_atomic_acknowledge_carries_aeth_then_atomic_ack_eth() {
        let repr = PacketRepr {
            deth: None,
            bth: bth(Opcode::AtomicAcknowledge, 0),
            reth: None,
            atomic_eth: None,
            aeth: Some(AethRepr {
                syndrome: Syndrome::Ack { credit_code: 0x1f },
                msn: 9,
            }),
            atomic_ack_eth: Some(AtomicAckEthRepr { orig_rem_dt: 77 }),
            immdt: None,
            payload: &[],
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).unwrap();
        assert_eq!(&buf[12..16], &[0x1f, 0, 0, 9]);
        assert_eq!(&buf[16..24], &77u64.to_be_bytes());
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(PacketRepr::parse(&packet).unwrap(), repr);
    }

    #[test]
    fn headers_that_disagree_with_the_opcode_are_refused() {
        let mut repr = golden_write_imm();
        repr.immdt = None;
        let mut buf = [0u8; 64];
        assert_eq!(
            repr.emit(&mut buf[..36]),
            Err(Error::HeadersDisagreeWithOpcode {
                opcode: 0x0b,
                header: "ImmDt"
            })
        );
        let mut ack = golden_write_imm();
        ack.bth.opcode = Opcode::Acknowledge;
        assert!(ack.check_headers().is_err());
    }

    #[test]
    fn payload_on_an_opcode_without_payload_is_refused() {
        // An ACK followed by 4 stray bytes before the ICRC.
        let mut buf = [0u8; 12 + 4 + 4 + 4];
        buf[0] = 0x11;
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert!(matches!(
            PacketRepr::parse(&packet),
            Err(Error::LengthMismatch {
                field: "payload",
                ..
            })
        ));
    }

    #[test]
    fn an_unknown_opcode_is_refused() {
        let mut buf = [0u8; 16];
        // 0x66 is not an opcode railshift speaks (only the UD SENDs 0x64 and 0x65 are).
        buf[0] = 0x66;
        assert_eq!(
            Packet::new_checked(&buf[..]).err(),
            Some(Error::UnknownOpcode(0x66))
        );
    }

    #[test]
    fn a_pad_longer_than_the_payload_is_refused() {
        let mut buf = [0u8; 12 + 2 + 4];
        buf[0] = 0x04; // SEND Only
        buf[1] = 0x30; // pad 3, but only 2 bytes follow the BTH
        assert!(matches!(
            Packet::new_checked(&buf[..]),
            Err(Error::LengthMismatch {
                field: "PadCnt",
                ..
            })
        ));
    }

    #[test]
    fn a_packet_shorter_than_its_headers_is_refused() {
        let mut buf = [0u8; 20];
        buf[0] = 0x0c; // READ Request needs 28 + 4
        assert!(matches!(
            Packet::new_checked(&buf[..]),
            Err(Error::Truncated { needed: 32, .. })
        ));
    }

    #[test]
    fn icrc_is_stored_little_endian() {
        let mut buf = GOLDEN_WRITE_IMM;
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_icrc(0x1122_3344);
        assert_eq!(&buf[36..], &[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(Packet::new_unchecked(&buf[..]).icrc(), 0x1122_3344);
    }
}
