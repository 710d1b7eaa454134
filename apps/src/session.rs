//! Setting up one connection the way every point-to-point tool does: open the devices,
//! register the buffer, create the QP, exchange attributes over TCP, bring the QP up, and
//! the idle policy of the polling loop. Also the header block perftest prints.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pmd::lcore::{IdlePolicy, Poller};
use pmd::provider::ProgressModel;
use pmd::{Mtu, QpCaps};

use crate::cli::{Options, PollMode, Tool};
use crate::endpoint::{agree_mtu, mtu_of, Conn, DeviceOptions, Host, Memory};
use crate::error::AppError;
use crate::exchange::{self, Channel, Hello, Params, QpInfo};
use crate::perftest_exchange::{self as perftest, BwReport, Keys, PerftestLink};
use crate::report::RULE;
pub use crate::service_pacer::ServicePacer;
use crate::wall_clock::unix_ms_now;

/// How long the peer may take to answer during setup.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(30);

/// How the polling loop waits when a round found nothing, and (run-to-completion) who does
/// the failover service's work.
#[derive(Debug)]
pub struct Idle {
    mode: PollMode,
    poller: Poller,
    /// The failover service this lcore runs itself (run-to-completion), if any.
    service: Option<Arc<ServicePacer>>,
}

impl Idle {
    /// The policy for `mode`; with run-to-completion (`host` has a service without a thread
    /// of its own) this loop also runs the service's rounds.
    pub fn new(mode: PollMode, host: &Host) -> Idle {
        Idle {
            mode,
            poller: Poller::new(IdlePolicy::default()),
            service: host.service_pacer().cloned(),
        }
    }

    /// The last round did work.
    #[inline]
    pub fn busy(&mut self) {
        self.run_service();
        if self.mode == PollMode::Adaptive {
            self.poller.busy();
        }
    }

    /// The last round found nothing.
    #[inline]
    pub fn idle(&mut self) {
        self.run_service();
        match self.mode {
            PollMode::Busy => std::hint::spin_loop(),
            PollMode::Adaptive => self.poller.idle(),
        }
    }

    #[inline]
    fn run_service(&mut self) {
        if let Some(pacer) = &self.service {
            pacer.round_ended();
        }
    }

    /// A handle the failover service uses to wake a parked poller.
    pub fn unparker(&self) -> crossbeam_utils::sync::Unparker {
        self.poller.unparker()
    }
}

/// Pins the calling thread (the polling lcore) to `core`.
pub fn pin(core: usize) -> Result<(), AppError> {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    if !ids.iter().any(|c| c.id == core) {
        return Err(AppError::Verbs(format!(
            "--cpu {core}: no such core (this machine has {})",
            ids.len()
        )));
    }
    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        return Err(AppError::Verbs(format!("--cpu {core}: cannot pin to it")));
    }
    Ok(())
}

/// The device options the flags ask for. Latency tools without a backup device drive the
/// softnic from their polling loop (manual progress), and so do the bandwidth tools'
/// `--no-failover` runs with `--poll busy`, so that the baseline of a run-to-completion run
/// drives its device the same way; every resilient run with `--poll busy` is run-to-completion
/// (the polling lcore drives both devices, every QP's failover and the failover service's
/// link watch, control QPs and timers; docs/apps.md). Everything else runs softnic engines,
/// and so does the server of `shift_read_lat`, whose CPU takes no part in a READ (its engine
/// answers at once and sleeps in between).
pub fn device_options(o: &Options) -> DeviceOptions {
    let passive = o.tool == Tool::ReadLat && o.is_server();
    let busy = o.flags.poll == PollMode::Busy;
    let run_to_completion = o.failover_enabled() && busy;
    let plain = !o.failover_enabled();
    let manual = (o.tool.is_latency() && plain && !passive)
        || (o.tool.is_bandwidth() && o.flags.no_failover && busy)
        || run_to_completion;
    DeviceOptions {
        run_to_completion,
        device: o.device.clone(),
        backup: o.flags.backup_dev.clone(),
        failover: o.failover_enabled(),
        progress: if manual {
            ProgressModel::Manual
        } else {
            ProgressModel::Auto
        },
        gid_index: o.flags.gid_index,
        holddown: o.flags.holddown_ms.map(std::time::Duration::from_millis),
        outage_tolerance: o
            .flags
            .outage_tolerance_ms
            .map(std::time::Duration::from_millis),
        qps: o.flags.qps + o.flags.idle_qps,
        management_addr: o.flags.management_addr,
    }
}

