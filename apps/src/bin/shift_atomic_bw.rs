//! `shift_atomic_bw`: see `docs/apps.md`.

fn main() -> std::process::ExitCode {
    apps::run::main(apps::Tool::AtomicBw)
}
