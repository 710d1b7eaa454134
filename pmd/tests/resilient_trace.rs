//! The failover trace, alone in its own test binary: `tracing` caches each callsite's
//! interest process-wide, so a scoped subscriber in one test among many threads can miss
//! events another thread's callsite registration decided for it (CI saw 0 events where 2
//! were due). One test per process makes the capture exact.

mod sim;

use std::time::Duration;

use sim::traffic::{assert_clean, nccl, step};
use sim::*;

/// One `tracing` event's fields (the message among them), as text.
type Fields = Vec<(String, String)>;

/// Every `tracing` event seen.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<Fields>>>);

struct FieldText<'a>(&'a mut Fields);

impl tracing::field::Visit for FieldText<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .push((field.name().to_string(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push((field.name().to_string(), value.to_string()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Captured {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut FieldText(&mut fields));
        self.0.lock().unwrap().push(fields);
    }
}

#[test]
fn a_failover_is_traced_with_its_qp_device_cause_wqes_copied_and_time_taken() {
    use tracing_subscriber::layer::SubscriberExt;
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let mut sim = Sim::new(14, config());
    let mut t = nccl(&sim, 30);
    let mut down = false;
    tracing::subscriber::with_default(subscriber, || {
        assert!(sim.run_until(Duration::from_secs(2), |s| {
            if !down && t.dirs[0].completed >= 10 {
                s.link_down(A_DEFAULT, None);
                down = true;
            }
            step(&mut t, s)
        }));
    });
    assert_clean(&mut t, &mut sim);
    let events = captured.0.lock().unwrap();
    let moved: Vec<_> = events
        .iter()
        .filter(|f| {
            f.iter()
                .any(|(k, v)| k == "message" && v == "failover: traffic moved to the backup QP")
        })
        .collect();
    // One per end: A saw its link go down, B heard it from A.
    assert_eq!(moved.len(), 2, "{events:#?}");
    let a = moved
        .iter()
        .find(|f| f.iter().any(|(k, v)| k == "cause" && v == "link-down"))
        .expect("A's event names the link going down");
    let value = |key: &str| {
        a.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no field {key} in {a:?}"))
    };
    assert_eq!(value("device"), sim.a.devices[0].name());
    assert!(
        value("qp").contains(&format!("{:#x}", sim.a.qp.qpn())),
        "{}",
        value("qp")
    );
    let stats = sim.a.qp.stats();
    assert_eq!(
        value("wqes_retransmitted"),
        stats.wqes_retransmitted.to_string()
    );
    assert_eq!(value("wqes_copied"), stats.wqes_copied.to_string());
    assert!(value("elapsed_us").parse::<f64>().unwrap() >= 0.0);
}
