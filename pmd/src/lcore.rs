//! Lcores: pinned threads in the DPDK style, a service lcore for control work, and the idle
//! policy of a polling loop.
//!
//! - [`launch`] starts a thread pinned to one core (`rte_eal_remote_launch`) and returns an
//!   [`Lcore`] to [`Lcore::join`] (`rte_eal_wait_lcore`); a panic on the lcore comes back as
//!   an error naming the lcore, not as a second panic.
//! - [`ServiceLcore`] runs control work (verbs that block, handshakes, probes, link watch) so
//!   datapath lcores never do: one-off jobs with [`ServiceLcore::submit`] and periodic tasks
//!   with [`ServiceLcore::every`]. It sleeps when it has nothing to do.
//! - [`Poller`] is what a polling loop calls when a round found nothing: it spins briefly,
//!   then yields (crossbeam's `Backoff`), then parks until an event unparks it or a bounded
//!   timeout passes. On a 2-core machine two spinning threads starve each other; parking is
//!   what keeps an idle lcore off the CPU.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::sync::{Parker, Unparker};
use crossbeam_utils::Backoff;

/// Why an lcore could not be started or joined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LcoreError {
    /// The OS refused to start the thread.
    #[error("could not start lcore {name}: {reason}")]
    Spawn {
        /// The lcore's name.
        name: String,
        /// What the OS said.
        reason: String,
    },
    /// The core does not exist on this machine.
    #[error("lcore {name}: core {core} does not exist (this machine has cores {available:?})")]
    NoSuchCore {
        /// The lcore's name.
        name: String,
        /// The core asked for.
        core: usize,
        /// The cores there are.
        available: Vec<usize>,
    },
    /// The lcore's function panicked.
    #[error("lcore {name} panicked: {message}")]
    Panicked {
        /// The lcore's name.
        name: String,
        /// The panic message, when it was a string.
        message: String,
    },
    /// The service lcore stopped before answering.
    #[error("the service lcore stopped before finishing the job")]
    ServiceStopped,
}

/// The cores this process may run on, in ascending order.
pub fn cores() -> Vec<usize> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    ids
}

/// A running lcore.
#[derive(Debug)]
pub struct Lcore<T> {
    name: String,
    core: Option<usize>,
    handle: JoinHandle<T>,
}

