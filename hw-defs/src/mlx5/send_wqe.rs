//! Whole send WQEs in a send ring: reading one at a WQE index and writing one, with the wrap
//! at the ring's end that libmlx5 applies (a WQE that runs past the last basic block continues
//! at the first).

use core::fmt;

use super::atomic_seg::{AtomicSeg, AtomicSegRepr};
use super::ctrl_seg::{CtrlSeg, CtrlSegRepr, SendOpcode};
use super::data_seg::{DataSeg, DataSegRepr};
use super::datagram_seg::{self, DatagramSeg, DatagramSegRepr};
use super::inline_seg::{self, InlineData, InlineSeg};
use super::raddr_seg::{RaddrSeg, RaddrSegRepr};
use super::wqe::{self, SEND_WQE_BB, SEND_WQE_DS};
use crate::error::Error;

/// A send queue ring: a power-of-two number of 64-byte basic blocks.
#[derive(Debug, Clone)]
pub struct SendRing<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> SendRing<T> {
    /// Wraps a whole send ring after checking its geometry.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let len = buffer.as_ref().len();
        let bbs = len / SEND_WQE_BB;
        if len == 0 || len % SEND_WQE_BB != 0 || !bbs.is_power_of_two() {
            return Err(Error::BadField {
                layout: "mlx5 send ring",
                field: "length",
                value: len as u64,
                expected: "a power-of-two number of 64-byte basic blocks",
            });
        }
        Ok(SendRing { buffer })
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The ring's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The number of basic blocks.
    pub fn bb_count(&self) -> usize {
        self.buffer.as_ref().len() / SEND_WQE_BB
    }

    /// The byte offset of the WQE at `index`.
    pub fn wqe_offset(&self, index: u16) -> usize {
        wqe::wqe_offset(index, self.bb_count())
    }

    /// The byte offset of 16-byte segment `segment` of the WQE at `index`, wrapped.
    pub fn segment_offset(&self, index: u16, segment: usize) -> usize {
        (self.wqe_offset(index) + segment * SEND_WQE_DS) % self.buffer.as_ref().len()
    }

    /// The 16 bytes of segment `segment` of the WQE at `index`.
    pub fn segment(&self, index: u16, segment: usize) -> &[u8] {
        let at = self.segment_offset(index, segment);
        &self.buffer.as_ref()[at..at + SEND_WQE_DS]
    }

