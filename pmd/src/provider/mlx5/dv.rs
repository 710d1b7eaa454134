//! The few mlx5dv items (and libibverbs constants) rdma-sys does not bind, declared by hand
//! after Debian's `infiniband/mlx5dv.h` (rdma-core 44): `mlx5dv_init_obj` and the structs it fills, and
//! `mlx5dv_create_qp` with its vendor attributes. The test at the bottom compiles a C probe
//! against the real header and compares every size, offset, constant and prototype.
//!
//! Names are the C names, so each item reads against the header line by line.

#![allow(non_camel_case_types)]

use std::os::raw::{c_int, c_void};

use rdma_sys::{ibv_context, ibv_cq, ibv_device, ibv_qp, ibv_qp_init_attr_ex};

/// One `{ in, out }` pair of `struct mlx5dv_obj`.
#[repr(C)]
pub struct mlx5dv_obj_pair<In, Out> {
    /// The verbs object to look into (`in`).
    pub in_: *mut In,
    /// Where libmlx5 writes what it found (`out`).
    pub out: *mut Out,
}

impl<In, Out> Default for mlx5dv_obj_pair<In, Out> {
    fn default() -> Self {
        mlx5dv_obj_pair {
            in_: std::ptr::null_mut(),
            out: std::ptr::null_mut(),
        }
    }
}

/// `struct mlx5dv_obj`: which objects `mlx5dv_init_obj` should describe. We only ever ask for
/// a QP or a CQ; the other members keep the layout and stay null.
#[repr(C)]
#[derive(Default)]
pub struct mlx5dv_obj {
    /// `qp`.
    pub qp: mlx5dv_obj_pair<ibv_qp, mlx5dv_qp>,
    /// `cq`.
    pub cq: mlx5dv_obj_pair<ibv_cq, mlx5dv_cq>,
    /// `srq` (unused).
    pub srq: mlx5dv_obj_pair<c_void, c_void>,
    /// `rwq` (unused).
    pub rwq: mlx5dv_obj_pair<c_void, c_void>,
    /// `dm` (unused).
    pub dm: mlx5dv_obj_pair<c_void, c_void>,
    /// `ah` (unused).
    pub ah: mlx5dv_obj_pair<c_void, c_void>,
    /// `pd` (unused).
    pub pd: mlx5dv_obj_pair<c_void, c_void>,
}

/// The anonymous `sq` and `rq` members of `struct mlx5dv_qp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_wq {
    /// First byte of the ring.
    pub buf: *mut c_void,
    /// Entries (basic blocks for the send queue).
    pub wqe_cnt: u32,
    /// Bytes per entry.
    pub stride: u32,
}

/// The anonymous `bf` member of `struct mlx5dv_qp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_bf {
    /// The BlueFlame / doorbell register (write-combining UAR memory).
    pub reg: *mut c_void,
    /// Bytes of each BlueFlame half; 0 when only plain doorbells may be written.
    pub size: u32,
}

/// `struct mlx5dv_qp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_qp {
    /// Doorbell record: `[MLX5_RCV_DBR]`, `[MLX5_SND_DBR]`, big-endian.
    pub dbrec: *mut u32,
    /// Send queue.
    pub sq: mlx5dv_wq,
    /// Receive queue.
    pub rq: mlx5dv_wq,
    /// Doorbell register.
    pub bf: mlx5dv_bf,
    /// In: which optional fields to fill; out: which were filled. We ask for none.
    pub comp_mask: u64,
    /// `uar_mmap_offset` (optional, not asked for).
    pub uar_mmap_offset: libc::off_t,
    /// `tirn` (raw packet QPs only).
    pub tirn: u32,
    /// `tisn` (raw packet QPs only).
    pub tisn: u32,
    /// `rqn` (raw packet QPs only).
    pub rqn: u32,
    /// `sqn` (raw packet QPs only).
    pub sqn: u32,
    /// `tir_icm_addr` (raw packet QPs only).
    pub tir_icm_addr: u64,
}