/// Starts `f` on a new thread named `name`, pinned to `core` (unpinned with `None`).
///
/// Pinning failures after the thread started (a cgroup that forbids the core) are logged and
/// the lcore runs unpinned: a benchmark that loses its pinning is slower, not wrong.
pub fn launch<T, F>(name: &str, core: Option<usize>, f: F) -> Result<Lcore<T>, LcoreError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if let Some(core) = core {
        let available = cores();
        if !available.is_empty() && !available.contains(&core) {
            return Err(LcoreError::NoSuchCore {
                name: name.to_string(),
                core,
                available,
            });
        }
    }
    let thread_name = name.to_string();
    let handle = std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            if let Some(id) = core {
                if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
                    tracing::warn!(lcore = %thread_name, core = id, "could not pin lcore; running unpinned");
                }
            }
            f()
        })
        .map_err(|e| LcoreError::Spawn {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
    Ok(Lcore {
        name: name.to_string(),
        core,
        handle,
    })
}

impl<T> Lcore<T> {
    /// The lcore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The core it is pinned to.
    pub fn core(&self) -> Option<usize> {
        self.core
    }

    /// Whether the lcore's function has returned.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the lcore's function to return and gives its result.
    pub fn join(self) -> Result<T, LcoreError> {
        self.handle.join().map_err(|payload| LcoreError::Panicked {
            name: self.name,
            message: panic_message(payload.as_ref()),
        })
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

/// How a polling loop behaves when a round finds no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdlePolicy {
    /// Idle time after which the loop parks instead of spinning and yielding; `None` never
    /// parks (a dedicated core on a large machine).
    pub park_after: Option<Duration>,
    /// Longest single park; a bound, so a lost wake-up costs at most this much.
    pub max_park: Duration,
}

impl Default for IdlePolicy {
    fn default() -> IdlePolicy {
        IdlePolicy {
            park_after: Some(Duration::from_micros(200)),
            max_park: Duration::from_millis(1),
        }
    }
}

/// The idle half of a polling loop: call [`Poller::busy`] after a round that did work and
/// [`Poller::idle`] after one that did not.
#[derive(Debug)]
pub struct Poller {
    policy: IdlePolicy,
    backoff: Backoff,
    idle_since: Option<Instant>,
    parker: Parker,
    parks: u64,
}

impl Poller {
    /// A poller with `policy`.
    pub fn new(policy: IdlePolicy) -> Poller {
        Poller {
            policy,
            backoff: Backoff::new(),
            idle_since: None,
            parker: Parker::new(),
            parks: 0,
        }
    }

    /// A handle that event sources (a completion channel watcher, a control job) use to wake
    /// this poller when it parks.
    pub fn unparker(&self) -> Unparker {
        self.parker.unparker().clone()
    }

    /// The last round did work: spin at full speed again.
    #[inline]
    pub fn busy(&mut self) {
        if self.idle_since.is_some() {
            self.idle_since = None;
            self.backoff.reset();
        }
    }

    /// The last round found nothing: back off, and park once idle for long enough.
    pub fn idle(&mut self) {
        let since = *self.idle_since.get_or_insert_with(Instant::now);
        if !self.backoff.is_completed() {
            self.backoff.snooze();
            return;
        }
        match self.policy.park_after {
            Some(after) if since.elapsed() >= after => {
                self.parks += 1;
                self.parker.park_timeout(self.policy.max_park);
            }
            _ => std::thread::yield_now(),
        }
    }

    /// How many times the poller parked.
    pub fn parks(&self) -> u64 {
        self.parks
    }
}

impl Default for Poller {
    fn default() -> Poller {
        Poller::new(IdlePolicy::default())
    }
}

type Job = Box<dyn FnOnce() + Send>;
type Task = Box<dyn FnMut() -> bool + Send>;

enum ServiceMsg {
    Job(Job),
    Every(Duration, Task),
    Stop,
}

/// The answer to a job submitted to the service lcore.
#[derive(Debug)]
pub struct Ticket<R> {
    rx: mpsc::Receiver<Result<R, LcoreError>>,
}

impl<R> Ticket<R> {
    /// Waits for the job's result.
    pub fn wait(self) -> Result<R, LcoreError> {
        self.rx.recv().map_err(|_| LcoreError::ServiceStopped)?
    }

    /// Waits at most `timeout`; `Ok(None)` if the job is still running.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<Option<R>, LcoreError> {
        match self.rx.recv_timeout(timeout) {
            Ok(r) => r.map(Some),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(LcoreError::ServiceStopped),
        }
    }
}

/// The lcore that runs control work. Stops (after the job in hand) when dropped.
#[derive(Debug)]
pub struct ServiceLcore {
    tx: mpsc::Sender<ServiceMsg>,
    lcore: Option<Lcore<()>>,
}

impl ServiceLcore {
    /// Starts the service lcore on `core` (unpinned with `None`).
    pub fn start(core: Option<usize>) -> Result<ServiceLcore, LcoreError> {
        let (tx, rx) = mpsc::channel::<ServiceMsg>();
        let lcore = launch("railshift-service", core, move || service_loop(rx))?;
        Ok(ServiceLcore {
            tx,
            lcore: Some(lcore),
        })
    }

    /// Runs `job` on the service lcore; the ticket gives its result.
    pub fn submit<R, F>(&self, job: F) -> Result<Ticket<R>, LcoreError>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let (rtx, rx) = mpsc::channel();
        let job: Job = Box::new(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).map_err(|p| {
                LcoreError::Panicked {
                    name: "railshift-service".to_string(),
                    message: panic_message(p.as_ref()),
                }
            });
            // The submitter may have stopped waiting; that is not the job's failure.
            let _ = rtx.send(result);
        });
        self.tx
            .send(ServiceMsg::Job(job))
            .map_err(|_| LcoreError::ServiceStopped)?;
        Ok(Ticket { rx })
    }

    /// Runs `task` every `interval` until it returns false.
    pub fn every<F>(&self, interval: Duration, task: F) -> Result<(), LcoreError>
    where
        F: FnMut() -> bool + Send + 'static,
    {
        self.tx
            .send(ServiceMsg::Every(interval, Box::new(task)))
            .map_err(|_| LcoreError::ServiceStopped)
    }

    /// Stops the service lcore after the job in hand and waits for it.
    pub fn stop(mut self) -> Result<(), LcoreError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), LcoreError> {
        let _ = self.tx.send(ServiceMsg::Stop);
        match self.lcore.take() {
            Some(lcore) => lcore.join(),
            None => Ok(()),
        }
    }
}

