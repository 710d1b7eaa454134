//! Optional pcap trace of every packet sent and received (TEMPORARY until hw-defs' pcap lands).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

/// A pcap trace.
pub(crate) struct Trace;

impl Trace {
    pub fn create(_path: &Path) -> std::io::Result<Trace> {
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "pcap not yet available"))
    }
    pub fn record(&mut self, _src: IpAddr, _src_port: u16, _dst: IpAddr, _dst_port: u16, _bytes: &[u8], _now: Duration) {}
    pub fn flush(&mut self) {}
}