/// `struct mlx5dv_cq`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_cq {
    /// First byte of the CQE ring.
    pub buf: *mut c_void,
    /// Doorbell record: `[MLX5_CQ_SET_CI]`, `[MLX5_CQ_ARM_DB]`, big-endian.
    pub dbrec: *mut u32,
    /// CQEs in the ring.
    pub cqe_cnt: u32,
    /// Bytes per CQE (64 or 128).
    pub cqe_size: u32,
    /// The UAR page whose `MLX5_CQ_DOORBELL` register arms the CQ.
    pub cq_uar: *mut c_void,
    /// The CQ number.
    pub cqn: u32,
    /// Which optional fields were filled.
    pub comp_mask: u64,
}

/// `struct mlx5dv_dci_streams` (DC only; kept for the layout).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct mlx5dv_dci_streams {
    /// `log_num_concurent` (sic).
    pub log_num_concurent: u8,
    /// `log_num_errored`.
    pub log_num_errored: u8,
}

/// The anonymous union of `struct mlx5dv_dc_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union mlx5dv_dc_init_attr_u {
    /// `dct_access_key`.
    pub dct_access_key: u64,
    /// `dci_streams`.
    pub dci_streams: mlx5dv_dci_streams,
}

/// `struct mlx5dv_dc_init_attr` (DC only; kept for the layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mlx5dv_dc_init_attr {
    /// `enum mlx5dv_dc_type`.
    pub dc_type: u32,
    /// The union.
    pub u: mlx5dv_dc_init_attr_u,
}

/// `struct mlx5dv_qp_init_attr`: the vendor half of `mlx5dv_create_qp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mlx5dv_qp_init_attr {
    /// Which of the fields below are valid (`enum mlx5dv_qp_init_attr_mask`).
    pub comp_mask: u64,
    /// `enum mlx5dv_qp_create_flags`.
    pub create_flags: u32,
    /// DC attributes (unused).
    pub dc_init_attr: mlx5dv_dc_init_attr,
    /// `enum mlx5dv_qp_create_send_ops_flags` (unused).
    pub send_ops_flags: u64,
}

/// `IBV_LINK_LAYER_UNSPECIFIED` (libibverbs' anonymous enum, not bound by rdma-sys): what
/// old kernels report for InfiniBand ports.
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
/// `IBV_LINK_LAYER_INFINIBAND`.
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`: RoCE.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `MLX5DV_OBJ_QP`.
pub const MLX5DV_OBJ_QP: u64 = 1 << 0;
/// `MLX5DV_OBJ_CQ`.
pub const MLX5DV_OBJ_CQ: u64 = 1 << 1;
/// `MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS`.
pub const MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS: u64 = 1 << 0;
/// `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE`: received payloads of up to 32 bytes go to the
/// receive buffer like all others, not into the CQE (which only libmlx5's poller unpacks).
pub const MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE: u32 = 1 << 3;

#[link(name = "mlx5")]
extern "C" {
    /// `int mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t obj_type)`: fills the `out` of
    /// every object named in `obj_type`; 0 or an errno. Marks a CQ as DV-owned, after which
    /// libmlx5 no longer cleans it on QP reset or destroy (we do).
    pub fn mlx5dv_init_obj(obj: *mut mlx5dv_obj, obj_type: u64) -> c_int;

    /// `struct ibv_qp *mlx5dv_create_qp(struct ibv_context *, struct ibv_qp_init_attr_ex *,
    /// struct mlx5dv_qp_init_attr *)`: `ibv_create_qp_ex` with vendor flags; NULL and errno
    /// on failure. Writes the granted capabilities back into `qp_attr->cap`.
    pub fn mlx5dv_create_qp(
        context: *mut ibv_context,
        qp_attr: *mut ibv_qp_init_attr_ex,
        mlx5_qp_attr: *mut mlx5dv_qp_init_attr,
    ) -> *mut ibv_qp;

    /// `bool mlx5dv_is_supported(struct ibv_device *device)`: whether the device is driven
    /// by libmlx5 (so the calls above are valid on its objects).
    pub fn mlx5dv_is_supported(device: *mut ibv_device) -> bool;
}

