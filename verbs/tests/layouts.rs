//! The mirrored libibverbs layouts checked against Debian's `infiniband/verbs.h`: a C program
//! made of one `_Static_assert` per size and field offset in `abi::LAYOUTS` must compile.
//! Needs a C compiler (`$CC`, else `cc`) and `libibverbs-dev`; skips with a printed reason
//! when the header is missing.

use std::fmt::Write as _;
use std::process::Command;

use railshift_verbs::abi::LAYOUTS;

const HEADER: &str = "/usr/include/infiniband/verbs.h";

fn c_program() -> String {
    let mut c = String::from("#include <stddef.h>\n#include <infiniband/verbs.h>\n");
    for layout in LAYOUTS {
        let s = layout.c_name;
        writeln!(
            c,
            "_Static_assert(sizeof(struct {s}) == {}, \"sizeof(struct {s}) is not {}\");",
            layout.size, layout.size
        )
        .unwrap();
        for (field, offset) in layout.fields {
            writeln!(
                c,
                "_Static_assert(offsetof(struct {s}, {field}) == {offset}, \
                 \"offsetof(struct {s}, {field}) is not {offset}\");"
            )
            .unwrap();
        }
    }
    c
}

#[test]
fn every_mirrored_size_and_offset_matches_verbs_h() {
    if !std::path::Path::new(HEADER).exists() {
        eprintln!("skipped: {HEADER} is missing (install libibverbs-dev)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("railshift-verbs-layouts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("layouts.c");
    std::fs::write(&source, c_program()).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-fsyntax-only"])
        .arg(&source)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "layouts differ from {HEADER}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_check_covers_every_struct_a_stock_binary_touches() {
    let names: Vec<&str> = LAYOUTS.iter().map(|l| l.c_name).collect();
    for needed in [
        "ibv_context",
        "verbs_context",
        "ibv_context_ops",
        "ibv_cq",
        "ibv_qp",
        "ibv_send_wr",
        "ibv_recv_wr",
        "ibv_wc",
        "ibv_qp_attr",
        "ibv_port_attr",
        "ibv_device_attr",
    ] {
        assert!(names.contains(&needed), "{needed} is not checked");
    }
}
