//! `shift_write_lat`: see `docs/apps.md`.

fn main() -> std::process::ExitCode {
    apps::run::main(apps::Tool::WriteLat)
}