#[cfg(test)]
mod tests {
    //! Our declarations against Debian's `infiniband/mlx5dv.h`: a C program prints the size
    //! and every member's offset and width of each struct, the value of each constant, and
    //! fails to compile if a prototype differs from the one we declare.

    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    use std::mem::{offset_of, size_of};
    use std::process::Command;

    use super::*;

    /// A struct as our declaration lays it out: C name, size, and (C member, offset, width).
    struct Layout {
        c_name: &'static str,
        size: usize,
        fields: Vec<(&'static str, usize, usize)>,
    }

    /// The size of what `p` points to (a raw pointer reaches union members without a read).
    fn pointee_size<T>(_: *const T) -> usize {
        size_of::<T>()
    }

    /// `layout!(ty { "c.member" => rust.path, ... })`, measured on our declaration.
    macro_rules! layout {
        ($ty:ident { $($c:literal => $($f:ident).+),* $(,)? }) => {{
            // SAFETY: these are plain C structs of integers and raw pointers; all-zero bytes
            // are a valid value (null pointers, zero counts), and we only measure it.
            let v: $ty = unsafe { std::mem::zeroed() };
            Layout {
                c_name: stringify!($ty),
                size: size_of::<$ty>(),
                fields: vec![$(($c, offset_of!($ty, $($f).+), pointee_size(&raw const v.$($f).+))),*],
            }
        }};
    }

    fn layouts() -> Vec<Layout> {
        vec![
            layout!(mlx5dv_obj {
                "qp.in" => qp.in_, "qp.out" => qp.out, "cq.in" => cq.in_, "cq.out" => cq.out,
                "srq.in" => srq.in_, "rwq.in" => rwq.in_, "dm.in" => dm.in_, "ah.in" => ah.in_,
                "pd.in" => pd.in_, "pd.out" => pd.out,
            }),
            layout!(mlx5dv_qp {
                "dbrec" => dbrec, "sq.buf" => sq.buf, "sq.wqe_cnt" => sq.wqe_cnt,
                "sq.stride" => sq.stride, "rq.buf" => rq.buf, "rq.wqe_cnt" => rq.wqe_cnt,
                "rq.stride" => rq.stride, "bf.reg" => bf.reg, "bf.size" => bf.size,
                "comp_mask" => comp_mask, "uar_mmap_offset" => uar_mmap_offset,
                "tirn" => tirn, "tisn" => tisn, "rqn" => rqn, "sqn" => sqn,
                "tir_icm_addr" => tir_icm_addr,
            }),
            layout!(mlx5dv_cq {
                "buf" => buf, "dbrec" => dbrec, "cqe_cnt" => cqe_cnt, "cqe_size" => cqe_size,
                "cq_uar" => cq_uar, "cqn" => cqn, "comp_mask" => comp_mask,
            }),
            layout!(mlx5dv_qp_init_attr {
                "comp_mask" => comp_mask, "create_flags" => create_flags,
                "dc_init_attr.dc_type" => dc_init_attr.dc_type,
                "dc_init_attr.dct_access_key" => dc_init_attr.u.dct_access_key,
                "dc_init_attr.dci_streams" => dc_init_attr.u.dci_streams,
                "send_ops_flags" => send_ops_flags,
            }),
        ]
    }

    fn constants() -> Vec<(&'static str, u64)> {
        vec![
            (
                "IBV_LINK_LAYER_UNSPECIFIED",
                u64::from(IBV_LINK_LAYER_UNSPECIFIED),
            ),
            (
                "IBV_LINK_LAYER_INFINIBAND",
                u64::from(IBV_LINK_LAYER_INFINIBAND),
            ),
            (
                "IBV_LINK_LAYER_ETHERNET",
                u64::from(IBV_LINK_LAYER_ETHERNET),
            ),
            ("MLX5DV_OBJ_QP", MLX5DV_OBJ_QP),
            ("MLX5DV_OBJ_CQ", MLX5DV_OBJ_CQ),
            (
                "MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS",
                MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
            ),
            (
                "MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE",
                u64::from(MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE),
            ),
        ]
    }

