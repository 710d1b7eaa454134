//! Running iproute2's `ip` and reading what the kernel says about namespaces.
//!
//! The testbed drives the kernel through `ip` rather than raw netlink so that every action it
//! takes is a command a person can paste into a shell to reproduce it. One exception: the
//! link changes of a failure schedule go out as rtnetlink requests, because spawning `ip`
//! delayed them by milliseconds on a busy machine (`crate::fail`); the debug log still names
//! the `ip` command each one stands for.

use std::process::Command;

/// A failed `ip` invocation, with the command line and what `ip` printed.
#[derive(Debug, thiserror::Error)]
pub enum IpError {
    /// `ip` could not be started at all.
    #[error("cannot run `ip` (is iproute2 installed?): {0}")]
    Spawn(#[source] std::io::Error),
    /// `ip` ran and failed.
    #[error("`ip {args}` failed: {stderr}")]
    Failed {
        /// The arguments, joined by spaces.
        args: String,
        /// `ip`'s standard error, trimmed.
        stderr: String,
    },
}

/// Runs `ip` with `args` and returns its standard output.
pub fn ip<S: AsRef<str>>(args: &[S]) -> Result<String, IpError> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    tracing::debug!(command = %format!("ip {}", args.join(" ")), "running");
    let out = Command::new("ip")
        .args(&args)
        .output()
        .map_err(IpError::Spawn)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(IpError::Failed {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Runs `ip -n <ns> ...`.
pub fn ip_in(ns: &str, args: &[&str]) -> Result<String, IpError> {
    let mut full = vec!["-n", ns];
    full.extend_from_slice(args);
    ip(&full)
}

/// The network namespaces that exist now, by name.
pub fn list_namespaces() -> Result<Vec<String>, IpError> {
    let out = ip(&["netns", "list"])?;
    // Lines look like `name (id: 3)` or just `name`.
    Ok(out
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// Process ids running in namespace `ns`.
pub fn namespace_pids(ns: &str) -> Result<Vec<i32>, IpError> {
    let out = ip(&["netns", "pids", ns])?;
    Ok(out
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect())
}

/// Whether this process runs as root, which every namespace operation needs.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
