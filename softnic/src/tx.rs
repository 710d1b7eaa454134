//! The packets one engine round sends: a reusable batch flushed to the wire when full or at the
//! end of the round, never a buffer allocated per packet.

use std::net::IpAddr;
use std::time::Duration;

use crate::codec;
use crate::counters::Counters;
use crate::medium::WireImpl;
use crate::packet::OutHeader;
use crate::trace::Trace;
use crate::wire::{Batch, PacketBuf};

/// Packets per batch: one `sendmmsg`/`recvmmsg` moves at most this many.
pub(crate) const BATCH: usize = 64;

/// Everything a transport step needs to put packets on the wire.
pub(crate) struct Tx<'a> {
    pub wire: &'a mut WireImpl,
    pub batch: &'a mut Batch,
    pub local_addr: IpAddr,
    pub now: Duration,
    pub port_up: bool,
    pub device: &'a mut Counters,
    pub trace: &'a mut Option<Trace>,
    /// Packets handed to the wire this round (for the engine's busy decision).
    pub sent: usize,
    /// Packets built this round, sent or not (a port that is down drops them, a full socket
    /// refuses some): what a pass's budget counts, and never goes back.
    pub built: usize,
}

impl Tx<'_> {
    /// Sends what is batched.
    pub fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        if !self.port_up {
            self.device.port_down_drops += self.batch.count as u64;
            self.batch.clear();
            return;
        }
        if let Some(t) = self.trace.as_mut() {
            for p in self.batch.filled() {
                t.record(
                    self.local_addr,
                    p.src_port,
                    p.peer,
                    crate::wire::ROCE_PORT,
                    p.bytes(),
                    self.now,
                );
            }
        }
        self.sent += self.wire.send(self.batch, self.now);
    }

    fn slot(&mut self) -> &mut PacketBuf {
        if self.batch.is_full() {
            self.flush();
        }
        self.built += 1;
        self.batch
            .next_slot()
            .expect("batch has room after a flush")
    }

    /// Lays out one packet: headers from `hdr`, then `fill` writes exactly `hdr.payload_len`
    /// payload bytes into the slice it is given (returning false aborts the packet), then pad
    /// and ICRC. Counts it on `qp` (and so on the device).
    #[inline]
    pub fn emit(
        &mut self,
        hdr: &OutHeader,
        peer: IpAddr,
        src_port: u16,
        qp: &mut Counters,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        let headers = |buf: &mut [u8]| codec::emit_headers(buf, hdr);
        self.emit_with(headers, hdr.payload_len, peer, src_port, qp, fill)
    }

    /// As [`Tx::emit`], the headers written by `headers` (which returns where the payload
    /// goes): a UD SEND's, with its DETH.
    #[inline(always)]
    pub fn emit_with(
        &mut self,
        headers: impl FnOnce(&mut [u8]) -> Option<usize>,
        payload_len: u32,
        peer: IpAddr,
        src_port: u16,
        qp: &mut Counters,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        let local = self.local_addr;
        let slot = self.slot();
        let Some(hlen) = headers(&mut slot.data) else {
            return false;
        };
        let plen = payload_len as usize;
        if hlen + plen + 8 > slot.data.len() || !fill(&mut slot.data[hlen..hlen + plen]) {
            return false;
        }
        let Some(len) = codec::seal(&mut slot.data, hlen + plen, local, src_port, peer) else {
            return false;
        };
        slot.len = len;
        slot.peer = peer;
        slot.src_port = src_port;
        self.batch.commit();
        qp.tx_packets += 1;
        qp.tx_bytes += len as u64;
        true
    }
}
