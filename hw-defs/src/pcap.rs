//! The classic pcap file format, as bytes: the file header, the per-record header, and a
//! [`Capture`] that accumulates a whole file in memory. Writing the bytes anywhere is the
//! caller's business (this crate does no I/O); a packet trace writes [`FileHeaderRepr`] once
//! and then a [`RecordHeaderRepr`] and the frame for each packet.
//!
//! We write little-endian files with microsecond timestamps (magic 0xa1b2c3d4, version 2.4);
//! the parsers also read big-endian and nanosecond files.

use core::time::Duration;

use crate::error::{check_len, Error};

/// Byte ranges of the pcap file header.
pub(crate) mod field {
    use core::ops::Range;
    pub const MAGIC_NUMBER: Range<usize> = 0..4;
    pub const VERSION_MAJOR: Range<usize> = 4..6;
    pub const VERSION_MINOR: Range<usize> = 6..8;
    pub const THISZONE: Range<usize> = 8..12;
    pub const SIGFIGS: Range<usize> = 12..16;
    pub const SNAPLEN: Range<usize> = 16..20;
    pub const NETWORK: Range<usize> = 20..24;
}

/// Byte ranges of the pcap record header.
pub(crate) mod record_field {
    use core::ops::Range;
    pub const TS_SEC: Range<usize> = 0..4;
    pub const TS_FRAC: Range<usize> = 4..8;
    pub const INCL_LEN: Range<usize> = 8..12;
    pub const ORIG_LEN: Range<usize> = 12..16;
}

/// Length of the file header.
pub const FILE_HEADER_LEN: usize = 24;
/// Length of a record header.
pub const RECORD_HEADER_LEN: usize = 16;
/// The magic number of a microsecond-resolution file.
pub const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
/// The magic number of a nanosecond-resolution file.
pub const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// `LINKTYPE_ETHERNET`.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// The snapshot length we write: large enough for any frame.
pub const DEFAULT_SNAPLEN: u32 = 65_535;

const LAYOUT: &str = "pcap file header";

/// The byte order a file was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    /// Little-endian (what we write).
    Little,
    /// Big-endian.
    Big,
}

impl ByteOrder {
    fn u16(self, s: &[u8]) -> u16 {
        let b = [s[0], s[1]];
        match self {
            ByteOrder::Little => u16::from_le_bytes(b),
            ByteOrder::Big => u16::from_be_bytes(b),
        }
    }

    fn u32(self, s: &[u8]) -> u32 {
        let b = [s[0], s[1], s[2], s[3]];
        match self {
            ByteOrder::Little => u32::from_le_bytes(b),
            ByteOrder::Big => u32::from_be_bytes(b),
        }
    }
}

/// The timestamp resolution of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// Microseconds (what we write).
    Micros,
    /// Nanoseconds.
    Nanos,
}

/// A parsed pcap file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileHeaderRepr {
    /// The byte order of every multi-byte field in the file.
    pub byte_order: ByteOrder,
    /// The timestamp resolution.
    pub resolution: Resolution,
    /// The format version (2, 4).
    pub version: (u16, u16),
    /// The snapshot length: the most bytes of a frame a record holds.
    pub snaplen: u32,
    /// The link type of every record (`LINKTYPE_ETHERNET` for ours).
    pub linktype: u32,
}

impl FileHeaderRepr {
    /// The header we write: little-endian, microseconds, version 2.4, Ethernet.
    pub const fn ethernet() -> Self {
        FileHeaderRepr {
            byte_order: ByteOrder::Little,
            resolution: Resolution::Micros,
            version: (2, 4),
            snaplen: DEFAULT_SNAPLEN,
            linktype: LINKTYPE_ETHERNET,
        }
    }

