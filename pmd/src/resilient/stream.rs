//! A reliable, sealed stream of control messages between two connection ends over a
//! datagram transport, sans-IO (`docs/failover.md` 5f and 5g): it turns the machine's messages
//! into records, and records from the network into messages, acknowledgments and records to
//! send back; the caller owns the socket and the clock. Each end draws a random connection id
//! and a random 32-byte key and hands both to the peer in the rendezvous; a record is for the
//! end whose id it names and is sealed with that end's key, so that a stranger on the
//! network, who has neither, cannot forge one, and the sequence numbers make a copy of an old
//! one (a replay, or a retransmission whose acknowledgment was lost) a duplicate that is
//! dropped and counted. The management channel runs one stream per connection end today.
//!
//! A record (big-endian, 88 bytes):
//!
//! ```text
//!  0       4     5      6       8                 16                24                 56          88
//!  +-------+-----+------+-------+-----------------+-----------------+------------------+-----------+
//!  | "RSMG"| ver | kind | 0   0 | receiver's id   | sequence number | control message  | HMAC (32) |
//!  +-------+-----+------+-------+-----------------+-----------------+------------------+-----------+
//! ```
//!
//! - kind 1, a message: its number (the first is 1) and the 32 bytes of the control ring's
//!   format ([`ControlRepr`], its destination QPN the receiver's default QPN);
//! - kind 2, an acknowledgment: the highest number delivered in order; the message field zero.
//!
//! The MAC is HMAC-SHA256 over `"railshift management v1\0"` and the 56 bytes before it.
//! Messages are delivered in order, once: a message is taken only if it is the next one; the
//! sender resends every unacknowledged one, in order, until the acknowledgment comes.
//!
//! A datagram carries one record or several back to back ([`pack`], [`records`]): its length
//! is a whole number of records, at most [`MAX_RECORDS`]. Each record is sealed and numbered
//! on its own, for whichever end it names, so the records of many connection ends to the
//! same peer share datagrams, and a forged record among genuine ones costs only itself.

use std::collections::VecDeque;
use std::io;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::failover::{ControlMessage, ControlPacket, ControlRepr, Timestamp, CONTROL_MESSAGE_LEN};

/// Most records in one datagram: 46 fill a 4,096-byte path MTU (4,048 bytes).
pub(crate) const MAX_RECORDS: usize = 46;
/// Most records in one UDP datagram of the management network: 16 (1,408 bytes) leave room
/// for the IP and UDP headers inside an Ethernet MTU of 1,500, so nothing is fragmented.
pub(crate) const UDP_RECORDS: usize = 16;

/// The datagrams that carry `records`, in order, at most `per_datagram` (1 to
/// [`MAX_RECORDS`]) in each.
pub(crate) fn pack(records: &[Record], per_datagram: usize) -> impl Iterator<Item = Vec<u8>> + '_ {
    records
        .chunks(per_datagram.clamp(1, MAX_RECORDS))
        .map(|chunk| chunk.concat())
}

/// The connection id a record (untrusted, [`RECORD_LEN`] bytes) names as its receiver.
pub(crate) fn receiver_of(record: &[u8]) -> u64 {
    record
        .get(field::RECEIVER)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// The records of a received datagram (untrusted bytes), in order; `None` for a datagram that
/// is not a whole number of records, from 1 to [`MAX_RECORDS`].
pub(crate) fn records(datagram: &[u8]) -> Option<std::slice::ChunksExact<'_, u8>> {
    let n = datagram.len() / RECORD_LEN;
    (datagram.len() % RECORD_LEN == 0 && (1..=MAX_RECORDS).contains(&n))
        .then(|| datagram.chunks_exact(RECORD_LEN))
}

/// The length of a record.
pub(crate) const RECORD_LEN: usize = 88;
/// One sealed record, as it goes on the wire.
pub(crate) type Record = [u8; RECORD_LEN];
/// The length of a connection end's key.
pub(crate) const KEY_LEN: usize = 32;

