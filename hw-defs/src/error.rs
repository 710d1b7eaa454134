//! The one error type of this crate: what was wrong with the bytes.

use core::fmt;

/// What was wrong with a buffer handed to a layout, or with a `Repr` handed to `emit`.
///
/// Every parser in this crate returns this on bad input instead of panicking; the variant names
/// the fault and the layout it was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the layout needs.
    Truncated {
        /// The layout being read or written, as its spec names it ("BTH", "mlx5 CQE64").
        layout: &'static str,
        /// Bytes the layout needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// A field holds a value the layout does not allow.
    BadField {
        /// The layout being read or written.
        layout: &'static str,
        /// The field, as the spec names it.
        field: &'static str,
        /// The value found.
        value: u64,
        /// What the layout allows, in words.
        expected: &'static str,
    },
    /// A length field disagrees with the bytes present.
    LengthMismatch {
        /// The layout being read or written.
        layout: &'static str,
        /// The length field, as the spec names it.
        field: &'static str,
        /// The length the field states.
        stated: usize,
        /// The length the buffer or the other headers allow.
        actual: usize,
    },
    /// A BTH opcode this crate does not know (not a reliable-connected opcode of the table).
    UnknownOpcode(u8),
    /// A `Repr` carries a header or segment its opcode does not have, or lacks one it needs.
    HeadersDisagreeWithOpcode {
        /// The opcode (BTH opcode, or mlx5 send opcode).
        opcode: u8,
        /// The header or segment that is missing or extra ("RETH", "raddr segment", ...).
        header: &'static str,
    },
    /// A checksum in a header does not match the bytes.
    BadChecksum {
        /// The layout whose checksum is wrong.
        layout: &'static str,
    },
    /// The invariant CRC of a packet does not match the bytes.
    IcrcMismatch {
        /// The ICRC the packet carries.
        carried: u32,
        /// The ICRC computed over the packet.
        computed: u32,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated {
                layout,
                needed,
                available,
            } => write!(
                f,
                "{layout}: buffer of {available} bytes is shorter than the {needed} bytes needed"
            ),
            Error::BadField {
                layout,
                field,
                value,
                expected,
            } => write!(
                f,
                "{layout}: field {field} is {value:#x}, expected {expected}"
            ),
            Error::LengthMismatch {
                layout,
                field,
                stated,
                actual,
            } => write!(
                f,
                "{layout}: field {field} states {stated} bytes but {actual} are present"
            ),
            Error::UnknownOpcode(opcode) => {
                write!(f, "BTH: opcode {opcode:#04x} is not a known RC opcode")
            }
            Error::HeadersDisagreeWithOpcode { opcode, header } => {
                write!(f, "{header} does not match opcode {opcode:#04x}")
            }
            Error::BadChecksum { layout } => write!(f, "{layout}: bad checksum"),
            Error::IcrcMismatch { carried, computed } => write!(
                f,
                "ICRC mismatch: packet carries {carried:#010x}, bytes give {computed:#010x}"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// Returns `Truncated` unless `buffer` holds at least `needed` bytes.
pub(crate) fn check_len(layout: &'static str, buffer: &[u8], needed: usize) -> Result<(), Error> {
    if buffer.len() < needed {
        Err(Error::Truncated {
            layout,
            needed,
            available: buffer.len(),
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_names_the_layout_and_both_lengths() {
        let message = Error::Truncated {
            layout: "BTH",
            needed: 12,
            available: 3,
        }
        .to_string();
        assert_eq!(
            message,
            "BTH: buffer of 3 bytes is shorter than the 12 bytes needed"
        );
    }

    #[test]
    fn check_len_accepts_exact_and_longer_buffers() {
        assert!(check_len("x", &[0; 4], 4).is_ok());
        assert!(check_len("x", &[0; 5], 4).is_ok());
        assert_eq!(
            check_len("x", &[0; 3], 4),
            Err(Error::Truncated {
                layout: "x",
                needed: 4,
                available: 3
            })
        );
    }
}
