//! Running code inside a network namespace from this process.
//!
//! `setns(2)` changes the namespace of the calling thread only, so the closure runs on a fresh
//! thread that enters the namespace first; sockets it creates belong to that namespace for
//! their whole life, even after they are handed back to another thread.

use std::fs::File;
use std::path::PathBuf;

use nix::sched::{setns, CloneFlags};

/// Why code could not be run inside a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace file could not be opened.
    #[error("cannot open network namespace {name:?} ({path}): {source}")]
    Open {
        /// The namespace.
        name: String,
        /// Its bind-mount path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// `setns` failed.
    #[error("cannot enter network namespace {name:?}: {source}")]
    Enter {
        /// The namespace.
        name: String,
        /// The error.
        source: nix::Error,
    },
    /// The thread running the closure panicked.
    #[error("the thread running inside namespace {0:?} panicked")]
    Panicked(String),
}

/// Spawns a thread that enters namespace `name` and runs `f`; returns its join handle.
pub fn spawn_in<T, F>(name: &str, f: F) -> std::thread::JoinHandle<Result<T, NetnsError>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let name = name.to_owned();
    std::thread::spawn(move || {
        enter(&name)?;
        Ok(f())
    })
}

/// Runs `f` inside namespace `name` on a helper thread and waits for it.
pub fn run_in<T, F>(name: &str, f: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    spawn_in(name, f)
        .join()
        .map_err(|_| NetnsError::Panicked(name.to_owned()))?
}

/// Moves the calling thread into namespace `name`.
fn enter(name: &str) -> Result<(), NetnsError> {
    let path = PathBuf::from("/var/run/netns").join(name);
    let file = File::open(&path).map_err(|source| NetnsError::Open {
        name: name.to_owned(),
        path: path.clone(),
        source,
    })?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
        name: name.to_owned(),
        source,
    })
}