    /// Parses a file header of either byte order and resolution.
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        check_len(LAYOUT, bytes, FILE_HEADER_LEN)?;
        let magic = &bytes[field::MAGIC_NUMBER];
        let (byte_order, resolution) = [ByteOrder::Little, ByteOrder::Big]
            .into_iter()
            .find_map(|order| match order.u32(magic) {
                MAGIC_MICROS => Some((order, Resolution::Micros)),
                MAGIC_NANOS => Some((order, Resolution::Nanos)),
                _ => None,
            })
            .ok_or(Error::BadField {
                layout: LAYOUT,
                field: "magic_number",
                value: u64::from(ByteOrder::Little.u32(magic)),
                expected: "0xa1b2c3d4 or 0xa1b23c4d in either byte order",
            })?;
        Ok(FileHeaderRepr {
            byte_order,
            resolution,
            version: (
                byte_order.u16(&bytes[field::VERSION_MAJOR]),
                byte_order.u16(&bytes[field::VERSION_MINOR]),
            ),
            snaplen: byte_order.u32(&bytes[field::SNAPLEN]),
            linktype: byte_order.u32(&bytes[field::NETWORK]),
        })
    }

    /// The 24 header bytes.
    pub fn to_bytes(&self) -> [u8; FILE_HEADER_LEN] {
        let magic = match self.resolution {
            Resolution::Micros => MAGIC_MICROS,
            Resolution::Nanos => MAGIC_NANOS,
        };
        let mut b = [0u8; FILE_HEADER_LEN];
        let order = self.byte_order;
        let u16b = |v: u16| match order {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        };
        let u32b = |v: u32| match order {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        };
        b[field::MAGIC_NUMBER].copy_from_slice(&u32b(magic));
        b[field::VERSION_MAJOR].copy_from_slice(&u16b(self.version.0));
        b[field::VERSION_MINOR].copy_from_slice(&u16b(self.version.1));
        b[field::THISZONE].copy_from_slice(&u32b(0));
        b[field::SIGFIGS].copy_from_slice(&u32b(0));
        b[field::SNAPLEN].copy_from_slice(&u32b(self.snaplen));
        b[field::NETWORK].copy_from_slice(&u32b(self.linktype));
        b
    }
}

/// A parsed record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordHeaderRepr {
    /// Seconds of the timestamp.
    pub ts_sec: u32,
    /// The sub-second part, in the file's resolution.
    pub ts_frac: u32,
    /// Bytes of the frame the record holds.
    pub incl_len: u32,
    /// Bytes the frame had on the wire.
    pub orig_len: u32,
}

impl RecordHeaderRepr {
    /// The header of a record holding a frame of `frame_len` bytes, cut to `snaplen`, taken at
    /// `timestamp` (since the Unix epoch, or since the start of a trace), in microseconds.
    pub fn for_frame(timestamp: Duration, frame_len: usize, snaplen: u32) -> Self {
        let orig_len = u32::try_from(frame_len).unwrap_or(u32::MAX);
        RecordHeaderRepr {
            ts_sec: u32::try_from(timestamp.as_secs()).unwrap_or(u32::MAX),
            ts_frac: timestamp.subsec_micros(),
            incl_len: orig_len.min(snaplen),
            orig_len,
        }
    }

    /// Parses a record header in the file's byte order.
    pub fn parse(bytes: &[u8], byte_order: ByteOrder) -> Result<Self, Error> {
        check_len("pcap record header", bytes, RECORD_HEADER_LEN)?;
        Ok(RecordHeaderRepr {
            ts_sec: byte_order.u32(&bytes[record_field::TS_SEC]),
            ts_frac: byte_order.u32(&bytes[record_field::TS_FRAC]),
            incl_len: byte_order.u32(&bytes[record_field::INCL_LEN]),
            orig_len: byte_order.u32(&bytes[record_field::ORIG_LEN]),
        })
    }

    /// The 16 header bytes, little-endian.
    pub fn to_bytes(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut b = [0u8; RECORD_HEADER_LEN];
        b[record_field::TS_SEC].copy_from_slice(&self.ts_sec.to_le_bytes());
        b[record_field::TS_FRAC].copy_from_slice(&self.ts_frac.to_le_bytes());
        b[record_field::INCL_LEN].copy_from_slice(&self.incl_len.to_le_bytes());
        b[record_field::ORIG_LEN].copy_from_slice(&self.orig_len.to_le_bytes());
        b
    }
}

/// A whole pcap file of Ethernet frames, built in memory.
#[derive(Debug, Clone)]
pub struct Capture {
    header: FileHeaderRepr,
    bytes: Vec<u8>,
}

impl Default for Capture {
    fn default() -> Self {
        Self::new()
    }
}

impl Capture {
    /// An empty Ethernet capture (the file header only).
    pub fn new() -> Self {
        let header = FileHeaderRepr::ethernet();
        Capture {
            header,
            bytes: header.to_bytes().to_vec(),
        }
    }

