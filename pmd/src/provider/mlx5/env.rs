//! What libmlx5's environment variables change for a driver that writes the rings itself.
//!
//! libmlx5 reads them when a context opens (`MLX5_SHUT_UP_BF`) or a QP is created
//! (`MLX5_QP_SIGNATURE`) and adjusts its own datapath; the pmd's datapath must follow them too
//! or refuse what it cannot do. Each decision is a pure function of the variable's value, read
//! by the provider, so the tests need not touch the process environment.

use std::ffi::OsStr;

use crate::provider::VerbsError;

/// `MLX5_SHUT_UP_BF`: set to anything but `0`, libmlx5 maps the UAR pages uncached and never
/// copies WQEs into the BlueFlame buffer (hosts or VMs where write-combining is off or
/// broken). `None` is the variable unset.
pub fn blueflame_allowed(shut_up_bf: Option<&OsStr>) -> bool {
    // libmlx5's get_shut_up_bf: set and not "0" shuts BlueFlame up.
    shut_up_bf.is_none_or(|v| v == "0")
}

/// `MLX5_QP_SIGNATURE`: set to anything, libmlx5 creates QPs whose WQEs carry a signature
/// byte in their control segment, which the device checks; the pmd writes its WQEs itself
/// and computes no signature, so such a QP would see every WQE refused. Refuse to create it.
pub fn check_qp_signature(device: &str, qp_signature: Option<&OsStr>) -> Result<(), VerbsError> {
    // libmlx5's qp_sig_enabled: any value, even "0", enables signatures.
    match qp_signature {
        None => Ok(()),
        Some(v) => Err(VerbsError::Unsupported {
            device: device.to_string(),
            verb: "create_qp",
            what: format!(
                "MLX5_QP_SIGNATURE is set ({v:?}): libmlx5 would create QPs whose WQEs need a \
                 signature the pmd does not write; unset it"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shut_up_bf_turns_blueflame_off_unless_it_says_zero() {
        assert!(blueflame_allowed(None));
        assert!(blueflame_allowed(Some(OsStr::new("0"))));
        assert!(!blueflame_allowed(Some(OsStr::new("1"))));
        assert!(!blueflame_allowed(Some(OsStr::new(""))));
        assert!(!blueflame_allowed(Some(OsStr::new("yes"))));
    }

    #[test]
    fn any_qp_signature_setting_is_refused_by_name() {
        assert!(check_qp_signature("mlx5:mlx5_0", None).is_ok());
        for v in ["1", "0", ""] {
            let e = check_qp_signature("mlx5:mlx5_0", Some(OsStr::new(v))).unwrap_err();
            assert!(matches!(e, VerbsError::Unsupported { .. }), "{e}");
            let text = e.to_string();
            assert!(text.contains("MLX5_QP_SIGNATURE"), "{text}");
            assert!(text.contains("mlx5:mlx5_0"), "{text}");
        }
    }
}