const MAGIC: u32 = 0x5253_4d47; // "RSMG"
const VERSION: u8 = 1;
const KIND_MESSAGE: u8 = 1;
const KIND_ACK: u8 = 2;
const SEALED: usize = 56;
const DOMAIN: &[u8] = b"railshift management v1\0";

/// How long an unacknowledged message waits before it is sent again: the management network
/// is a LAN, and a message there is rare (a failback's two, a repair's three).
pub(crate) const RESEND_AFTER: Duration = Duration::from_millis(10);

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const KIND: usize = 5;
    pub const RESERVED: Range<usize> = 6..8;
    pub const RECEIVER: Range<usize> = 8..16;
    pub const SEQUENCE: Range<usize> = 16..24;
    pub const MESSAGE: Range<usize> = 24..56;
    pub const MAC: Range<usize> = 56..88;
}

/// One end's identity on the management network: what it publishes for the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EndIdentity {
    /// Names the end in every datagram for it.
    pub id: u64,
    /// Seals every datagram for it.
    pub key: [u8; KEY_LEN],
}

/// What a stream dropped at one end, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamDrops {
    /// Datagrams that were not sealed with this end's key (a wrong MAC, a wrong id, a
    /// malformed datagram or message): forged, altered, or for another connection.
    pub forged: u64,
    /// Sealed messages already delivered (a replay, or a resend whose acknowledgment was
    /// lost), or ahead of the next one (an earlier one lost: it comes again first).
    pub out_of_sequence: u64,
}

/// What one received record brings.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Received {
    /// The message to hand the machine, if it was the next one.
    pub message: Option<ControlMessage>,
    /// The acknowledgment to send back, for a sealed message (new or not).
    pub reply: Option<Record>,
}

/// One connection end's side of a stream: what it sent and not yet saw acknowledged, what
/// it delivered, and the two identities that seal and open its records.
#[derive(Debug)]
pub(crate) struct Stream {
    local: EndIdentity,
    peer: EndIdentity,
    /// The peer's default QPN, the destination of every message to it.
    peer_default_qpn: u32,
    /// This end's default QPN, what every message for it must name.
    local_default_qpn: u32,
    /// The number the next message sent gets.
    next_send: u64,
    /// Sent and not acknowledged, oldest first: (number, message).
    unacked: VecDeque<(u64, ControlMessage)>,
    /// When the unacknowledged messages were last sent.
    sent_at: Option<Timestamp>,
    /// The highest number delivered in order.
    delivered: u64,
    drops: StreamDrops,
}

impl Stream {
    /// The channel between `local` (whose default QP is `local_default_qpn`) and `peer`.
    pub(crate) fn new(
        local: EndIdentity,
        local_default_qpn: u32,
        peer: EndIdentity,
        peer_default_qpn: u32,
    ) -> Stream {
        Stream {
            local,
            peer,
            peer_default_qpn,
            local_default_qpn,
            next_send: 1,
            unacked: VecDeque::new(),
            sent_at: None,
            delivered: 0,
            drops: StreamDrops::default(),
        }
    }

    /// What was dropped so far.
    pub(crate) fn drops(&self) -> StreamDrops {
        self.drops
    }

    /// Queues `message` and returns its record, to send now.
    pub(crate) fn send(&mut self, message: ControlMessage, now: Timestamp) -> [u8; RECORD_LEN] {
        let number = self.next_send;
        self.next_send += 1;
        self.unacked.push_back((number, message));
        if self.unacked.len() == 1 {
            self.sent_at = Some(now);
        }
        self.message_record(number, message)
    }

    /// When the unacknowledged messages are due to be sent again, if any are.
    pub(crate) fn resend_due(&self) -> Option<Timestamp> {
        self.sent_at
            .filter(|_| !self.unacked.is_empty())
            .map(|at| at + RESEND_AFTER)
    }

