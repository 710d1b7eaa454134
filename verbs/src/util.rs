//! errno, the once-per-verb refusal line, and the log set-up of a library loaded into a C
//! program.

use std::collections::HashSet;
use std::ffi::c_int;
use std::sync::{Mutex, OnceLock};

/// Sets the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Installs a stderr log subscriber once (level from `RAILSHIFT_LOG`, default `warn`): the
/// host program is C and installs none.
pub fn init_logging() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("RAILSHIFT_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(false)
            .try_init();
    });
}

/// A verb the shim does not implement on its devices: logs one line per verb per process,
/// sets `errno` and returns it (providers answer `EOPNOTSUPP` for what the device lacks).
pub fn refuse(verb: &'static str, why: &str, errno: c_int) -> c_int {
    static SAID: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said.get_or_insert_with(HashSet::new).insert(verb) {
        init_logging();
        tracing::warn!(verb, errno, "railshift verbs: {verb} refused: {why}");
    }
    set_errno(errno);
    errno
}

/// A caller error on one of our objects: logs what was wrong (each time: the caller asked),
/// sets `errno` and returns it.
pub fn invalid(verb: &'static str, why: &str, errno: c_int) -> c_int {
    init_logging();
    tracing::warn!(verb, errno, "railshift verbs: {verb}: {why}");
    set_errno(errno);
    errno
}
