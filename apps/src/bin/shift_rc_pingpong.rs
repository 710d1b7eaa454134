//! `shift_rc_pingpong`: `ibv_rc_pingpong` on railshift; see `apps/src/rc_pingpong.rs`.

fn main() -> std::process::ExitCode {
    apps::rc_pingpong::main()
}
