//! The ACK Extended Transport Header: ACK with credits, RNR NAK with a timer, NAK with a code,
//! and the message sequence number.
//!
//! The syndrome byte is `reserved[7] type[6:5] value[4:0]`: type 00 is an ACK whose value is a
//! credit-count code, 01 an RNR NAK whose value is the RNR timer code, 11 a NAK whose value is
//! the NAK code; 10 is reserved (IBA 9.7.5.2).

use core::time::Duration;

use crate::bytes::{be_u24, put_be_u24};
use crate::error::Error;

/// Byte ranges of the AETH (IBA 9.3.7), named as the spec names them.
pub(crate) mod field {
    use core::ops::Range;
    pub const SYNDROME: usize = 0;
    pub const MSN: Range<usize> = 1..4;
}

/// Length of the AETH.
pub const HEADER_LEN: usize = field::MSN.end;
/// The credit code meaning "no end-to-end flow control" (rxe's `AETH_ACK_UNLIMITED`).
pub const CREDITS_UNLIMITED: u8 = 0x1f;
/// The 24-bit mask of the MSN.
pub const MSN_MASK: u32 = 0x00ff_ffff;

const LAYOUT: &str = "AETH";
const VALUE_MASK: u8 = 0x1f;

enum_with_unknown! {
    /// A NAK code (IBA table 44).
    pub enum NakCode(u8) {
        /// The PSN was beyond the expected one: resend from the expected PSN.
        PsnSequenceError = 0,
        /// The request was invalid (bad opcode, length, ...).
        InvalidRequest = 1,
        /// The responder refused the rkey, bounds or access rights.
        RemoteAccessError = 2,
        /// The responder could not complete the request.
        RemoteOperationalError = 3,
        /// An invalid RD request.
        InvalidRdRequest = 4,
    }
}

/// The decoded syndrome byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// A positive acknowledgement with a credit-count code (see [`credits_for_code`]).
    Ack {
        /// The credit-count code (0..=31; 31 means no flow control).
        credit_code: u8,
    },
    /// Receiver not ready: retry after the time the timer code names.
    RnrNak {
        /// The RNR timer code (0..=31, see [`rnr_timer`]).
        timer_code: u8,
    },
    /// A negative acknowledgement.
    Nak(NakCode),
    /// A reserved type or the reserved top bit; the raw byte.
    Reserved(u8),
}

impl From<u8> for Syndrome {
    fn from(byte: u8) -> Self {
        let value = byte & VALUE_MASK;
        match byte >> 5 {
            0b000 => Syndrome::Ack { credit_code: value },
            0b001 => Syndrome::RnrNak { timer_code: value },
            0b011 => Syndrome::Nak(NakCode::from(value)),
            _ => Syndrome::Reserved(byte),
        }
    }
}

impl From<Syndrome> for u8 {
    fn from(syndrome: Syndrome) -> u8 {
        match syndrome {
            Syndrome::Ack { credit_code } => credit_code & VALUE_MASK,
            Syndrome::RnrNak { timer_code } => 0x20 | (timer_code & VALUE_MASK),
            Syndrome::Nak(code) => 0x60 | (u8::from(code) & VALUE_MASK),
            Syndrome::Reserved(byte) => byte,
        }
    }
}

/// The number of credits a credit-count code grants (IBA table 43); `None` for 31, which
/// means the responder does not do end-to-end flow control.
pub const fn credits_for_code(code: u8) -> Option<u32> {
    const CREDITS: [u32; 31] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    ];
    let code = (code & VALUE_MASK) as usize;
    if code < CREDITS.len() {
        Some(CREDITS[code])
    } else {
        None
    }
}

/// The RNR NAK timer for a timer code (IBA table 45, rxe's `rnrnak_usec`): how long the
/// requester waits before retrying. Code 0 is the longest, 655.36 ms.
pub const fn rnr_timer(code: u8) -> Duration {
    const MICROS: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(MICROS[(code & VALUE_MASK) as usize])
}

fixed_view!(
    /// A view of an AETH over a byte buffer.
    Aeth,
    HEADER_LEN,
    LAYOUT
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// The raw syndrome byte.
    pub fn raw_syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// The decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from(self.raw_syndrome())
    }

    /// The message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        be_u24(&self.buffer.as_ref()[field::MSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, syndrome: Syndrome) {
        self.buffer.as_mut()[field::SYNDROME] = syndrome.into();
    }

    /// Sets the message sequence number (the high byte is dropped).
    pub fn set_msn(&mut self, msn: u32) {
        put_be_u24(&mut self.buffer.as_mut()[field::MSN], msn);
    }
}

/// A parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// The syndrome.
    pub syndrome: Syndrome,
    /// The message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Parses an AETH. Reserved syndromes parse to [`Syndrome::Reserved`]; what to do with
    /// them is the transport's decision.
    pub fn parse<T: AsRef<[u8]>>(aeth: &Aeth<T>) -> Result<Self, Error> {
        aeth.check_len()?;
        Ok(AethRepr {
            syndrome: aeth.syndrome(),
            msn: aeth.msn(),
        })
    }

    /// Writes the AETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, aeth: &mut Aeth<T>) {
        aeth.set_syndrome(self.syndrome);
        aeth.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ack_with_unlimited_credits_round_trips() {
        let golden = [0x1f, 0x00, 0x00, 0x2a];
        let repr = AethRepr::parse(&Aeth::new_checked(&golden[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            AethRepr {
                syndrome: Syndrome::Ack {
                    credit_code: CREDITS_UNLIMITED
                },
                msn: 42
            }
        );
        let mut buf = [0u8; 4];
        repr.emit(&mut Aeth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, golden);
    }

    #[test]
    fn an_rnr_nak_carries_its_timer_code() {
        let aeth = Aeth::new_checked([0x2e, 0xff, 0xff, 0xff]).unwrap();
        assert_eq!(aeth.syndrome(), Syndrome::RnrNak { timer_code: 14 });
        assert_eq!(aeth.msn(), MSN_MASK);
        assert_eq!(rnr_timer(14), Duration::from_micros(1280));
    }

    #[test]
    fn nak_codes_zero_to_three_decode() {
        assert_eq!(
            Syndrome::from(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(Syndrome::from(0x61), Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(
            Syndrome::from(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            Syndrome::from(0x63),
            Syndrome::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(Syndrome::from(0x65), Syndrome::Nak(NakCode::Unknown(5)));
    }

    #[test]
    fn reserved_syndromes_keep_their_byte() {
        assert_eq!(Syndrome::from(0x41), Syndrome::Reserved(0x41));
        assert_eq!(Syndrome::from(0x80), Syndrome::Reserved(0x80));
    }

    #[test]
    fn every_syndrome_byte_converts_back_to_itself() {
        for byte in 0..=u8::MAX {
            assert_eq!(u8::from(Syndrome::from(byte)), byte, "{byte:#04x}");
        }
    }

    #[test]
    fn rnr_timer_table_ends_match_the_spec() {
        assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
        assert_eq!(rnr_timer(1), Duration::from_micros(10));
        assert_eq!(rnr_timer(31), Duration::from_micros(491_520));
        assert_eq!(
            rnr_timer(0x20 | 1),
            rnr_timer(1),
            "only the low five bits count"
        );
    }

    #[test]
    fn credit_codes_grant_the_table_counts() {
        assert_eq!(credits_for_code(0), Some(0));
        assert_eq!(credits_for_code(5), Some(6));
        assert_eq!(credits_for_code(30), Some(32768));
        assert_eq!(credits_for_code(CREDITS_UNLIMITED), None);
    }
}