/// The report's name for how [`device_options`] has the devices and the failover work driven.
pub fn progress_name(o: &Options) -> &'static str {
    let d = device_options(o);
    match (d.run_to_completion, d.progress) {
        (true, _) => "run-to-completion",
        (false, ProgressModel::Manual) => "manual",
        (false, _) => "engines",
    }
}

/// The parameters both sides must agree on.
pub fn params(o: &Options) -> Params {
    Params {
        tool: o.tool.name().to_owned(),
        sizes: o.sizes.clone(),
        check: o.flags.check,
        failover: o.failover_enabled(),
        ranks: o.flags.ranks,
        qps: o.flags.qps,
        bidirectional: o.flags.bidirectional,
        idle_qps: o.flags.idle_qps,
    }
}

/// READs and atomics our responder takes outstanding (softnic's atomic replay cache; the
/// pmd's `QpAttr::rtr`), as a perftest peer's `out_reads`.
pub const PERFTEST_OUT_READS: u8 = 16;

/// The out-of-band connection: railshift's exchange, or stock perftest's.
#[derive(Debug)]
pub enum Oob {
    /// A railshift peer.
    Railshift(Channel),
    /// A stock perftest peer (`--perftest-peer`).
    Perftest(Box<PerftestLink>),
}

/// A connected point-to-point session: `-q` QPs sharing one buffer. Fields drop in order:
/// the QPs before their memory, the memory before the devices.
pub struct Session {
    /// The QPs (`-q`; one for the latency tools).
    pub conns: Vec<Conn>,
    /// The registered buffer.
    pub mem: Memory,
    /// The devices.
    pub host: Host,
    /// The out-of-band connection.
    pub oob: Oob,
    /// Our attributes, per QP.
    pub ours: Vec<QpInfo>,
    /// The peer's, per QP.
    pub peers: Vec<QpInfo>,
    /// The peer's first QP (its buffer is the same for all).
    pub peer: QpInfo,
    /// The path MTU in use.
    pub mtu: Mtu,
    /// When setup finished, Unix ms.
    pub start_unix_ms: f64,
}

/// A loop over many QPs runs a round of the devices before the first QP and then after every
/// this many ([`Session::poll_qp`]), instead of after each QP whose poll found nothing: at
/// 1,000 QPs that was 2,000 device rounds per loop, each with its receive system call and a
/// walk over the device's active QPs. Often enough that what a QP's poll
/// posted (a control message, a retransmission) leaves before the loop has visited many more.
pub const PROGRESS_EVERY_QPS: usize = 32;

impl Session {
    /// Polls QP `q` of a loop over all of them (failover work included), running a round of
    /// the devices first when `q` is a multiple of [`PROGRESS_EVERY_QPS`], and then, in
    /// run-to-completion, the failover service's round if it is due ([`ServicePacer`]) and
    /// the failover work of every QP it delivered mail to.
    #[inline]
    pub fn poll_qp(&mut self, q: usize, wcs: &mut [pmd::WorkCompletion]) -> usize {
        if q % PROGRESS_EVERY_QPS == 0 {
            self.host.progress();
            let served = self.host.service_pacer().is_some_and(|pacer| {
                if q > 0 {
                    pacer.within_round();
                }
                // Also a round run at the end of the last pass (`Idle`).
                pacer.take_ran()
            });
            if served {
                // What the service just delivered (the peer's half of a handshake) is acted
                // on now, not when this loop comes round to each QP again: at 1,000 QPs
                // that wait was a whole polling round per step of every handshake.
                for conn in &mut self.conns {
                    conn.take_failover_mail();
                }
            }
        }
        self.conns[q].poll_only(wcs)
    }

