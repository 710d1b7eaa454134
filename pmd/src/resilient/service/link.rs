//! The link watch: where the service lcore learns that a device's link went down or came up.
//!
//! Softnic devices report port events through the provider (the softnic's own rtnetlink
//! monitor raises them for a UDP device, the fabric's link rules for a fabric device). A
//! ConnectX's link is its netdev's: the watch reads rtnetlink for that netdev directly (found
//! in sysfs under the ibdev, or named in the configuration) through [`crate::netdev_watch`],
//! which every feature set has.

use std::os::fd::RawFd;
use std::sync::Arc;

use crate::control::Context;
use crate::name::DeviceName;
use crate::netdev_watch::{LinkState, NetdevWatch};
use crate::provider::PortEvent;

use crate::resilient::config::LinkSource;

/// What the watch saw of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkChange {
    /// The link came up.
    Up,
    /// The link went down.
    Down,
    /// The device raised its device-fatal event: it is dead for good (its link, as far as
    /// failover is concerned, is down and never comes back).
    DeviceFatal,
}

/// One device's link watch.
pub(crate) struct LinkWatch {
    pub ctx: Arc<Context>,
    source: Source,
}

enum Source {
    Provider,
    /// A netdev's link through rtnetlink (a ConnectX's, or one the configuration names).
    Netdev(NetdevWatch),
    Off,
}

/// The netdev of an mlx5 verbs device, from sysfs.
fn mlx5_netdev(ibdev: &str) -> Option<String> {
    let dir = format!("/sys/class/infiniband/{ibdev}/device/net");
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .min()
}

impl LinkWatch {
    /// The watch of `ctx`'s link from `source`; a source that cannot be opened is logged and
    /// the device goes unwatched (failover still happens on retry exhaustion).
    pub fn new(ctx: &Arc<Context>, source: &LinkSource) -> LinkWatch {
        let netdev = match source {
            LinkSource::Off => None,
            LinkSource::Netdev(name) => Some(name.clone()),
            LinkSource::Auto => match ctx.name().parse::<DeviceName>() {
                Ok(DeviceName::Mlx5 { ibdev }) => match mlx5_netdev(&ibdev) {
                    Some(n) => Some(n),
                    None => {
                        tracing::warn!(device = %ctx.name(), "link watch: no netdev found for this device in sysfs; its link is not watched");
                        None
                    }
                },
                _ => {
                    return LinkWatch {
                        ctx: ctx.clone(),
                        source: Source::Provider,
                    }
                }
            },
        };
        let source = match netdev {
            None => Source::Off,
            Some(name) => Self::netdev(ctx, name),
        };
        LinkWatch {
            ctx: ctx.clone(),
            source,
        }
    }

    fn netdev(ctx: &Arc<Context>, name: String) -> Source {
        match NetdevWatch::open(&name) {
            Ok(watch) => {
                tracing::debug!(device = %ctx.name(), netdev = %name, up = watch.state().is_up(), "link watch: rtnetlink");
                Source::Netdev(watch)
            }
            Err(e) => {
                tracing::warn!(device = %ctx.name(), netdev = %name, error = %e, "link watch: cannot watch the netdev; its link is not watched");
                Source::Off
            }
        }
    }

    /// The link changes since the last call, oldest first.
    pub fn poll(&mut self, out: &mut Vec<LinkChange>) {
        match &mut self.source {
            Source::Provider => {
                while let Some(e) = self.ctx.poll_port_event() {
                    out.push(match e {
                        PortEvent::Active => LinkChange::Up,
                        PortEvent::Down => LinkChange::Down,
                        PortEvent::DeviceFatal => LinkChange::DeviceFatal,
                    });
                }
            }
            Source::Netdev(watch) => {
                if let Some(state) = watch.poll() {
                    tracing::debug!(netdev = %watch.netdev(), up = state.is_up(), "link watch: netdev changed");
                    out.push(match state {
                        LinkState::Up => LinkChange::Up,
                        LinkState::Down => LinkChange::Down,
                    });
                }
                // The link is the netdev's; the device's own events still say if it died.
                while let Some(e) = self.ctx.poll_port_event() {
                    if e == PortEvent::DeviceFatal {
                        out.push(LinkChange::DeviceFatal);
                    }
                }
            }
            Source::Off => {}
        }
    }

    /// The descriptors that become readable when a change may be waiting (a netdev's
    /// watch also wakes for the device's own events: a device-fatal event).
    pub fn fds(&self, out: &mut Vec<RawFd>) {
        match &self.source {
            Source::Provider => out.extend(self.ctx.port_event_fd()),
            Source::Netdev(watch) => {
                out.push(watch.fd());
                out.extend(self.ctx.port_event_fd());
            }
            Source::Off => {}
        }
    }
}
