//! What an error completion means for failover: a dead path, a flush, or a refusal.

pub use wc_status::WcStatus;

/// How the failover machine reads an error completion's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The path (NIC, link, switch port) stopped carrying packets: retry exhaustion, a
    /// response timeout, a fatal device error. Work may be moved to the other path.
    Path,
    /// A flush: the QP is in the error state because of an earlier error or because we moved
    /// it there. Says nothing by itself; the first non-flush error decides.
    Flush,
    /// The request itself was refused or malformed (protection, access, length, invalid
    /// request, RNR exhaustion, ...). Never failed over: retrying elsewhere would bypass the
    /// refusal (a revoked rkey must stay revoked) or repeat the same mistake.
    Refusal,
}

impl ErrorClass {
    /// Classifies an error completion's status.
    pub fn of(status: WcStatus) -> ErrorClass {
        match status {
            WcStatus::RetryExcErr | WcStatus::RespTimeoutErr | WcStatus::FatalErr => {
                ErrorClass::Path
            }
            WcStatus::WrFlushErr => ErrorClass::Flush,
            // RNR exhaustion means the peer application posted no receive: another NIC will not
            // post one either. Everything else is a protection or request error, or unknown.
            _ => ErrorClass::Refusal,
        }
    }
}

/// libibverbs' `enum ibv_wc_status`, numbered as libibverbs numbers it.
mod wc_status {
    /// A work-completion status, numbered exactly as libibverbs' `enum ibv_wc_status`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum WcStatus {
        /// `IBV_WC_SUCCESS`.
        Success,
        /// `IBV_WC_LOC_LEN_ERR`: a local length error.
        LocLenErr,
        /// `IBV_WC_LOC_QP_OP_ERR`: a local QP operation error.
        LocQpOpErr,
        /// `IBV_WC_LOC_PROT_ERR`: a local protection error (bad lkey).
        LocProtErr,
        /// `IBV_WC_WR_FLUSH_ERR`: flushed because the QP is in the error state.
        WrFlushErr,
        /// `IBV_WC_REM_INV_REQ_ERR`: the responder found the request invalid.
        RemInvReqErr,
        /// `IBV_WC_REM_ACCESS_ERR`: the responder refused the rkey, bounds or access.
        RemAccessErr,
        /// `IBV_WC_REM_OP_ERR`: the responder could not complete the operation.
        RemOpErr,
        /// `IBV_WC_RETRY_EXC_ERR`: the transport retry counter ran out.
        RetryExcErr,
        /// `IBV_WC_RNR_RETRY_EXC_ERR`: the RNR retry counter ran out.
        RnrRetryExcErr,
        /// `IBV_WC_FATAL_ERR`: a fatal error.
        FatalErr,
        /// `IBV_WC_RESP_TIMEOUT_ERR`: a response timeout.
        RespTimeoutErr,
        /// Any other value.
        Unknown(u8),
    }

    impl From<u8> for WcStatus {
        fn from(value: u8) -> Self {
            match value {
                0 => WcStatus::Success,
                1 => WcStatus::LocLenErr,
                2 => WcStatus::LocQpOpErr,
                4 => WcStatus::LocProtErr,
                5 => WcStatus::WrFlushErr,
                9 => WcStatus::RemInvReqErr,
                10 => WcStatus::RemAccessErr,
                11 => WcStatus::RemOpErr,
                12 => WcStatus::RetryExcErr,
                13 => WcStatus::RnrRetryExcErr,
                19 => WcStatus::FatalErr,
                20 => WcStatus::RespTimeoutErr,
                other => WcStatus::Unknown(other),
            }
        }
    }

    impl From<WcStatus> for u8 {
        fn from(value: WcStatus) -> Self {
            match value {
                WcStatus::Success => 0,
                WcStatus::LocLenErr => 1,
                WcStatus::LocQpOpErr => 2,
                WcStatus::LocProtErr => 4,
                WcStatus::WrFlushErr => 5,
                WcStatus::RemInvReqErr => 9,
                WcStatus::RemAccessErr => 10,
                WcStatus::RemOpErr => 11,
                WcStatus::RetryExcErr => 12,
                WcStatus::RnrRetryExcErr => 13,
                WcStatus::FatalErr => 19,
                WcStatus::RespTimeoutErr => 20,
                WcStatus::Unknown(other) => other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_exhaustion_is_a_path_failure() {
        assert_eq!(ErrorClass::of(WcStatus::RetryExcErr), ErrorClass::Path);
        assert_eq!(ErrorClass::of(WcStatus::RespTimeoutErr), ErrorClass::Path);
        assert_eq!(ErrorClass::of(WcStatus::FatalErr), ErrorClass::Path);
    }

    #[test]
    fn protection_and_request_errors_are_refusals() {
        for status in [
            WcStatus::RemAccessErr,
            WcStatus::LocProtErr,
            WcStatus::RemInvReqErr,
            WcStatus::LocLenErr,
            WcStatus::RemOpErr,
            WcStatus::LocQpOpErr,
            WcStatus::RnrRetryExcErr,
            WcStatus::Unknown(200),
        ] {
            assert_eq!(ErrorClass::of(status), ErrorClass::Refusal, "{status:?}");
        }
    }

    #[test]
    fn a_flush_is_only_a_flush() {
        assert_eq!(ErrorClass::of(WcStatus::WrFlushErr), ErrorClass::Flush);
    }

    #[test]
    fn statuses_keep_their_libibverbs_numbers() {
        assert_eq!(u8::from(WcStatus::RemAccessErr), 10);
        assert_eq!(u8::from(WcStatus::RetryExcErr), 12);
        for value in 0..=u8::MAX {
            assert_eq!(u8::from(WcStatus::from(value)), value);
        }
    }
}