    /// Sets up a session whose buffer is `buffer_len` bytes and whose QPs have `caps`.
    /// `prepare` fills the buffer before the peer learns its address, so nothing the peer
    /// does (a READ, say) can see it half-written.
    pub fn establish(
        o: &Options,
        buffer_len: usize,
        caps: QpCaps,
        prepare: impl FnOnce(&Memory),
    ) -> Result<Session, AppError> {
        let host = Host::open(&device_options(o))?;
        let wanted_mtu = match o.flags.mtu {
            Some(m) => mtu_of(m).expect("checked by the flags"),
            None => host.active_mtu(),
        };
        if o.flags.perftest_peer {
            return Session::establish_perftest(o, host, wanted_mtu, buffer_len, caps, prepare);
        }
        let mem = host.alloc(buffer_len)?;
        prepare(&mem);
        let mut conns = Vec::new();
        let mut ours = Vec::new();
        // The idle QPs (`--idle-qps`) come after the ones that carry traffic.
        for _ in 0..o.flags.qps + o.flags.idle_qps {
            let conn = host.create_qp(caps)?;
            ours.push(conn.local_info(host.gid(), pmd::random_psn(), &mem, wanted_mtu)?);
            conns.push(conn);
        }
        let hello = Hello::new(params(o), ours.clone());
        let mut chan = match &o.flags.host {
            None => {
                let listener = exchange::listen(o.flags.port)?;
                exchange::print_waiting();
                exchange::accept(&listener)?
            }
            Some(server) => exchange::connect(server, o.flags.port)?,
        };
        let theirs = chan.handshake(&hello, PEER_TIMEOUT)?;
        if theirs.qps.len() != conns.len() {
            return Err(AppError::Peer(format!(
                "the peer sent {} QPs for -q {}",
                theirs.qps.len(),
                conns.len()
            )));
        }
        let peers = theirs.qps;
        let mtu = agree_mtu(
            wanted_mtu,
            peers.iter().map(|p| p.mtu).min().unwrap_or(4096),
        );
        let mut s = Session {
            conns,
            mem,
            host,
            oob: Oob::Railshift(chan),
            peer: peers[0].clone(),
            peers,
            ours,
            mtu,
            start_unix_ms: 0.0,
        };
        if let Err(e) = s.bring_up(o.flags.qp_timeout) {
            let _ = s.chan()?.send(&exchange::Msg::Abort {
                error: e.to_string(),
            });
            return Err(e);
        }
        s.chan()?.sync_ready(PEER_TIMEOUT)?;
        s.start_unix_ms = unix_ms_now();
        Ok(s)
    }

    /// The setup with a stock perftest peer (`--perftest-peer`, one plain QP): perftest's
    /// version, system data and MTU exchange first (the buffer must cover the cycle buffer
    /// the two agree on), then the keys, the QP up, and every synchronisation of the tool's
    /// script but the last, which [`Session::ready_to_run`] makes once receives are posted.
    fn establish_perftest(
        o: &Options,
        host: Host,
        wanted_mtu: Mtu,
        buffer_len: usize,
        caps: QpCaps,
        prepare: impl FnOnce(&Memory),
    ) -> Result<Session, AppError> {
        let mut link =
            PerftestLink::open(o.tool, o.flags.host.as_deref(), o.flags.port, wanted_mtu)?;
        let size = *o.sizes.iter().max().expect("a size");
        let peer_len = perftest::peer_buffer_len(size, link.cycle_buffer);
        let mem = host.alloc(buffer_len.max(peer_len as usize))?;
        prepare(&mem);
        let mut conn = host.create_qp(caps)?;
        let ours = conn.local_info(host.gid(), pmd::random_psn(), &mem, link.mtu)?;
        let keys = Keys {
            lid: 0,
            out_reads: u16::from(PERFTEST_OUT_READS),
            qpn: ours.qpn,
            psn: ours.psn,
            rkey: ours.rkey,
            vaddr: ours.addr,
            gid: host.gid(),
            srqn: 0,
        };
        let theirs = link.keys(&keys, &mut || {})?;
        let v4 = |g: pmd::Gid| g.to_ip().is_ipv4();
        if v4(theirs.gid) != v4(keys.gid) {
            return Err(AppError::Peer(format!(
                "the perftest peer's GID {} and ours {} are not both IPv4 or both IPv6 (perftest's -x picks the GID)",
                theirs.gid, keys.gid
            )));
        }
        let peer = QpInfo {
            qpn: theirs.qpn,
            psn: theirs.psn,
            gid: perftest::gid_text(theirs.gid),
            rkey: theirs.rkey,
            addr: theirs.vaddr,
            len: peer_len,
            mtu: link.mtu.bytes(),
            backup: None,
        };
        // Our requester keeps to what the peer's responder said it takes.
        let rd_atomic = (theirs.out_reads.clamp(1, u16::from(PERFTEST_OUT_READS))) as u8;
        conn.bring_up_with(&ours, &peer, link.mtu, o.flags.qp_timeout, rd_atomic)?;
        for _ in 2..link.script.before_run {
            link.sync(&mut || {})?;
        }
        let mtu = link.mtu;
        Ok(Session {
            conns: vec![conn],
            mem,
            host,
            oob: Oob::Perftest(Box::new(link)),
            peer: peer.clone(),
            peers: vec![peer],
            ours: vec![ours],
            mtu,
            start_unix_ms: 0.0,
        })
    }

