//! The fault channel through the shim: with `RAILSHIFT_FAULT_FIFO=PATH`, a line written to that
//! FIFO (`qps-failed <pmd device>`, `device-dead <pmd device>`: the apps' `--fault-fifo`
//! contract, `docs/apps-json.md` "Fault channel") makes the named device of this process fail
//! in a way `ip link` cannot, so that tests can fail a device's QPs under an unmodified
//! program. Unset (the default): no channel, no thread, no FIFO.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use pmd::faults::FaultChannel;

use crate::config::FAULT_FIFO_VAR;

/// The process's channel, opened at the first device open when the variable is set.
fn channel() -> Option<&'static FaultChannel> {
    static CHANNEL: OnceLock<Option<FaultChannel>> = OnceLock::new();
    CHANNEL
        .get_or_init(|| {
            let path = std::env::var_os(FAULT_FIFO_VAR).filter(|p| !p.is_empty())?;
            FaultChannel::open(Path::new(&path))
                .map_err(|e| tracing::error!("railshift verbs: {FAULT_FIFO_VAR}: {e}"))
                .ok()
        })
        .as_ref()
}

/// Makes the pmd device opened as `name` (`soft:lo@127.0.0.1`) reachable by the channel's
/// commands, when there is a channel. The channel then holds the device for the rest of the
/// process.
pub fn register(name: &str, ctx: &Arc<pmd::Context>) {
    if let Some(c) = channel() {
        c.register(name, ctx);
    }
}