    /// The unacknowledged messages' records, oldest first, if they are due at `now`.
    pub(crate) fn resend(&mut self, now: Timestamp, out: &mut Vec<Record>) {
        if self.resend_due().is_none_or(|due| now < due) {
            return;
        }
        self.sent_at = Some(now);
        let datagrams: Vec<_> = self
            .unacked
            .iter()
            .map(|&(number, message)| self.message_record(number, message))
            .collect();
        out.extend(datagrams);
    }

    /// Takes one record from the network (untrusted bytes).
    pub(crate) fn receive(&mut self, bytes: &[u8]) -> Received {
        let Some((kind, number, message)) = self.open(bytes) else {
            self.drops.forged += 1;
            return Received::default();
        };
        match kind {
            KIND_ACK => {
                if number >= self.next_send {
                    // Sealed with our key but acknowledging what was never sent: not the
                    // peer's doing.
                    self.drops.forged += 1;
                } else {
                    self.unacked.retain(|&(n, _)| n > number);
                }
                Received::default()
            }
            _ => {
                let message = if number == self.delivered + 1 {
                    self.delivered = number;
                    message
                } else {
                    self.drops.out_of_sequence += 1;
                    None
                };
                Received {
                    message,
                    reply: Some(self.ack_record()),
                }
            }
        }
    }

    /// Checks a record for this end: (kind, number, message for kind 1).
    fn open(&self, bytes: &[u8]) -> Option<(u8, u64, Option<ControlMessage>)> {
        if bytes.len() != RECORD_LEN
            || bytes[field::MAGIC] != MAGIC.to_be_bytes()
            || bytes[field::VERSION] != VERSION
            || bytes[field::RESERVED] != [0, 0]
            || bytes[field::RECEIVER] != self.local.id.to_be_bytes()
        {
            return None;
        }
        let mut mac = mac(&self.local.key);
        mac.update(&bytes[..SEALED]);
        mac.verify_slice(&bytes[field::MAC]).ok()?;
        let number = u64::from_be_bytes(bytes[field::SEQUENCE].try_into().ok()?);
        match bytes[field::KIND] {
            KIND_ACK if bytes[field::MESSAGE].iter().all(|&b| b == 0) => {
                Some((KIND_ACK, number, None))
            }
            KIND_MESSAGE if number > 0 => {
                let packet = ControlPacket::new_checked(&bytes[field::MESSAGE]).ok()?;
                let repr = ControlRepr::parse(&packet).ok()?;
                (repr.dest_qpn == self.local_default_qpn).then_some((
                    KIND_MESSAGE,
                    number,
                    Some(repr.message),
                ))
            }
            _ => None,
        }
    }

    fn message_record(&self, number: u64, message: ControlMessage) -> [u8; RECORD_LEN] {
        let mut body = [0u8; CONTROL_MESSAGE_LEN];
        if let Ok(mut packet) = ControlPacket::new_checked(&mut body[..]) {
            ControlRepr {
                dest_qpn: self.peer_default_qpn,
                message,
            }
            .emit(&mut packet);
        }
        self.seal(KIND_MESSAGE, number, &body)
    }

    fn ack_record(&self) -> [u8; RECORD_LEN] {
        self.seal(KIND_ACK, self.delivered, &[0u8; CONTROL_MESSAGE_LEN])
    }

    /// A record for the peer, sealed with its key.
    fn seal(&self, kind: u8, number: u64, body: &[u8; CONTROL_MESSAGE_LEN]) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
        out[field::VERSION] = VERSION;
        out[field::KIND] = kind;
        out[field::RECEIVER].copy_from_slice(&self.peer.id.to_be_bytes());
        out[field::SEQUENCE].copy_from_slice(&number.to_be_bytes());
        out[field::MESSAGE].copy_from_slice(body);
        let mut mac = mac(&self.peer.key);
        mac.update(&out[..SEALED]);
        out[field::MAC].copy_from_slice(&mac.finalize().into_bytes());
        out
    }
}

fn mac(key: &[u8; KEY_LEN]) -> Hmac<Sha256> {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(DOMAIN);
    mac
}

