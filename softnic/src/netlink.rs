//! The link monitor: an rtnetlink socket subscribed to link changes, and the interface flags
//! that make a netdev's link state the port state (IFF_UP and IFF_RUNNING and IFF_LOWER_UP).
//!
//! Public because the pmd's link watch uses it for netdevs of devices that are not softnics
//! (a ConnectX's netdev): one rtnetlink reader, not two.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::wire::PortState;

const IFF_LOWER_UP: u32 = 0x1_0000;

/// Port state from a netdev's flags.
pub(crate) fn state_from_flags(flags: u32) -> PortState {
    let up = flags & libc::IFF_UP as u32 != 0;
    let running = flags & libc::IFF_RUNNING as u32 != 0;
    let lower_up = flags & IFF_LOWER_UP != 0;
    if up && running && lower_up {
        PortState::Active
    } else {
        PortState::Down
    }
}

/// The interface index of `netdev`, or an error naming it.
pub fn ifindex(netdev: &str) -> io::Result<u32> {
    let name = CString::new(netdev)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "netdev name has a NUL"))?;
    // SAFETY: a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if idx == 0 {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no netdev named {netdev}"),
        ))
    } else {
        Ok(idx)
    }
}

/// The netdev's state now, from SIOCGIFFLAGS (which lacks IFF_LOWER_UP; IFF_RUNNING stands in).
pub fn query_state(netdev: &str) -> io::Result<PortState> {
    // SAFETY: plain syscall; the fd is checked and owned.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = netdev.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "netdev name too long",
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes ifru_flags of a live ifreq.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel filled ifru_flags.
    let flags = unsafe { req.ifr_ifru.ifru_flags } as u16 as u32;
    let running = flags & libc::IFF_RUNNING as u32 != 0;
    Ok(state_from_flags(
        flags | if running { IFF_LOWER_UP } else { 0 },
    ))
}

/// An rtnetlink socket subscribed to RTMGRP_LINK, filtered to one interface.
#[derive(Debug)]
pub struct LinkMonitor {
    fd: OwnedFd,
    ifindex: u32,
    buf: Vec<u8>,
}

impl LinkMonitor {
    /// A socket reporting link changes of the interface with index `ifindex` (see
    /// [`ifindex`]).
    pub fn new(ifindex: u32) -> io::Result<LinkMonitor> {
        // SAFETY: plain syscall; the fd is checked and owned.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain data.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: a valid sockaddr_nl of the size passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(LinkMonitor {
            fd,
            ifindex,
            buf: vec![0u8; 16384],
        })
    }

    /// Reads every pending message; returns the latest state of our interface, if reported.
    pub fn poll(&mut self) -> Option<PortState> {
        let mut latest = None;
        loop {
            // SAFETY: reads into a live buffer of the given length; nonblocking.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    0,
                )
            };
            if n <= 0 {
                return latest;
            }
            if let Some(s) = parse_link_messages(&self.buf[..n as usize], self.ifindex) {
                latest = Some(s);
            }
        }
    }

    /// The socket, readable when link messages are waiting (for poll/epoll).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Walks netlink messages; returns the state from the last RTM_NEWLINK/RTM_DELLINK for
/// `ifindex`. Truncated or malformed messages end the walk.
pub(crate) fn parse_link_messages(mut buf: &[u8], ifindex: u32) -> Option<PortState> {
    let mut latest = None;
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes(buf[0..4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(buf[4..6].try_into().ok()?);
        if len < 16 || len > buf.len() {
            break;
        }
        let body = &buf[16..len];
        if (kind == libc::RTM_NEWLINK || kind == libc::RTM_DELLINK) && body.len() >= 16 {
            let index = i32::from_ne_bytes(body[4..8].try_into().ok()?);
            let flags = u32::from_ne_bytes(body[8..12].try_into().ok()?);
            if index as u32 == ifindex {
                latest = Some(if kind == libc::RTM_DELLINK {
                    PortState::Down
                } else {
                    state_from_flags(flags)
                });
            }
        }
        let aligned = (len + 3) & !3;
        if aligned >= buf.len() {
            break;
        }
        buf = &buf[aligned..];
    }
    latest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn newlink(index: i32, flags: u32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&32u32.to_ne_bytes());
        m.extend_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend_from_slice(&[0u8; 4]); // family, pad, type
        m.extend_from_slice(&index.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m
    }

    #[test]
    fn the_last_message_for_our_interface_wins() {
        let up = libc::IFF_UP as u32 | libc::IFF_RUNNING as u32 | IFF_LOWER_UP;
        let mut buf = newlink(3, up);
        buf.extend(newlink(4, 0));
        buf.extend(newlink(3, libc::IFF_UP as u32));
        assert_eq!(parse_link_messages(&buf, 3), Some(PortState::Down));
        assert_eq!(parse_link_messages(&buf[..32], 3), Some(PortState::Active));
        assert_eq!(parse_link_messages(&buf, 9), None);
    }

    #[test]
    fn truncated_messages_are_ignored_without_panic() {
        let buf = newlink(3, 0);
        for cut in 0..buf.len() {
            let _ = parse_link_messages(&buf[..cut], 3);
        }
        let mut bad = buf.clone();
        bad[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert_eq!(parse_link_messages(&bad, 3), None);
    }
}