    /// The railshift exchange (every step but a stock perftest peer's).
    pub fn chan(&mut self) -> Result<&mut Channel, AppError> {
        match &mut self.oob {
            Oob::Railshift(c) => Ok(c),
            Oob::Perftest(_) => Err(AppError::Peer(
                "this step is railshift's own; a stock perftest peer has no part in it".into(),
            )),
        }
    }

    /// Whether the peer is stock perftest.
    pub fn is_perftest(&self) -> bool {
        matches!(self.oob, Oob::Perftest(_))
    }

    /// The last synchronisation before the traffic: with a perftest peer, its last key
    /// exchange, made once this side's receives are posted (a railshift peer's `ready` came
    /// in [`Session::establish`]).
    pub fn ready_to_run(&mut self) -> Result<(), AppError> {
        if let Oob::Perftest(link) = &mut self.oob {
            link.sync(&mut || {})?;
            self.start_unix_ms = unix_ms_now();
        }
        Ok(())
    }

    /// The end of a run with a perftest peer, driving the device while the peer finishes:
    /// the result exchange of the bandwidth tools (`ours` out; the peer's comes back), then
    /// perftest's close, or for `ib_write_lat` (no closing exchange) waiting until the peer
    /// hangs up. `None` with a railshift peer.
    pub fn finish_perftest(
        &mut self,
        ours: Option<BwReport>,
    ) -> Result<Option<BwReport>, AppError> {
        let Session { oob, conns, .. } = self;
        let Oob::Perftest(link) = oob else {
            return Ok(None);
        };
        let mut wcs = [pmd::WorkCompletion::EMPTY; 16];
        let mut tick = || {
            for c in conns.iter_mut() {
                c.poll(&mut wcs);
            }
        };
        let script = link.script;
        if !script.close {
            link.linger(&mut tick, Duration::from_secs(10));
            return Ok(None);
        }
        let mut theirs = None;
        if script.reports {
            link.sync(&mut tick)?;
            let mine = ours.unwrap_or(BwReport {
                size: 0,
                iters: 0,
                bw_peak: 0.0,
                bw_avg: 0.0,
                msg_rate: 0.0,
            });
            theirs = Some(link.reports(&mine, &mut tick)?);
        }
        link.close(&mut tick)?;
        Ok(theirs)
    }

    /// Every QP up first, then every resilient QP protected (the peer's bring-ups may wait
    /// on ours).
    fn bring_up(&mut self, timeout: u8) -> Result<(), AppError> {
        for ((conn, ours), peer) in self.conns.iter_mut().zip(&self.ours).zip(&self.peers) {
            conn.bring_up(ours, peer, self.mtu, timeout)?;
        }
        for conn in &mut self.conns {
            conn.wait_protected()?;
        }
        Ok(())
    }

