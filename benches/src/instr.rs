//! Counting instructions: a benchmark re-runs itself under callgrind with collection switched
//! on only inside one function, and reads the total back.
//!
//! Instruction counts do not depend on what else the machine runs, so they are what the
//! datapath benchmark sets its goals in (`post_instr`, `poll_instr`) beside the nanoseconds.
//! Hardware counters (`perf stat -e instructions:u`) would be faster, but virtual machines
//! often have no PMU (this development VM answers `<not supported>`); callgrind works
//! everywhere valgrind does and counts exactly the code asked for.

use std::path::Path;
use std::process::Command;

/// The instructions callgrind counted in a child run, and what that run said it did there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Counted {
    /// Instructions executed inside the collected function (inclusive of what it calls).
    pub instructions: u64,
    /// Operations the child reported doing inside it (`ops N` on its standard output).
    pub ops: u64,
}

impl Counted {
    /// Instructions per operation.
    pub fn per_op(&self) -> f64 {
        self.instructions as f64 / self.ops as f64
    }
}

/// Whether `valgrind` can be run, or why not.
pub fn valgrind_available() -> Result<(), String> {
    match Command::new("valgrind").arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`valgrind --version` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!(
            "cannot run valgrind ({e}); install it (Debian: apt-get install valgrind)"
        )),
    }
}

/// Runs `exe args` under callgrind collecting only inside functions whose demangled name
/// matches `toggle` (callgrind's `--toggle-collect` pattern, `*` a wildcard). The child must
/// print a line `ops N` saying how many operations it did inside them.
pub fn count(exe: &Path, args: &[&str], toggle: &str) -> Result<Counted, String> {
    let dir = std::env::temp_dir().join(format!("railshift-instr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let out_file = dir.join(format!("callgrind.{}.out", args.join("-")));
    let run = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(format!("--toggle-collect={toggle}"))
        .arg(exe)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run valgrind: {e}"))?;
    let text = std::fs::read_to_string(&out_file);
    std::fs::remove_dir_all(&dir).ok();
    if !run.status.success() {
        return Err(format!(
            "`valgrind {} {}` failed ({}): {}",
            exe.display(),
            args.join(" "),
            run.status,
            String::from_utf8_lossy(&run.stderr)
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .join(" / ")
        ));
    }
    let text = text.map_err(|e| format!("callgrind wrote no {}: {e}", out_file.display()))?;
    let instructions = totals(&text)?;
    let stdout = String::from_utf8_lossy(&run.stdout);
    let ops = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ops "))
        .ok_or_else(|| format!("the child printed no `ops N` line: {stdout:?}"))?
        .trim()
        .parse::<u64>()
        .map_err(|e| format!("the child's ops line: {e}"))?;
    if ops == 0 {
        return Err("the child did no operations in the collected function".into());
    }
    Ok(Counted { instructions, ops })
}

/// The `totals:` (or, in older files, `summary:`) line of a callgrind output file: the first
/// event, which is `Ir` (instructions) unless other events were asked for.
fn totals(text: &str) -> Result<u64, String> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or("no totals line in callgrind's output")?
        .parse()
        .map_err(|e| format!("callgrind's totals line: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_totals_line_gives_the_instruction_count() {
        let file = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\n\nfn=(1) main\n3 10\n\
                    totals: 123456\n";
        assert_eq!(totals(file), Ok(123_456));
        assert_eq!(totals("events: Ir\nsummary: 77\n"), Ok(77));
        assert!(totals("events: Ir\n").is_err());
    }

    #[test]
    fn per_op_divides() {
        let c = Counted {
            instructions: 3200,
            ops: 64,
        };
        assert_eq!(c.per_op(), 50.0);
    }
}
