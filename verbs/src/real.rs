//! The system libibverbs behind the shim: every call on an object that is not ours goes to
//! the definition the next library in the search order has, at the symbol version Debian's
//! stock binaries link (`dlvsym(RTLD_NEXT, name, version)`).

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A symbol of the system library, looked up once.
pub struct RealFn {
    name: &'static CStr,
    version: &'static CStr,
    /// 0: not looked up yet; 1: looked up and absent; else the address.
    slot: AtomicUsize,
}

impl RealFn {
    /// The symbol `name` at `version`.
    pub const fn new(name: &'static CStr, version: &'static CStr) -> RealFn {
        RealFn {
            name,
            version,
            slot: AtomicUsize::new(0),
        }
    }

    /// The address, or `None` when no later library defines it (no libibverbs loaded).
    pub fn address(&self) -> Option<*mut c_void> {
        let mut p = self.slot.load(Ordering::Relaxed);
        if p == 0 {
            // SAFETY: both strings are NUL-terminated; RTLD_NEXT asks for the definition
            // after this library's, which is never our own.
            let found =
                unsafe { libc::dlvsym(libc::RTLD_NEXT, self.name.as_ptr(), self.version.as_ptr()) };
            p = if found.is_null() { 1 } else { found as usize };
            self.slot.store(p, Ordering::Relaxed);
        }
        (p != 1).then_some(p as *mut c_void)
    }

    /// The symbol's name, for messages.
    pub fn name(&self) -> &'static str {
        self.name.to_str().unwrap_or("?")
    }
}

/// Declares `system::<name>()`, the system's definition of a verbs function, typed.
macro_rules! real_fns {
    ($($name:ident @ $version:literal : fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// The system library's definitions of the verbs this module defines.
        #[allow(non_snake_case)]
        mod system {
        #[allow(unused_imports)]
        use super::*;
        use std::ffi::{c_void, CStr};
        use $crate::real::RealFn;
        $(
            #[doc = concat!("The system's `", stringify!($name), "@", $version, "`.")]
            pub fn $name() -> Option<unsafe extern "C" fn($($arg),*) -> $ret> {
                static F: RealFn = RealFn::new(
                    match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(s) => s,
                        Err(_) => panic!("symbol name"),
                    },
                    match CStr::from_bytes_with_nul(concat!($version, "\0").as_bytes()) {
                        Ok(s) => s,
                        Err(_) => panic!("symbol version"),
                    },
                );
                // SAFETY: the address is the system library's definition of this very
                // function, whose C prototype the signature above repeats.
                F.address().map(|p| unsafe {
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p)
                })
            }
        )*
        }
    };
}

pub(crate) use real_fns;
