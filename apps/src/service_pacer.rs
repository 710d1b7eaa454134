//! The failover service's round as a run-to-completion lcore runs it: when, and how often,
//! between and within the loop's polling rounds.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pmd::resilient::FailoverService;

/// How often (in polling rounds) a run-to-completion loop runs the failover service's round:
/// link watch, control QPs, timers. A round with nothing to do costs a lock and a look at
/// each descriptor; every 64 polling rounds keeps it far below the polls themselves while a
/// link event waits at most 64 rounds (tens of microseconds with one QP) for it.
const SERVICE_EVERY: u32 = 64;
/// ... and at the latest after this much time: a polling round over 1,000 QPs takes
/// milliseconds (each empty poll drives the devices), so 64 rounds alone let a link-down wait
/// ~0.6 s, past the RC timeout (the testbed's QP sweep at 1,000 QPs showed it).
const SERVICE_PERIOD: Duration = Duration::from_micros(200);
/// ... but never more than one part in this many of the lcore's time: the service's round
/// grows with the QPs it serves (it polls each one's control CQ), and a latency loop beside
/// 1,000 idle QPs must not spend its time there.
const SERVICE_SHARE: u32 = 20;
/// ... and never later than this after the last round, whatever that round cost: one round
/// stretched by a preemption must not hold the next one (and a link-down) back for twenty
/// times as long.
const SERVICE_GAP_MAX: Duration = Duration::from_millis(2);

/// The failover service's round as a run-to-completion lcore runs it, paced by the rules
/// above. One per host, shared by the loop's idle policy (at the end of each polling round)
/// and the loop over the QPs (every [`crate::session::PROGRESS_EVERY_QPS`] QPs): a polling round in which
/// 1,000 QPs each run a failover round takes tens of milliseconds, and a service that ran only
/// between polling rounds left the peer's control messages in the control CQs for that long
/// (the 1,000-QP breakdown in docs/testbed.md).
#[derive(Debug)]
pub struct ServicePacer {
    service: Arc<FailoverService>,
    state: Mutex<PacerState>,
}

#[derive(Debug)]
struct PacerState {
    /// Polling rounds ended.
    rounds: u32,
    /// When the service last ran.
    last: Instant,
    /// How long its last round took.
    cost: Duration,
    /// The service ran since [`ServicePacer::take_ran`] last looked.
    ran: bool,
}

impl ServicePacer {
    /// Paces `service`'s rounds.
    pub fn new(service: Arc<FailoverService>) -> ServicePacer {
        ServicePacer {
            service,
            state: Mutex::new(PacerState {
                rounds: 0,
                last: Instant::now(),
                cost: Duration::ZERO,
                ran: false,
            }),
        }
    }

    /// A polling round ended: the service runs every [`SERVICE_EVERY`] rounds or after
    /// [`SERVICE_PERIOD`].
    #[inline]
    pub fn round_ended(&self) {
        self.run(true);
    }

    /// Within a polling round: the service runs if [`SERVICE_PERIOD`] has passed. Returns
    /// whether it ran.
    #[inline]
    pub fn within_round(&self) -> bool {
        self.run(false)
    }

    /// Whether the service ran (and may have mailed QPs) since the last call.
    #[inline]
    pub fn take_ran(&self) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut st.ran)
    }

    fn run(&self, round_ended: bool) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if round_ended {
            st.rounds = st.rounds.wrapping_add(1);
        }
        let now = Instant::now();
        let since = now.duration_since(st.last);
        let due = (round_ended && st.rounds % SERVICE_EVERY == 0) || since >= SERVICE_PERIOD;
        let gap = (st.cost * SERVICE_SHARE).min(SERVICE_GAP_MAX);
        if due && since >= gap {
            self.service.run_once();
            st.last = Instant::now();
            st.cost = st.last.duration_since(now);
            st.ran = true;
            return true;
        }
        false
    }
}