    /// The worst failover state of the QPs, as the timeline names it.
    pub fn state(&self, failed: bool) -> &'static str {
        crate::endpoint::worst_state(self.conns.iter().map(|c| c.state(failed)))
    }

    /// The failover section: every QP's counters and events together.
    pub fn failover_json(&self, start_unix_ms: f64) -> crate::report::FailoverJson {
        let mut fo = crate::report::FailoverJson::default();
        for c in &self.conns {
            fo.merge(crate::report::FailoverJson::new(
                c.stats(),
                c.events(),
                start_unix_ms,
            ));
        }
        fo
    }

    /// perftest's header block.
    pub fn print_header(&self, o: &Options, tx_depth: u32, cq_mod: u32) {
        print_title_and_devices(o);
        let idle = o.flags.idle_qps;
        let qps = match idle {
            0 => self.conns.len().to_string(),
            _ => format!("{} (+{idle} idle)", self.conns.len() - idle as usize),
        };
        say!(" Number of qps   : {qps}\t\tTransport type : IB");
        say!(" Connection type : RC\t\tUsing SRQ      : OFF");
        say!(
            " Role            : {}",
            if o.is_server() { "server" } else { "client" }
        );
        say!(" TX depth        : {tx_depth}");
        say!(" CQ Moderation   : {cq_mod}");
        say!(" Mtu             : {}[B]", self.mtu.bytes());
        say!(" Link type       : Ethernet (RoCEv2)");
        say!(" GID index       : {}", o.flags.gid_index);
        say!(" Max inline data : {}[B]", o.inline_size);
        say!(" Data ex. method : Ethernet (TCP port {})", o.flags.port);
        if let Oob::Perftest(link) = &self.oob {
            say!(
                " Peer            : stock perftest {}: its exchange, plain QPs; a perftest peer cannot take part in failover",
                link.peer_version.text
            );
        }
        say!(
            " Polling         : {:?}{}",
            o.flags.poll,
            match o.flags.cpu {
                Some(c) => format!(", lcore pinned to core {c}"),
                None => String::new(),
            }
        );
        say!("{RULE}");
        let line = |who: &str, q: &QpInfo| {
            say!(
                " {who} address: QPN {:#06x} PSN {:#08x} RKey {:#08x} VAddr {:#016x}",
                q.qpn,
                q.psn,
                q.rkey,
                q.addr
            );
            say!(" GID: {}", q.gid);
        };
        for q in &self.ours {
            line("local", q);
        }
        for q in &self.peers {
            line("remote", q);
        }
        say!("{RULE}");
    }
}

/// The first lines of every tool's header: the rule, the title, the devices.
pub fn print_title_and_devices(o: &Options) {
    say!("{RULE}");
    say!("                    {}", o.tool.title());
    say!(" Device          : {}", o.device);
    say!(
        " Backup device   : {}",
        match (&o.flags.backup_dev, o.failover_enabled()) {
            (Some(b), _) if o.flags.perftest_peer => {
                format!("{b} (unused with a stock perftest peer)")
            }
            (Some(b), true) => format!("{b} (resilient QPs, failover on)"),
            (Some(b), false) => format!("{b} (unused: --no-failover)"),
            (None, _) => "none (plain QPs)".to_owned(),
        }
    );
}

/// Watches the out-of-band connection during a run without blocking the polling loop.
#[derive(Debug)]
pub struct PeerWatch {
    next: Instant,
    every: Duration,
}

impl PeerWatch {
    /// Checks at most every `every`.
    pub fn new(every: Duration) -> PeerWatch {
        PeerWatch {
            next: Instant::now(),
            every,
        }
    }

    /// A message, or `Closed`, if one is there and a check is due. A perftest peer's next
    /// key exchange, which it starts once its traffic is done, reads as `done`.
    pub fn check(
        &mut self,
        now: Instant,
        oob: &mut Oob,
    ) -> Result<Option<exchange::Msg>, exchange::ExchangeError> {
        if now < self.next {
            return Ok(None);
        }
        self.next = now + self.every;
        match oob {
            Oob::Railshift(chan) => chan.try_recv(),
            Oob::Perftest(link) => Ok(link.peer_synced()?.then_some(exchange::Msg::Done {
                iterations: 0,
                rows: Vec::new(),
            })),
        }
    }
}

/// What a tool's options say about a run's length.
#[derive(Debug, Clone, Copy)]
pub enum Length {
    /// A number of iterations.
    Iters(u64),
    /// A wall time.
    Duration(Duration),
}

impl Length {
    /// The length `o` asks for.
    pub fn of(o: &Options) -> Length {
        match o.flags.duration {
            Some(d) => Length::Duration(Duration::from_secs_f64(d)),
            None => Length::Iters(o.iters),
        }
    }

    /// Whether iteration `i` (0-based) should still be started at `now`.
    #[inline]
    pub fn wants(&self, i: u64, start: Instant, now: Instant) -> bool {
        match *self {
            Length::Iters(n) => i < n,
            Length::Duration(d) => now.duration_since(start) < d,
        }
    }
}
