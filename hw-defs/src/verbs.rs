//! libibverbs numbers that the mlx5 layouts map onto.

use core::fmt;

enum_with_unknown! {
    /// A work-completion status, numbered exactly as libibverbs' `enum ibv_wc_status`.
    pub enum WcStatus(u8) {
        /// `IBV_WC_SUCCESS`.
        Success = 0,
        /// `IBV_WC_LOC_LEN_ERR`: a local length error.
        LocLenErr = 1,
        /// `IBV_WC_LOC_QP_OP_ERR`: a local QP operation error.
        LocQpOpErr = 2,
        /// `IBV_WC_LOC_EEC_OP_ERR`: a local EE context operation error.
        LocEecOpErr = 3,
        /// `IBV_WC_LOC_PROT_ERR`: a local protection error (bad lkey).
        LocProtErr = 4,
        /// `IBV_WC_WR_FLUSH_ERR`: flushed because the QP is in the error state.
        WrFlushErr = 5,
        /// `IBV_WC_MW_BIND_ERR`: a memory-window bind error.
        MwBindErr = 6,
        /// `IBV_WC_BAD_RESP_ERR`: the responder sent an unexpected response.
        BadRespErr = 7,
        /// `IBV_WC_LOC_ACCESS_ERR`: a local access error.
        LocAccessErr = 8,
        /// `IBV_WC_REM_INV_REQ_ERR`: the responder found the request invalid.
        RemInvReqErr = 9,
        /// `IBV_WC_REM_ACCESS_ERR`: the responder refused the rkey, bounds or access.
        RemAccessErr = 10,
        /// `IBV_WC_REM_OP_ERR`: the responder could not complete the operation.
        RemOpErr = 11,
        /// `IBV_WC_RETRY_EXC_ERR`: the transport retry counter ran out.
        RetryExcErr = 12,
        /// `IBV_WC_RNR_RETRY_EXC_ERR`: the RNR retry counter ran out.
        RnrRetryExcErr = 13,
        /// `IBV_WC_LOC_RDD_VIOL_ERR`: a local RDD violation.
        LocRddViolErr = 14,
        /// `IBV_WC_REM_INV_RD_REQ_ERR`: the responder found the RD request invalid.
        RemInvRdReqErr = 15,
        /// `IBV_WC_REM_ABORT_ERR`: the responder aborted the operation.
        RemAbortErr = 16,
        /// `IBV_WC_INV_EECN_ERR`: an invalid EE context number.
        InvEecnErr = 17,
        /// `IBV_WC_INV_EEC_STATE_ERR`: an invalid EE context state.
        InvEecStateErr = 18,
        /// `IBV_WC_FATAL_ERR`: a fatal error.
        FatalErr = 19,
        /// `IBV_WC_RESP_TIMEOUT_ERR`: a response timeout.
        RespTimeoutErr = 20,
        /// `IBV_WC_GENERAL_ERR`: any other error.
        GeneralErr = 21,
        /// `IBV_WC_TM_ERR`: a tag-matching error.
        TmErr = 22,
        /// `IBV_WC_TM_RNDV_INCOMPLETE`: a tag-matching rendezvous did not complete.
        TmRndvIncomplete = 23,
    }
}

impl WcStatus {
    /// The status as `ibv_wc_status_str` spells it (for logs).
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
            WcStatus::TmErr => "TM error",
            WcStatus::TmRndvIncomplete => "TM software rendezvous",
            WcStatus::Unknown(_) => "unknown",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WcStatus::Unknown(value) => write!(f, "unknown status {value}"),
            known => f.write_str(known.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_use_libibverbs_numbers() {
        assert_eq!(u8::from(WcStatus::Success), 0);
        assert_eq!(u8::from(WcStatus::WrFlushErr), 5);
        assert_eq!(u8::from(WcStatus::RemAccessErr), 10);
        assert_eq!(u8::from(WcStatus::RetryExcErr), 12);
        assert_eq!(u8::from(WcStatus::RnrRetryExcErr), 13);
        assert_eq!(u8::from(WcStatus::GeneralErr), 21);
        assert_eq!(u8::from(WcStatus::TmRndvIncomplete), 23);
    }

    #[test]
    fn every_number_converts_back_to_itself() {
        for value in 0..=u8::MAX {
            assert_eq!(u8::from(WcStatus::from(value)), value);
        }
        assert_eq!(WcStatus::from(24), WcStatus::Unknown(24));
    }

    #[test]
    fn display_names_unknown_statuses_with_their_number() {
        assert_eq!(
            WcStatus::RetryExcErr.to_string(),
            "transport retry counter exceeded"
        );
        assert_eq!(WcStatus::Unknown(99).to_string(), "unknown status 99");
    }
}

/// The local ACK timeout a QP's 5-bit `timeout` attribute codes for: 4.096 us x 2^`code`, as
/// the IBTA specification defines it. Code 0 means the requester has no ACK timer.
pub fn local_ack_timeout(code: u8) -> Option<core::time::Duration> {
    (code != 0).then(|| core::time::Duration::from_nanos(4096u64 << code.min(31)))
}

/// How long a plain RC QP keeps trying a dead path before `RETRY_EXC_ERR`: the first
/// transmission and `retry_cnt` retries (a 3-bit field: at most 7), each waiting the local ACK
/// timeout of `timeout_code`. A code of 0 (no ACK timer) is taken as 14 (67 ms), the common
/// default, so the wait stays bounded for whoever plans with it.
pub fn rc_retry_budget(timeout_code: u8, retry_cnt: u8) -> core::time::Duration {
    let code = if timeout_code == 0 { 14 } else { timeout_code };
    let each = local_ack_timeout(code).unwrap_or_default();
    each * (u32::from(retry_cnt.min(7)) + 1)
}

#[cfg(test)]
mod timer_tests {
    use super::*;
    use core::time::Duration;

    #[test]
    fn the_ack_timeout_is_4_096_us_times_two_to_the_code() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(
            local_ack_timeout(14),
            Some(Duration::from_nanos(4096 << 14))
        );
    }

    #[test]
    fn the_default_budget_is_eight_ack_timeouts_of_67_ms() {
        let b = rc_retry_budget(14, 7);
        assert_eq!(b, Duration::from_nanos(8 * 4096 * (1 << 14)));
        assert!((b.as_secs_f64() - 0.537).abs() < 0.001, "{b:?}");
        assert_eq!(rc_retry_budget(0, 7), b, "code 0 plans as 14");
        assert_eq!(rc_retry_budget(14, 9), b, "retry_cnt is 3 bits");
    }
}
