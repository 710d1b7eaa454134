//! The mlx5 layouts checked against rdma-core: compiles a C program against Debian's
//! `libibverbs-dev` headers (`infiniband/mlx5dv.h`, `infiniband/verbs.h`) that prints the size
//! and field offsets of every struct `hw_defs::mlx5::abi` mirrors and the value of every
//! constant, and compares them with ours.
//!
//! Runs with `cargo test -p hw-defs --features rdma-core-check --test rdma_core`; needs a C
//! compiler (`$CC`, else `cc`) and `libibverbs-dev` (`tools/test` installs it).
#![cfg(feature = "rdma-core-check")]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use hw_defs::mlx5::abi;

/// The rdma-core structs hw-defs mirrors; the table must hold each of them.
const REQUIRED_STRUCTS: &[&str] = &[
    "mlx5_wqe_ctrl_seg",
    "mlx5_wqe_raddr_seg",
    "mlx5_wqe_atomic_seg",
    "mlx5_wqe_data_seg",
    "mlx5_wqe_datagram_seg",
    "mlx5_wqe_srq_next_seg",
    "mlx5_wqe_inl_data_seg",
    "mlx5_cqe64",
    "mlx5_err_cqe",
];

fn c_program() -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\
         #include <infiniband/mlx5dv.h>\n\
         #define SIZE(s) printf(\"size %s %zu\\n\", #s, sizeof(struct s));\n\
         #define FIELD(s, f) printf(\"field %s.%s %zu %zu\\n\", #s, #f, \
         offsetof(struct s, f), sizeof(((struct s *)0)->f));\n\
         #define CONST(c) printf(\"const %s %llu\\n\", #c, (unsigned long long)(c));\n\
         int main(void) {\n",
    );
    for s in abi::STRUCTS {
        writeln!(c, "SIZE({})", s.c_name).unwrap();
        for f in s.fields {
            writeln!(c, "FIELD({}, {})", s.c_name, f.name).unwrap();
        }
    }
    for (name, _) in abi::constants() {
        writeln!(c, "CONST({name})").unwrap();
    }
    c.push_str("return 0;\n}\n");
    c
}

/// The program's output lines as "kind name" -> numbers. Compiled and run once per process:
/// the tests run in parallel and would otherwise race on one temporary directory.
fn rdma_core_values() -> BTreeMap<String, Vec<u64>> {
    static VALUES: std::sync::OnceLock<BTreeMap<String, Vec<u64>>> = std::sync::OnceLock::new();
    VALUES.get_or_init(compile_and_run).clone()
}

/// Compiles and runs the program; returns its output lines as "kind name" -> numbers.
fn compile_and_run() -> BTreeMap<String, Vec<u64>> {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("hw-defs-rdma-core-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("layouts.c");
    let binary = dir.join("layouts");
    std::fs::write(&source, c_program()).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let compiled = Command::new(&cc)
        .arg("-std=gnu11")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(
        compiled.status.success(),
        "compiling against infiniband/mlx5dv.h failed (is libibverbs-dev installed?):\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = Command::new(&binary).output().unwrap();
    assert!(run.status.success());
    std::fs::remove_dir_all(&dir).ok();
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let mut words = line.split_whitespace();
            let kind = words.next().unwrap();
            let name = words.next().unwrap();
            let numbers = words.map(|w| w.parse().unwrap()).collect();
            (format!("{kind} {name}"), numbers)
        })
        .collect()
}

#[test]
fn every_required_struct_is_mirrored() {
    for name in REQUIRED_STRUCTS {
        assert!(
            abi::STRUCTS.iter().any(|s| s.c_name == *name),
            "struct {name} is not in hw_defs::mlx5::abi::STRUCTS"
        );
    }
}

#[test]
fn struct_sizes_and_field_offsets_match_mlx5dv_h() {
    let c = rdma_core_values();
    let mut mismatches = Vec::new();
    let mut checked = 0;
    for s in abi::STRUCTS {
        let want = vec![s.size as u64];
        if c[&format!("size {}", s.c_name)] != want {
            mismatches.push(format!(
                "sizeof(struct {}): ours {}, mlx5dv.h {:?}",
                s.c_name,
                s.size,
                c[&format!("size {}", s.c_name)]
            ));
        }
        for f in s.fields {
            let key = format!("field {}.{}", s.c_name, f.name);
            let ours = vec![f.offset as u64, f.size as u64];
            if c[&key] != ours {
                mismatches.push(format!(
                    "{}.{}: ours offset {} size {}, mlx5dv.h offset {} size {}",
                    s.c_name, f.name, f.offset, f.size, c[&key][0], c[&key][1]
                ));
            }
            checked += 1;
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    println!(
        "{} structs, {checked} fields agree with mlx5dv.h",
        abi::STRUCTS.len()
    );
}

#[test]
fn constants_match_mlx5dv_h_and_verbs_h() {
    let c = rdma_core_values();
    let mut mismatches = Vec::new();
    let constants = abi::constants();
    for (name, ours) in &constants {
        let theirs = c[&format!("const {name}")][0];
        if theirs != *ours {
            mismatches.push(format!("{name}: ours {ours:#x}, rdma-core {theirs:#x}"));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    println!("{} constants agree with rdma-core", constants.len());
}
