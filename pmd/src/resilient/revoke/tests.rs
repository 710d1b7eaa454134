//! Revocation against the fake provider on both devices: what each device says is under the
//! test's control (`fail_destroy`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::control::{Context, ContextConfig};
use crate::memory::{HugepagePolicy, MemoryPool};
use crate::provider::testing::{FakeProvider, Shared};
use crate::resilient::{Clock, FailoverService, PeerAttrs, ResilientConfig, ResilientContext};
use crate::verbs::{Access, QpCaps};

struct Rig {
    default_fake: Arc<FakeProvider>,
    backup_fake: Arc<FakeProvider>,
    service: FailoverService,
    ctx: ResilientContext,
}

fn device() -> (Arc<FakeProvider>, Arc<Context>) {
    let pool = MemoryPool::new(HugepagePolicy::Never);
    let fake = FakeProvider::new(&pool);
    let ctx = Context::with_provider(
        Box::new(Shared(fake.clone())),
        pool,
        &ContextConfig::default(),
    );
    (fake, ctx)
}

fn rig() -> Rig {
    let (default_fake, default) = device();
    let (backup_fake, backup) = device();
    let service = FailoverService::manual(Clock::real()).unwrap();
    let config = ResilientConfig {
        link_watch: false,
        ..ResilientConfig::default()
    };
    let ctx = ResilientContext::new(default, Some(backup), &service, config, None);
    Rig {
        default_fake,
        backup_fake,
        service,
        ctx,
    }
}

impl Rig {
    /// Runs the shadow verbs submitted so far.
    fn settle(&self) {
        for _ in 0..4 {
            self.service.run_once();
        }
    }