impl Drop for ServiceLcore {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "service lcore ended badly");
        }
    }
}

fn service_loop(rx: mpsc::Receiver<ServiceMsg>) {
    let mut tasks: Vec<(Duration, Instant, Task)> = Vec::new();
    loop {
        let next_due = tasks.iter().map(|(_, due, _)| *due).min();
        let msg = match next_due {
            Some(due) => match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                Ok(m) => Some(m),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
            None => match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => return,
            },
        };
        match msg {
            Some(ServiceMsg::Job(job)) => run_caught("job", job),
            Some(ServiceMsg::Every(interval, task)) => {
                tasks.push((interval, Instant::now() + interval, task));
            }
            Some(ServiceMsg::Stop) => return,
            None => {}
        }
        let now = Instant::now();
        tasks.retain_mut(|(interval, due, task)| {
            if *due > now {
                return true;
            }
            *due = now + *interval;
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut *task)) {
                Ok(keep) => keep,
                Err(p) => {
                    tracing::error!(message = %panic_message(p.as_ref()), "periodic service task panicked; dropping it");
                    false
                }
            }
        });
    }
}

fn run_caught(what: &str, job: Job) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        tracing::error!(what, message = %panic_message(p.as_ref()), "service job panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn launched_lcore_runs_on_its_core_and_returns_its_result() {
        let core = cores().first().copied();
        let lcore = launch("test-lcore", core, || 6 * 7).unwrap();
        assert_eq!(lcore.core(), core);
        assert_eq!(lcore.join().unwrap(), 42);
    }

    #[test]
    fn a_panicking_lcore_is_an_error_naming_it() {
        let lcore = launch("doomed", None, || -> u32 { panic!("boom") }).unwrap();
        let err = lcore.join().unwrap_err();
        assert_eq!(
            err,
            LcoreError::Panicked {
                name: "doomed".into(),
                message: "boom".into()
            }
        );
    }

    #[test]
    fn a_core_that_does_not_exist_is_refused() {
        let err = launch("far", Some(100_000), || ()).unwrap_err();
        assert!(
            matches!(err, LcoreError::NoSuchCore { core: 100_000, .. }),
            "{err}"
        );
    }

    #[test]
    fn service_lcore_runs_jobs_in_order_and_returns_results() {
        let service = ServiceLcore::start(None).unwrap();
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let tickets: Vec<_> = (0..5)
            .map(|i| {
                let log = log.clone();
                service
                    .submit(move || {
                        log.lock().unwrap().push(i);
                        i * 10
                    })
                    .unwrap()
            })
            .collect();
        let results: Vec<i32> = tickets.into_iter().map(|t| t.wait().unwrap()).collect();
        assert_eq!(results, vec![0, 10, 20, 30, 40]);
        assert_eq!(*log.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        service.stop().unwrap();
    }

    #[test]
    fn periodic_tasks_run_until_they_say_stop() {
        let service = ServiceLcore::start(None).unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        service
            .every(Duration::from_millis(1), move || {
                r.fetch_add(1, Ordering::SeqCst) + 1 < 3
            })
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while runs.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_panicking_job_does_not_kill_the_service_lcore() {
        let service = ServiceLcore::start(None).unwrap();
        let t = service.submit(|| -> u8 { panic!("bad job") }).unwrap();
        assert_eq!(
            t.wait(),
            Err(LcoreError::Panicked {
                name: "railshift-service".into(),
                message: "bad job".into()
            })
        );
        assert_eq!(service.submit(|| 5).unwrap().wait().unwrap(), 5);
    }

    #[test]
    fn an_idle_poller_parks_and_an_event_wakes_it() {
        let policy = IdlePolicy {
            park_after: Some(Duration::ZERO),
            max_park: Duration::from_secs(5),
        };
        let mut poller = Poller::new(policy);
        let unparker = poller.unparker();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            unparker.unpark();
        });
        let start = Instant::now();
        while poller.parks() == 0 {
            poller.idle();
        }
        // Woken by the event long before the 5 s bound.
        assert!(start.elapsed() < Duration::from_secs(4));
        waker.join().unwrap();
        poller.busy();
    }
}
