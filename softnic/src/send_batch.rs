//! Sending a batch of prepared messages on a socket with `sendmmsg`: the UDP sockets' and the
//! packet socket's send paths share it.

use std::io;
use std::os::fd::RawFd;

/// Sends every message of `hdrs` on `fd` with `sendmmsg`, as many per call as the kernel
/// takes; a full socket buffer is waited on briefly (poll for POLLOUT, up to 100 x 1 ms)
/// rather than dropping, and a message the kernel refuses (`ENETDOWN`, `EMSGSIZE`) is dropped
/// alone, for the transport to retransmit. Returns how many the kernel took.
pub(crate) fn send_all(fd: RawFd, hdrs: &mut [libc::mmsghdr]) -> usize {
    let end = hdrs.len();
    let mut sent = 0;
    let mut at = 0;
    let mut stalls = 0;
    while at < end {
        // SAFETY: hdrs[at..] point at live names, iovecs and packet buffers.
        let n = unsafe { libc::sendmmsg(fd, hdrs[at..].as_mut_ptr(), (end - at) as u32, 0) };
        if n > 0 {
            at += n as usize;
            sent += n as usize;
            continue;
        }
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::WouldBlock && stalls < 100 {
            // The socket buffer is full: wait for room briefly instead of dropping.
            stalls += 1;
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 1) };
            continue;
        }
        if err.kind() != io::ErrorKind::WouldBlock {
            tracing::debug!(error = %err, "sendmmsg failed; dropping the packet");
        }
        at += 1;
    }
    sent
}
