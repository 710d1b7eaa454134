//! `shift_allreduce`: see `docs/apps.md`.

fn main() -> std::process::ExitCode {
    apps::run::main(apps::Tool::Allreduce)
}