    /// The C prototypes our `extern` block declares; the probe does not compile if the
    /// header's differ.
    const PROTOTYPES: &[(&str, &str)] = &[
        ("mlx5dv_init_obj", "int (*)(struct mlx5dv_obj *, uint64_t)"),
        (
            "mlx5dv_create_qp",
            "struct ibv_qp *(*)(struct ibv_context *, struct ibv_qp_init_attr_ex *, \
             struct mlx5dv_qp_init_attr *)",
        ),
        ("mlx5dv_is_supported", "bool (*)(struct ibv_device *)"),
    ];

    fn probe_source() -> String {
        let mut c = String::from(
            "#include <stdbool.h>\n#include <stddef.h>\n#include <stdint.h>\n\
             #include <stdio.h>\n#include <infiniband/mlx5dv.h>\n",
        );
        for (name, ty) in PROTOTYPES {
            writeln!(
                c,
                "_Static_assert(__builtin_types_compatible_p(__typeof__(&{name}), {ty}), \
                 \"prototype of {name}\");"
            )
            .unwrap();
        }
        c.push_str("int main(void) {\n");
        for l in layouts() {
            writeln!(
                c,
                "printf(\"size {0} %zu\\n\", sizeof(struct {0}));",
                l.c_name
            )
            .unwrap();
            for (member, _, _) in &l.fields {
                writeln!(
                    c,
                    "printf(\"field {0}.{1} %zu %zu\\n\", offsetof(struct {0}, {1}), \
                     sizeof(((struct {0} *)0)->{1}));",
                    l.c_name, member
                )
                .unwrap();
            }
        }
        for (name, _) in constants() {
            writeln!(
                c,
                "printf(\"const {name} %llu\\n\", (unsigned long long)({name}));"
            )
            .unwrap();
        }
        c.push_str("return 0;\n}\n");
        c
    }

    /// Compiles and runs the probe; its output as "kind name" -> numbers.
    fn header_values() -> BTreeMap<String, Vec<u64>> {
        let dir = std::env::temp_dir().join(format!("pmd-mlx5dv-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("probe.c");
        let binary = dir.join("probe");
        std::fs::write(&source, probe_source()).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let compiled = Command::new(&cc)
            .args(["-std=gnu11", "-o"])
            .arg(&binary)
            .arg(&source)
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
        assert!(
            compiled.status.success(),
            "the probe does not compile against infiniband/mlx5dv.h (a prototype differs, or \
             libibverbs-dev is missing):\n{}",
            String::from_utf8_lossy(&compiled.stderr)
        );
        let run = Command::new(&binary).output().unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert!(run.status.success());
        String::from_utf8(run.stdout)
            .unwrap()
            .lines()
            .map(|line| {
                let mut words = line.split_whitespace();
                let kind = words.next().unwrap();
                let name = words.next().unwrap();
                (
                    format!("{kind} {name}"),
                    words.map(|w| w.parse().unwrap()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn declarations_match_debians_mlx5dv_h() {
        let c = header_values();
        let mut wrong = Vec::new();
        let mut fields = 0;
        for l in layouts() {
            let theirs = &c[&format!("size {}", l.c_name)];
            if theirs[..] != [l.size as u64] {
                wrong.push(format!(
                    "sizeof(struct {}): ours {}, header {theirs:?}",
                    l.c_name, l.size
                ));
            }
            for (member, offset, width) in &l.fields {
                let theirs = &c[&format!("field {}.{member}", l.c_name)];
                if theirs[..] != [*offset as u64, *width as u64] {
                    wrong.push(format!(
                        "{}.{member}: ours offset {offset} width {width}, header {theirs:?}",
                        l.c_name
                    ));
                }
                fields += 1;
            }
        }
        for (name, ours) in constants() {
            let theirs = c[&format!("const {name}")][0];
            if theirs != ours {
                wrong.push(format!("{name}: ours {ours:#x}, header {theirs:#x}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        println!(
            "{} structs ({fields} members), {} constants and {} prototypes agree with mlx5dv.h",
            layouts().len(),
            constants().len(),
            PROTOTYPES.len()
        );
    }
}
