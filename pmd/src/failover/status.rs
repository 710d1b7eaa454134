//! What an error completion means for failover: a dead path, a flush, or a refusal.

pub use hw_defs::verbs::WcStatus;

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
            WcStatus::LocAccessErr,
            WcStatus::MwBindErr,
            WcStatus::BadRespErr,
            WcStatus::RemAbortErr,
            WcStatus::GeneralErr,
            WcStatus::Unknown(200),
        ] {
            assert_eq!(ErrorClass::of(status), ErrorClass::Refusal, "{status:?}");
        }
    }

    #[test]
    fn a_flush_is_only_a_flush() {
        assert_eq!(ErrorClass::of(WcStatus::WrFlushErr), ErrorClass::Flush);
    }
}