    /// The control segment of the WQE at `index`.
    pub fn ctrl(&self, index: u16) -> CtrlSeg<&[u8]> {
        CtrlSeg::new_unchecked(self.segment(index, 0))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SendRing<T> {
    /// The 16 bytes of segment `segment` of the WQE at `index`, writable.
    pub fn segment_mut(&mut self, index: u16, segment: usize) -> &mut [u8] {
        let at = self.segment_offset(index, segment);
        &mut self.buffer.as_mut()[at..at + SEND_WQE_DS]
    }

    /// The control segment of the WQE at `index`, writable.
    pub fn ctrl_mut(&mut self, index: u16) -> CtrlSeg<&mut [u8]> {
        CtrlSeg::new_unchecked(self.segment_mut(index, 0))
    }

    /// The ring's bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
}

/// A gather (or scatter) list: data segments read from a ring, or given as a slice to emit.
#[derive(Clone, Copy)]
pub struct Sges<'a> {
    source: SgeSource<'a>,
}

#[derive(Clone, Copy)]
enum SgeSource<'a> {
    Ring {
        ring: &'a [u8],
        first: usize,
        count: usize,
    },
    Slice(&'a [DataSegRepr]),
}

impl<'a> Sges<'a> {
    /// A list to emit.
    pub fn from_slice(sges: &'a [DataSegRepr]) -> Self {
        Sges {
            source: SgeSource::Slice(sges),
        }
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        match self.source {
            SgeSource::Ring { count, .. } => count,
            SgeSource::Slice(s) => s.len(),
        }
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entry `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<DataSegRepr> {
        if i >= self.len() {
            return None;
        }
        match self.source {
            SgeSource::Ring { ring, first, .. } => {
                let at = (first + i * SEND_WQE_DS) % ring.len();
                let seg = DataSeg::new_unchecked(&ring[at..at + SEND_WQE_DS]);
                Some(DataSegRepr {
                    byte_count: seg.byte_count(),
                    lkey: seg.lkey(),
                    addr: seg.addr(),
                })
            }
            SgeSource::Slice(s) => s.get(i).copied(),
        }
    }

    /// The entries in order.
    pub fn iter(&self) -> impl Iterator<Item = DataSegRepr> + 'a {
        let sges = *self;
        (0..sges.len()).filter_map(move |i| sges.get(i))
    }

    /// The sum of the byte counts.
    pub fn total_bytes(&self) -> u64 {
        self.iter().map(|s| u64::from(s.byte_count)).sum()
    }
}

impl fmt::Debug for Sges<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Sges<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Sges<'_> {}

/// What follows the header segments of a send WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqeData<'a> {
    /// Data segments: where to gather from (or, for reads and atomics, scatter to).
    Gather(Sges<'a>),
    /// Inline payload carried in the WQE itself.
    Inline(InlineData<'a>),
}

/// A whole send WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWqeRepr<'a> {
    /// The control segment. On emit, `ds` is ignored and the size of the segments written.
    pub ctrl: CtrlSegRepr,
    /// The remote-address segment (RDMA and atomic opcodes).
    pub raddr: Option<RaddrSegRepr>,
    /// The atomic segment (atomic opcodes).
    pub atomic: Option<AtomicSegRepr>,
    /// The datagram segment: present exactly in the SENDs and NOPs of a UD QP's ring, which
    /// [`SendWqeRepr::parse_ud`] reads (the opcode is the same as an RC SEND's, so only the
    /// QP's type tells them apart).
    pub datagram: Option<DatagramSegRepr>,
    /// The data.
    pub data: WqeData<'a>,
}

const LAYOUT: &str = "mlx5 send WQE";

/// The 16-byte units of a datagram segment.
const DATAGRAM_DS: usize = datagram_seg::SIZE / SEND_WQE_DS;

impl<'a> SendWqeRepr<'a> {
    /// Reads the WQE at `index` of an RC QP's `ring`.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(ring: &'a SendRing<T>, index: u16) -> Result<Self, Error> {
        Self::parse_as::<T, false>(ring, index)
    }

    /// Reads the WQE at `index` of a UD QP's `ring`: the control segment, the datagram
    /// segment, then the data. Only SEND, SEND_IMM and NOP are UD operations.
    pub fn parse_ud<T: AsRef<[u8]>>(ring: &'a SendRing<T>, index: u16) -> Result<Self, Error> {
        Self::parse_as::<T, true>(ring, index)
    }

    /// The parser of both, `UD` a constant so that RC's parse carries none of UD's checks.
    #[inline(always)]
    fn parse_as<T: AsRef<[u8]>, const UD: bool>(
        ring: &'a SendRing<T>,
        index: u16,
    ) -> Result<Self, Error> {
        let ctrl = CtrlSegRepr::parse(&ring.ctrl(index))?;
        if let SendOpcode::Unknown(opcode) = ctrl.opcode {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "opcode",
                value: u64::from(opcode),
                expected: "NOP, RDMA_WRITE(_IMM), SEND(_IMM), RDMA_READ, ATOMIC_CS or ATOMIC_FA",
            });
        }
        if UD && !is_ud_opcode(ctrl.opcode) {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "opcode",
                value: u64::from(u8::from(ctrl.opcode)),
                expected: "SEND, SEND_IMM or NOP on a UD QP",
            });
        }
        let ds = usize::from(ctrl.ds);
        let header_ds = wqe::header_ds(ctrl.opcode) + if UD { DATAGRAM_DS } else { 0 };
        if ds < header_ds {
            return Err(Error::BadField {
                layout: LAYOUT,
                field: "ds",
                value: ds as u64,
                expected: "at least the units of the opcode's header segments",
            });
        }
        let ring_bytes = ring.as_bytes();
        if ds * SEND_WQE_DS > ring_bytes.len() {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "ds",
                stated: ds * SEND_WQE_DS,
                actual: ring_bytes.len(),
            });
        }
        let raddr = if ctrl.opcode.has_raddr_seg() {
            Some(RaddrSegRepr::parse(&RaddrSeg::new_unchecked(
                ring.segment(index, 1),
            ))?)
        } else {
            None
        };
        let atomic = if ctrl.opcode.has_atomic_seg() {
            Some(AtomicSegRepr::parse(&AtomicSeg::new_unchecked(
                ring.segment(index, 2),
            ))?)
        } else {
            None
        };
        let datagram = if UD {
            // Units 1 to 3, all in the WQE's first basic block: no wrap inside it.
            let at = ring.segment_offset(index, 1);
            Some(DatagramSegRepr::parse(&DatagramSeg::new_unchecked(
                &ring_bytes[at..at + datagram_seg::SIZE],
            ))?)
        } else {
            None
        };
        let data_units = ds - header_ds;
        let first = ring.segment_offset(index, header_ds);
        let data = if data_units > 0
            && InlineSeg::new_unchecked(ring.segment(index, header_ds)).is_inline()
        {
            if ctrl.opcode.scatters_response() {
                return Err(Error::BadField {
                    layout: LAYOUT,
                    field: "byte_count",
                    value: u64::from(inline_seg::INLINE_SEG),
                    expected: "data segments for a read or atomic (no inline scatter)",
                });
            }
            let inline = inline_seg::read_wrapped(ring_bytes, first)?;
            if wqe::inline_ds(inline.len()) > data_units {
                return Err(Error::LengthMismatch {
                    layout: LAYOUT,
                    field: "inline byte_count",
                    stated: inline.len(),
                    actual: data_units * SEND_WQE_DS - inline_seg::HEADER_SIZE,
                });
            }
            WqeData::Inline(inline)
        } else {
            WqeData::Gather(Sges {
                source: SgeSource::Ring {
                    ring: ring_bytes,
                    first,
                    count: data_units,
                },
            })
        };
        Ok(SendWqeRepr {
            ctrl,
            raddr,
            atomic,
            datagram,
            data,
        })
    }

    /// The `ds` this WQE takes when emitted.
    pub fn ds(&self) -> usize {
        let datagram = if self.datagram.is_some() {
            DATAGRAM_DS
        } else {
            0
        };
        datagram
            + match self.data {
                WqeData::Gather(sges) => wqe::gather_wqe_ds(self.ctrl.opcode, sges.len()),
                WqeData::Inline(inline) => wqe::inline_wqe_ds(self.ctrl.opcode, inline.len()),
            }
    }

    /// Writes the WQE at `ctrl.wqe_index` of `ring` and returns the basic blocks it takes.
    ///
    /// Segments are checked against the opcode first; nothing is written if they disagree or
    /// the WQE would not fit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        ring: &mut SendRing<T>,
    ) -> Result<usize, Error> {
        let opcode = self.ctrl.opcode;
        let code = u8::from(opcode);
        if self.raddr.is_some() != opcode.has_raddr_seg() {
            return Err(Error::HeadersDisagreeWithOpcode {
                opcode: code,
                header: "remote-address segment",
            });
        }
        if self.atomic.is_some() != opcode.has_atomic_seg() {
            return Err(Error::HeadersDisagreeWithOpcode {
                opcode: code,
                header: "atomic segment",
            });
        }
        if self.datagram.is_some() && !is_ud_opcode(opcode) {
            return Err(Error::HeadersDisagreeWithOpcode {
                opcode: code,
                header: "datagram segment",
            });
        }
        if matches!(self.data, WqeData::Inline(d) if !d.is_empty()) && opcode.scatters_response() {
            return Err(Error::HeadersDisagreeWithOpcode {
                opcode: code,
                header: "inline segment",
            });
        }
        if let WqeData::Gather(sges) = self.data {
            if let Some(sge) = sges
                .iter()
                .find(|s| s.byte_count & inline_seg::INLINE_SEG != 0)
            {
                return Err(Error::BadField {
                    layout: LAYOUT,
                    field: "byte_count",
                    value: u64::from(sge.byte_count),
                    expected: "below 2^31 (the top bit marks an inline segment)",
                });
            }
        }
        let ds = self.ds();
        if ds > wqe::MAX_DS || ds * SEND_WQE_DS > ring.as_bytes().len() {
            return Err(Error::LengthMismatch {
                layout: LAYOUT,
                field: "ds",
                stated: ds * SEND_WQE_DS,
                actual: (wqe::MAX_DS * SEND_WQE_DS).min(ring.as_bytes().len()),
            });
        }
        let index = self.ctrl.wqe_index;
        let ctrl = CtrlSegRepr {
            ds: ds as u8,
            ..self.ctrl
        };
        ctrl.emit(&mut ring.ctrl_mut(index));
        if let Some(raddr) = self.raddr {
            raddr.emit(&mut RaddrSeg::new_unchecked(ring.segment_mut(index, 1)));
        }
        if let Some(atomic) = self.atomic {
            atomic.emit(&mut AtomicSeg::new_unchecked(ring.segment_mut(index, 2)));
        }
        let mut header_ds = wqe::header_ds(opcode);
        if let Some(datagram) = self.datagram {
            let at = ring.segment_offset(index, 1);
            datagram.emit(&mut DatagramSeg::new_unchecked(
                &mut ring.as_bytes_mut()[at..at + datagram_seg::SIZE],
            ));
            header_ds += DATAGRAM_DS;
        }
        match self.data {
            WqeData::Gather(sges) => {
                for (i, sge) in sges.iter().enumerate() {
                    sge.emit(&mut DataSeg::new_unchecked(
                        ring.segment_mut(index, header_ds + i),
                    ));
                }
            }
            WqeData::Inline(inline) => {
                let first = ring.segment_offset(index, header_ds);
                inline_seg::write_data_wrapped(ring.as_bytes_mut(), first, inline)?;
            }
        }
        Ok(wqe::bbs_for_ds(ds))
    }
}

/// The operations a UD QP has.
fn is_ud_opcode(opcode: SendOpcode) -> bool {
    matches!(
        opcode,
        SendOpcode::Send | SendOpcode::SendImm | SendOpcode::Nop
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx5::ctrl_seg::FenceMode;

    fn ctrl(opcode: SendOpcode, wqe_index: u16) -> CtrlSegRepr {
        CtrlSegRepr {
            opcode,
            opmod: 0,
            wqe_index,
            qpn: 0x11,
            ds: 0,
            signature: 0,
            fence: FenceMode::None,
            signaled: true,
            solicited: false,
            imm: 0,
        }
    }

    #[test]
    fn ring_geometry_must_be_a_power_of_two_in_blocks() {
        assert!(SendRing::new_checked(vec![0u8; 256]).is_ok());
        assert!(SendRing::new_checked(vec![0u8; 192]).is_err());
        assert!(SendRing::new_checked(vec![0u8; 100]).is_err());
        assert!(SendRing::new_checked(Vec::<u8>::new()).is_err());
    }

    #[test]
    fn a_write_with_one_sge_reads_back_as_written() {
        let mut ring = SendRing::new_checked(vec![0u8; 4 * 64]).unwrap();
        let sges = [DataSegRepr {
            byte_count: 4096,
            lkey: 0x22,
            addr: 0x1000,
        }];
        let wqe = SendWqeRepr {
            datagram: None,
            ctrl: ctrl(SendOpcode::RdmaWrite, 6),
            raddr: Some(RaddrSegRepr {
                raddr: 0x9000,
                rkey: 0x33,
            }),
            atomic: None,
            data: WqeData::Gather(Sges::from_slice(&sges)),
        };
        assert_eq!(wqe.emit(&mut ring).unwrap(), 1);
        // Index 6 in a 4-block ring is block 2.
        assert_eq!(&ring.as_bytes()[128..136], &[0, 0, 6, 0x08, 0, 0, 0x11, 3]);
        let parsed = SendWqeRepr::parse(&ring, 6).unwrap();
        assert_eq!(parsed.ctrl.ds, 3);
        assert_eq!(
            parsed,
            SendWqeRepr {
                datagram: None,
                ctrl: CtrlSegRepr { ds: 3, ..wqe.ctrl },
                ..wqe
            }
        );
    }

    #[test]
    fn a_wqe_in_the_last_block_continues_at_the_ring_start() {
        let mut ring = SendRing::new_checked(vec![0u8; 2 * 64]).unwrap();
        let sges: Vec<DataSegRepr> = (0..4)
            .map(|i| DataSegRepr {
                byte_count: 8,
                lkey: i,
                addr: u64::from(i) * 8,
            })
            .collect();
        let wqe = SendWqeRepr {
            datagram: None,
            ctrl: ctrl(SendOpcode::Send, 1),
            raddr: None,
            atomic: None,
            data: WqeData::Gather(Sges::from_slice(&sges)),
        };
        assert_eq!(wqe.emit(&mut ring).unwrap(), 2);
        // ctrl + 3 SGEs fill block 1; the fourth SGE is the first unit of block 0.
        assert_eq!(
            &ring.as_bytes()[4..8],
            &[0, 0, 0, 3],
            "lkey of the fourth SGE"
        );
        let parsed = SendWqeRepr::parse(&ring, 1).unwrap();
        let WqeData::Gather(read) = parsed.data else {
            panic!("expected a gather list");
        };
        assert_eq!(read.iter().collect::<Vec<_>>(), sges);
    }

    #[test]
    fn inline_payload_wraps_with_the_wqe() {
        let mut ring = SendRing::new_checked(vec![0u8; 2 * 64]).unwrap();
        let payload: Vec<u8> = (0..100).collect();
        let wqe = SendWqeRepr {
            datagram: None,
            ctrl: ctrl(SendOpcode::SendImm, 1),
            raddr: None,
            atomic: None,
            data: WqeData::Inline(InlineData::new(&payload)),
        };
        // 1 ctrl unit + inline_ds(100) = 1 + 7 = 8 units = 2 blocks.
        assert_eq!(wqe.emit(&mut ring).unwrap(), 2);
        let parsed = SendWqeRepr::parse(&ring, 1).unwrap();
        assert_eq!(parsed.ctrl.ds, 8);
        let WqeData::Inline(read) = parsed.data else {
            panic!("expected inline data");
        };
        assert_eq!(read.head.len(), 64 - 16 - 4);
        assert_eq!(read.bytes().collect::<Vec<_>>(), payload);
    }

    use crate::mlx5::datagram_seg::tests::repr as datagram;

    #[test]
    fn a_ud_send_carries_its_datagram_segment_before_the_data_and_wraps_after_it() {
        // In the last block of a 2-block ring: the datagram segment fills the rest of that
        // block, the inline data continues at the ring's start.
        let mut ring = SendRing::new_checked(vec![0u8; 2 * 64]).unwrap();
        let payload: Vec<u8> = (0..40).collect();
        let wqe = SendWqeRepr {
            ctrl: ctrl(SendOpcode::SendImm, 1),
            raddr: None,
            atomic: None,
            datagram: Some(datagram()),
            data: WqeData::Inline(InlineData::new(&payload)),
        };
        // 1 ctrl unit + 3 datagram units + inline_ds(40) = 1 + 3 + 3 = 7 units = 2 blocks.
        assert_eq!(wqe.ds(), 7);
        assert_eq!(wqe.emit(&mut ring).unwrap(), 2);
        // The datagram segment's dqp_dct at byte 8 of unit 1 of block 1.
        assert_eq!(
            &ring.as_bytes()[64 + 16 + 8..64 + 16 + 12],
            &[0x80, 0, 1, 0x23]
        );
        let parsed = SendWqeRepr::parse_ud(&ring, 1).unwrap();
        assert_eq!(parsed.datagram, Some(datagram()));
        let WqeData::Inline(read) = parsed.data else {
            panic!("expected inline data");
        };
        assert_eq!(read.bytes().collect::<Vec<_>>(), payload);
        // The inline segment begins after the wrap, at the ring's start: MLX5_INLINE_SEG | 40.
        assert_eq!(&ring.as_bytes()[..4], &[0x80, 0, 0, 40]);
    }

    #[test]
    fn only_sends_and_nops_are_ud_operations() {
        let mut ring = SendRing::new_checked(vec![0u8; 2 * 64]).unwrap();
        let write = SendWqeRepr {
            ctrl: ctrl(SendOpcode::RdmaWrite, 0),
            raddr: Some(RaddrSegRepr {
                raddr: 0x9000,
                rkey: 0x33,
            }),
            atomic: None,
            datagram: Some(datagram()),
            data: WqeData::Inline(InlineData::new(&[])),
        };
        assert!(write.emit(&mut ring).is_err());
        let rc_write = SendWqeRepr {
            datagram: None,
            ..write
        };
        rc_write.emit(&mut ring).unwrap();
        assert!(SendWqeRepr::parse_ud(&ring, 0).is_err());
        assert!(SendWqeRepr::parse(&ring, 0).is_ok());
    }

    #[test]
    fn an_atomic_carries_raddr_atomic_and_one_sge() {
        let mut ring = SendRing::new_checked(vec![0u8; 64]).unwrap();
        let sge = [DataSegRepr {
            byte_count: 8,
            lkey: 1,
            addr: 0x40,
        }];
        let wqe = SendWqeRepr {
            datagram: None,
            ctrl: ctrl(SendOpcode::AtomicCs, 0),
            raddr: Some(RaddrSegRepr { raddr: 8, rkey: 2 }),
            atomic: Some(AtomicSegRepr {
                swap_add: 5,
                compare: 4,
            }),
            data: WqeData::Gather(Sges::from_slice(&sge)),
        };
        assert_eq!(wqe.emit(&mut ring).unwrap(), 1);
        let parsed = SendWqeRepr::parse(&ring, 0).unwrap();
        assert_eq!(parsed.atomic, wqe.atomic);
        assert_eq!(parsed.ctrl.ds, 4);
    }

    #[test]
    fn segments_that_disagree_with_the_opcode_are_refused() {
        let mut ring = SendRing::new_checked(vec![0u8; 64]).unwrap();
        let wqe = SendWqeRepr {
            datagram: None,
            ctrl: ctrl(SendOpcode::RdmaWrite, 0),
            raddr: None,
            atomic: None,
            data: WqeData::Gather(Sges::from_slice(&[])),
        };
        assert!(matches!(
            wqe.emit(&mut ring),
            Err(Error::HeadersDisagreeWithOpcode { opcode: 0x08, .. })
        ));
        assert!(ring.as_bytes().iter().all(|&b| b == 0), "nothing written");
    }

    #[test]
    fn a_byte_count_with_the_inline_bit_is_refused() {
        let mut ring = SendRing::new_checked(vec![0u8; 64]).unwrap();
        let sge = [DataSegRepr {
            byte_count: 0x8000_0000,
            lkey: 1,
            addr: 0,
        }];
        let wqe = SendWqeRepr {
            datagram: None,
            ctrl: ctrl(SendOpcode::Send, 0),
            raddr: None,
            atomic: None,
            data: WqeData::Gather(Sges::from_slice(&sge)),
        };
        assert!(matches!(
            wqe.emit(&mut ring),
            Err(Error::BadField {
                field: "byte_count",
                ..
            })
        ));
    }

    #[test]
    fn a_ds_smaller_than_the_headers_is_rejected() {
        let mut ring = SendRing::new_checked(vec![0u8; 64]).unwrap();
        CtrlSegRepr {
            ds: 1,
            ..ctrl(SendOpcode::RdmaRead, 0)
        }
        .emit(&mut ring.ctrl_mut(0));
        assert!(matches!(
            SendWqeRepr::parse(&ring, 0),
            Err(Error::BadField { field: "ds", .. })
        ));
    }
}