    fn refuse(&self, backup: bool, default: bool) {
        self.backup_fake
            .fail_destroy
            .store(backup, Ordering::Relaxed);
        self.default_fake
            .fail_destroy
            .store(default, Ordering::Relaxed);
    }
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 8,
        max_recv_wr: 4,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

#[test]
fn a_buffer_whose_backup_dereg_is_refused_is_never_handed_out_again() {
    let r = rig();
    let pd = r.ctx.alloc_pd().unwrap();
    r.settle();
    let buf = pd.alloc_buffer(8192, Access::ALL).unwrap();
    r.settle();
    let addr = buf.addr();
    let backup_mrs = r.backup_fake.live_objects();
    r.refuse(true, false);
    drop(buf);
    r.refuse(false, false);
    // The backup device still holds its registration of the memory...
    assert_eq!(r.backup_fake.live_objects(), backup_mrs);
    // ... so the pool (first fit: it would hand the same block out first) must not.
    let bufs: Vec<_> = (0..4)
        .map(|_| pd.alloc_buffer(8192, Access::ALL).unwrap())
        .collect();
    for b in &bufs {
        let (start, end) = (b.addr(), b.addr() + b.len() as u64);
        assert!(
            end <= addr || start >= addr + 8192,
            "{start:#x}..{end:#x} reuses {addr:#x}, which the backup device may still reach"
        );
    }
    let backup = r.ctx.backup_context().unwrap();
    assert_eq!(backup.stats().quarantined_blocks(), 1);
    assert_eq!(r.ctx.default_context().stats().quarantined_blocks(), 0);
}

#[test]
fn an_explicit_deregister_names_the_device_that_refused_and_unpublishes_the_keys_anyway() {
    let r = rig();
    let pd = r.ctx.alloc_pd().unwrap();
    r.settle();
    let buf = pd.alloc_buffer(4096, Access::ALL).unwrap();
    // SAFETY: the buffer's memory outlives both MRs (the fake devices never touch it).
    let (kept, refused, ok) = unsafe {
        (
            pd.register(buf.as_ptr(), 64, Access::ALL).unwrap(),
            pd.register(buf.as_ptr(), 64, Access::ALL).unwrap(),
            pd.register(buf.as_ptr(), 64, Access::ALL).unwrap(),
        )
    };
    let mut qp = pd.create_qp(caps()).unwrap();
    r.settle();
    let published = |qp: &crate::resilient::ResilientQp| {
        let blob = qp
            .try_rendezvous_blob()
            .unwrap()
            .expect("backup side created");
        PeerAttrs::parse(&blob)
            .unwrap()
            .rkeys
            .iter()
            .map(|(d, _)| *d)
            .collect::<Vec<_>>()
    };
    let before = published(&qp);
    assert!(before.contains(&refused.rkey()) && before.contains(&ok.rkey()));
    assert_eq!(ok.deregister(), Ok(()));
    let refused_rkey = refused.rkey();
    r.refuse(true, false);
    let err = refused.deregister().unwrap_err();
    r.refuse(false, false);
    assert!(err.default.is_none(), "{err}");
    let backup_err = err.backup.as_ref().expect("the backup device refused");
    assert!(backup_err.to_string().contains("dereg_mr"), "{backup_err}");
    assert!(err.to_string().contains("backup device"), "{err}");
    // Fail closed: the refused registration's keys are gone from the mappings all the same.
    let after = published(&qp);
    assert!(!after.contains(&refused_rkey), "{after:x?}");
    assert!(after.contains(&kept.rkey()));
    qp.progress();
}

#[test]
fn a_revoke_a_device_refuses_is_fenced_with_its_context_and_never_destroyed() {
    use crate::resilient::{Grant, Leases, QuarantinePhase, RevokeOutcome};
    let r = rig();
    let pd = r.ctx.alloc_pd().unwrap();
    r.settle();
    let buf = pd.alloc_buffer(4096, Access::ALL).unwrap();
    let qp = pd.create_qp(caps()).unwrap();
    r.settle();
    let mut leases = Leases::new(Clock::real(), std::time::Duration::ZERO);
    let id = leases.grant(qp, vec![Grant::Buffer(buf)]);
    let objects = r.backup_fake.live_objects();
    r.refuse(true, false);
    let outcome = leases.revoke(id);
    r.refuse(false, false);
    let RevokeOutcome::Fenced(quarantine) = outcome else {
        panic!("not fenced: {outcome:?}");
    };
    assert_eq!(
        (quarantine.lease, quarantine.phase),
        (id, QuarantinePhase::Revoke)
    );
    assert!(
        quarantine
            .failures
            .iter()
            .any(|f| f.step.contains("backup device") && f.error.contains("dereg_mr")),
        "{:?}",
        quarantine.failures
    );
    assert_eq!(leases.revoke(id), RevokeOutcome::NotFound);
    // Never swept: the backup device keeps everything it held, the failure context stays.
    assert_eq!(leases.sweep(), 0);
    assert_eq!(r.backup_fake.live_objects(), objects);
    assert_eq!(leases.fenced().count(), 1);
}

#[test]
fn a_clean_revoke_is_torn_down_and_swept_after_the_grace_period() {
    use crate::resilient::{Grant, Leases, RevokeOutcome};
    let r = rig();
    let pd = r.ctx.alloc_pd().unwrap();
    r.settle();
    let buf = pd.alloc_buffer(4096, Access::ALL).unwrap();
    let qp = pd.create_qp(caps()).unwrap();
    r.settle();
    let mut leases = Leases::new(Clock::real(), std::time::Duration::from_secs(3600));
    let id = leases.grant(qp, vec![Grant::Buffer(buf)]);
    assert_eq!(leases.revoke(id), RevokeOutcome::TornDown);
    // Deferred: within the grace period nothing is destroyed.
    assert_eq!((leases.sweep(), leases.draining()), (0, 1));
    assert!(leases.qp(id).is_none() && leases.memory(id).is_none());
}

#[test]
fn a_revoke_before_the_owner_took_the_backup_side_moves_that_backup_qp_to_err() {
    use crate::qp_state::QpState;
    use crate::resilient::{Grant, Leases, RevokeOutcome};
    use crate::verbs::{AddressVector, Mtu, QpAttr};
    let r = rig();
    let pd = r.ctx.alloc_pd().unwrap();
    r.settle();
    let buf = pd.alloc_buffer(4096, Access::ALL).unwrap();
    let mut a = pd.create_qp(caps()).unwrap();
    let mut b = pd.create_qp(caps()).unwrap();
    r.settle();
    let blob = |qp: &crate::resilient::ResilientQp| qp.try_rendezvous_blob().unwrap().unwrap();
    let (blob_a, blob_b) = (blob(&a), blob(&b));
    a.connect_backup(&blob_b).unwrap();
    b.connect_backup(&blob_a).unwrap();
    let backup_qpn = PeerAttrs::parse(&blob_a).unwrap().backup_qpn;
    let gid = PeerAttrs::parse(&blob_b).unwrap().default_gid;
    a.modify(QpState::Init, &QpAttr::init(Access::ALL)).unwrap();
    let rtr = QpAttr::rtr(AddressVector::to_gid(gid), b.qpn(), 0, Mtu::Mtu1024);
    a.modify(QpState::Rtr, &rtr).unwrap();
    a.modify(QpState::Rts, &QpAttr::rts(0)).unwrap();
    // The service connects the backup QP and hands it over by mail; the owner, which has
    // not polled since, has not taken it.
    r.settle();
    assert_eq!(r.backup_fake.qp(backup_qpn).state, QpState::Rts);
    let mut leases = Leases::new(Clock::real(), std::time::Duration::from_secs(3600));
    let id = leases.grant(a, vec![Grant::Buffer(buf)]);
    assert_eq!(leases.revoke(id), RevokeOutcome::TornDown);
    // Not connected to the peer's backup QP for the grace period: in ERR at once.
    assert_eq!(r.backup_fake.qp(backup_qpn).state, QpState::Err);
    drop(b);
}