/// A random connection-end identity: 8 bytes of id and 32 of key from the kernel's generator.
pub(crate) fn random_identity() -> io::Result<EndIdentity> {
    let mut bytes = [0u8; 8 + KEY_LEN];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: writes at most the remaining length into a live buffer.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    let mut key = [0u8; KEY_LEN];
    key.copy_from_slice(&bytes[8..]);
    Ok(EndIdentity {
        id: u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")),
        key,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::failover::{Epoch, SideEpoch};

    pub(crate) fn identity(seed: u8) -> EndIdentity {
        EndIdentity {
            id: 0x1000 + u64::from(seed),
            key: [seed; KEY_LEN],
        }
    }

    /// Host A (default QPN 0x11) and host B (default QPN 0x22).
    fn pair() -> (Stream, Stream) {
        let (a, b) = (identity(1), identity(2));
        (Stream::new(a, 0x11, b, 0x22), Stream::new(b, 0x22, a, 0x11))
    }

    pub(crate) fn at(millis: u64) -> Timestamp {
        Timestamp::from_nanos(millis * 1_000_000)
    }

    pub(crate) const READY: ControlMessage = ControlMessage::FailbackReady { epoch: Epoch(3) };

    #[test]
    fn a_message_is_delivered_once_and_acknowledged() {
        let (mut a, mut b) = pair();
        let datagram = a.send(READY, at(0));
        let got = b.receive(&datagram);
        assert_eq!(got.message, Some(READY));
        assert_eq!(a.resend_due(), Some(at(0) + RESEND_AFTER));
        assert_eq!(
            a.receive(&got.reply.expect("an acknowledgment")),
            Received::default()
        );
        assert_eq!(a.resend_due(), None, "acknowledged: nothing to resend");
        assert_eq!(a.drops(), StreamDrops::default());
        assert_eq!(b.drops(), StreamDrops::default());
    }

    #[test]
    fn an_unacknowledged_message_is_sent_again_in_order_and_delivered_once() {
        let (mut a, mut b) = pair();
        let rearm = ControlMessage::SideRearm {
            epoch: SideEpoch::new(crate::failover::Side::DefaultChannel, 1),
        };
        let first = a.send(rearm, at(0));
        let _lost = a.send(READY, at(1));
        let mut again = Vec::new();
        a.resend(at(5), &mut again);
        assert!(again.is_empty(), "not due yet");
        a.resend(at(10), &mut again);
        assert_eq!(again.len(), 2);
        // The first copy of the first came; its resend is a duplicate.
        assert_eq!(b.receive(&first).message, Some(rearm));
        assert_eq!(b.receive(&again[0]).message, None);
        assert_eq!(b.receive(&again[1]).message, Some(READY));
        assert_eq!(b.drops().out_of_sequence, 1);
    }

    #[test]
    fn a_message_ahead_of_a_lost_one_waits_for_it() {
        let (mut a, mut b) = pair();
        let lost = a.send(READY, at(0));
        let second = a.send(READY, at(0));
        assert_eq!(b.receive(&second).message, None);
        assert_eq!(b.receive(&lost).message, Some(READY));
        assert_eq!(b.receive(&second).message, Some(READY));
    }

    #[test]
    fn a_replayed_message_is_dropped_and_counted() {
        let (mut a, mut b) = pair();
        let datagram = a.send(READY, at(0));
        assert_eq!(b.receive(&datagram).message, Some(READY));
        for _ in 0..3 {
            let replay = b.receive(&datagram);
            assert_eq!(replay.message, None);
        }
        assert_eq!(b.drops().out_of_sequence, 3);
        assert_eq!(b.drops().forged, 0);
    }

    #[test]
    fn forged_altered_or_misdirected_datagrams_are_dropped_and_counted() {
        let (mut a, mut b) = pair();
        let genuine = a.send(READY, at(0));
        // A stranger who knows the format and B's id but not B's key.
        let mut stranger = Stream::new(
            identity(9),
            0x11,
            EndIdentity {
                key: [7; KEY_LEN],
                ..identity(2)
            },
            0x22,
        );
        let forged = stranger.send(READY, at(0));
        let mut altered = genuine;
        altered[field::MESSAGE.start + 8] ^= 1;
        let mut renumbered = genuine;
        renumbered[field::SEQUENCE.end - 1] = 9;
        // Sealed for A, not for B.
        let misdirected = b.send(READY, at(0));
        let mut c = Stream::new(identity(2), 0x22, identity(1), 0x11);
        for bytes in [
            &forged[..],
            &altered,
            &renumbered,
            &genuine[..40],
            &[0u8; RECORD_LEN],
        ] {
            assert_eq!(b.receive(bytes), Received::default(), "{bytes:?}");
        }
        assert_eq!(c.receive(&misdirected), Received::default());
        assert_eq!(b.drops().forged, 5);
        assert_eq!(c.drops().forged, 1);
        // The genuine one still gets through.
        assert_eq!(b.receive(&genuine).message, Some(READY));
    }

    #[test]
    fn an_acknowledgment_of_what_was_never_sent_is_dropped() {
        let (mut a, mut b) = pair();
        let datagram = a.send(READY, at(0));
        let _ = b.receive(&datagram);
        let _ = b.send(READY, at(0));
        // B acknowledges 1 to A after delivering A's first; A has sent one: fine. A
        // hand-made acknowledgment of message 5, sealed with A's key, is not.
        let ack = b.seal(KIND_ACK, 5, &[0u8; CONTROL_MESSAGE_LEN]);
        assert_eq!(a.receive(&ack), Received::default());
        assert_eq!(a.drops().forged, 1);
        assert_eq!(a.resend_due(), Some(at(0) + RESEND_AFTER));
    }

    #[test]
    fn several_records_in_one_datagram_are_taken_in_order_and_a_forged_one_costs_only_itself() {
        let (mut a, mut b) = pair();
        let mut sent: Vec<Record> = (0..3).map(|_| a.send(READY, at(0))).collect();
        let mut forged = sent[1];
        forged[field::MAC.start] ^= 1;
        sent.insert(1, forged);
        let datagrams: Vec<Vec<u8>> = pack(&sent, MAX_RECORDS).collect();
        assert_eq!(datagrams.len(), 1);
        assert_eq!(datagrams[0].len(), 4 * RECORD_LEN);
        let delivered: Vec<_> = records(&datagrams[0])
            .expect("whole records")
            .filter_map(|r| b.receive(r).message)
            .collect();
        assert_eq!(delivered, [READY; 3]);
        assert_eq!(b.drops().forged, 1);
        assert_eq!(b.drops().out_of_sequence, 0);
    }

    #[test]
    fn records_are_packed_at_most_so_many_a_datagram_and_odd_lengths_are_refused() {
        let (mut a, _) = pair();
        let sent: Vec<Record> = (0..40).map(|_| a.send(READY, at(0))).collect();
        let lens: Vec<usize> = pack(&sent, UDP_RECORDS)
            .map(|d| d.len() / RECORD_LEN)
            .collect();
        assert_eq!(lens, [16, 16, 8]);
        let whole: Vec<u8> = pack(&sent, UDP_RECORDS).flatten().collect();
        assert_eq!(&whole[..RECORD_LEN], &sent[0][..]);
        assert!(records(&[]).is_none(), "empty");
        assert!(
            records(&whole[..RECORD_LEN + 1]).is_none(),
            "not whole records"
        );
        let too_many = vec![0u8; (MAX_RECORDS + 1) * RECORD_LEN];
        assert!(records(&too_many).is_none(), "too many");
        assert!(records(&too_many[RECORD_LEN..]).is_some(), "the most");
        assert_eq!(
            records(&whole[..2 * RECORD_LEN]).map(|r| r.count()),
            Some(2)
        );
    }
}