    /// Appends a record holding `frame` (cut to the snapshot length) taken at `timestamp`.
    pub fn push(&mut self, timestamp: Duration, frame: &[u8]) {
        let record = RecordHeaderRepr::for_frame(timestamp, frame.len(), self.header.snaplen);
        self.bytes.extend_from_slice(&record.to_bytes());
        self.bytes
            .extend_from_slice(&frame[..record.incl_len as usize]);
    }

    /// The file's bytes so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The file's bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// Iterates over the records of a pcap file: yields each record header and its frame bytes,
/// or the error that stopped the walk.
pub fn records(file: &[u8]) -> Result<Records<'_>, Error> {
    let header = FileHeaderRepr::parse(file)?;
    Ok(Records {
        byte_order: header.byte_order,
        rest: &file[FILE_HEADER_LEN..],
    })
}

/// The records of a pcap file; see [`records`].
#[derive(Debug, Clone)]
pub struct Records<'a> {
    byte_order: ByteOrder,
    rest: &'a [u8],
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(RecordHeaderRepr, &'a [u8]), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let header = match RecordHeaderRepr::parse(self.rest, self.byte_order) {
            Ok(header) => header,
            Err(e) => {
                self.rest = &[];
                return Some(Err(e));
            }
        };
        let body = &self.rest[RECORD_HEADER_LEN..];
        let len = header.incl_len as usize;
        if body.len() < len {
            self.rest = &[];
            return Some(Err(Error::LengthMismatch {
                layout: "pcap record",
                field: "incl_len",
                stated: len,
                actual: body.len(),
            }));
        }
        self.rest = &body[len..];
        Some(Ok((header, &body[..len])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_header_bytes_are_little_endian_2_4_ethernet() {
        assert_eq!(
            FileHeaderRepr::ethernet().to_bytes(),
            [
                0xd4, 0xc3, 0xb2, 0xa1, // magic
                0x02, 0x00, 0x04, 0x00, // version 2.4
                0, 0, 0, 0, 0, 0, 0, 0, // thiszone, sigfigs
                0xff, 0xff, 0x00, 0x00, // snaplen 65535
                0x01, 0x00, 0x00, 0x00, // Ethernet
            ]
        );
    }

    #[test]
    fn file_headers_of_both_orders_and_resolutions_parse() {
        for header in [
            FileHeaderRepr::ethernet(),
            FileHeaderRepr {
                byte_order: ByteOrder::Big,
                resolution: Resolution::Nanos,
                ..FileHeaderRepr::ethernet()
            },
        ] {
            assert_eq!(FileHeaderRepr::parse(&header.to_bytes()), Ok(header));
        }
    }

    #[test]
    fn a_bad_magic_is_refused() {
        let mut bytes = FileHeaderRepr::ethernet().to_bytes();
        bytes[0] = 0;
        assert!(matches!(
            FileHeaderRepr::parse(&bytes),
            Err(Error::BadField {
                field: "magic_number",
                ..
            })
        ));
    }

    #[test]
    fn record_header_carries_the_timestamp_and_both_lengths() {
        let record = RecordHeaderRepr::for_frame(Duration::new(3, 250_000_000), 70_000, 65_535);
        assert_eq!(
            record,
            RecordHeaderRepr {
                ts_sec: 3,
                ts_frac: 250_000,
                incl_len: 65_535,
                orig_len: 70_000
            }
        );
        assert_eq!(
            RecordHeaderRepr::parse(&record.to_bytes(), ByteOrder::Little),
            Ok(record)
        );
    }

    #[test]
    fn a_capture_reads_back_its_records() {
        let mut capture = Capture::new();
        capture.push(Duration::from_micros(1), &[1, 2, 3]);
        capture.push(Duration::from_micros(2), &[4; 70]);
        let bytes = capture.into_bytes();
        assert_eq!(bytes.len(), 24 + 16 + 3 + 16 + 70);
        let got: Vec<_> = records(&bytes).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].1, &[1, 2, 3]);
        assert_eq!(got[1].0.ts_frac, 2);
        assert_eq!(got[1].1.len(), 70);
    }

    #[test]
    fn a_record_cut_short_is_an_error_not_a_panic() {
        let mut capture = Capture::new();
        capture.push(Duration::ZERO, &[9; 10]);
        let bytes = capture.into_bytes();
        let mut walk = records(&bytes[..bytes.len() - 1]).unwrap();
        assert!(matches!(
            walk.next(),
            Some(Err(Error::LengthMismatch { .. }))
        ));
        assert!(walk.next().is_none());
    }
}
