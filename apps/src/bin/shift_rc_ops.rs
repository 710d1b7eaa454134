//! `shift_rc_ops`: every RC opcode against `rc_ops` on another RoCE stack; see
//! `apps/src/rc_ops.rs`.

fn main() -> std::process::ExitCode {
    apps::rc_ops::main()
}
