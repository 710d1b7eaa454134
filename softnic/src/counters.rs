//! Counters per device and per QP. Updated by the engine under the device lock (one lock per
//! round, not per packet) and read as snapshots.

/// NAKs by kind (AETH syndrome).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NakCounts {
    /// PSN sequence error.
    pub psn_sequence: u64,
    /// Receiver not ready.
    pub rnr: u64,
    /// Invalid request.
    pub invalid_request: u64,
    /// Remote access error.
    pub remote_access: u64,
    /// Remote operational error.
    pub remote_operational: u64,
}

impl NakCounts {
    fn add(&mut self, o: &NakCounts) {
        self.psn_sequence += o.psn_sequence;
        self.rnr += o.rnr;
        self.invalid_request += o.invalid_request;
        self.remote_access += o.remote_access;
        self.remote_operational += o.remote_operational;
    }

    /// All kinds together.
    pub fn total(&self) -> u64 {
        self.psn_sequence
            + self.rnr
            + self.invalid_request
            + self.remote_access
            + self.remote_operational
    }
}

/// Traffic and error counters, the same set for a device and for one QP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets sent (including retransmissions, ACKs and read responses).
    pub tx_packets: u64,
    /// UDP payload bytes sent.
    pub tx_bytes: u64,
    /// Packets received and accepted by ICRC and parsing.
    pub rx_packets: u64,
    /// UDP payload bytes received.
    pub rx_bytes: u64,
    /// Request packets sent again by go-back-N.
    pub retransmitted_packets: u64,
    /// Local ACK timeouts that fired.
    pub timeouts: u64,
    /// Short retransmit timers (armed after a re-post) that fired.
    pub short_timeouts: u64,
    /// Resends of a retransmit probe (`Device::set_retransmit_probe`, `Device::retransmit_now`).
    pub probe_resends: u64,
    /// Losses that halved the requester's congestion window (each go-back-N after a
    /// PSN-sequence NAK, a lost READ response or a local ACK timeout).
    pub window_cuts: u64,
    /// NAKs this side sent.
    pub naks_sent: NakCounts,
    /// NAKs this side received.
    pub naks_received: NakCounts,
    /// Duplicate requests received (re-ACKed, re-read or replayed, never re-executed).
    pub duplicate_requests: u64,
    /// Duplicate READs and atomics dropped because no recorded READ or atomic (the last
    /// `max_dest_rd_atomic`) matches what they ask for.
    pub unmatched_duplicates: u64,
    /// Packets dropped silently while a PSN gap was open (after its one NAK).
    pub out_of_sequence_drops: u64,
    /// RNR waits this side's requester went through (one per RNR NAK acted on).
    pub rnr_waits: u64,
    /// Packets dropped for a wrong ICRC.
    pub icrc_errors: u64,
    /// Packets dropped because they could not be parsed or made no sense for the QP.
    pub malformed_drops: u64,
    /// Responses dropped because their PSN is not outstanding: behind the oldest
    /// unacknowledged PSN (a late duplicate, or forged) or at or past the next PSN never sent
    /// (forged). Never acted on.
    pub response_psn_drops: u64,
    /// Responses dropped because their opcode does not fit the request at their PSN (a READ
    /// response where no READ is outstanding, an atomic ACK not at an atomic's PSN).
    pub response_opcode_drops: u64,
    /// NAKs that would end the connection (invalid request, remote access, remote
    /// operational) dropped because their MSN is not the count of messages before their PSN.
    pub nak_msn_drops: u64,
    /// Packets from the peer's address but not from the UDP source port it sends from.
    pub source_port_drops: u64,
    /// Packets dropped because no QP has their destination QPN.
    pub unknown_qpn_drops: u64,
    /// UD datagrams dropped because they do not carry the receiving QP's Q_Key.
    pub qkey_drops: u64,
    /// UD datagrams dropped because no receive was posted (UD has no RNR: the sender never
    /// knows).
    pub no_receive_drops: u64,
    /// Packets dropped because their P_Key is not of the default partition.
    pub pkey_drops: u64,
    /// Packets not sent or not received because the port was down.
    pub port_down_drops: u64,
    /// Times a CQ was full when a CQE had to be written.
    pub cq_overruns: u64,
    /// Times a round's service pass visited the QP (timers, flushes, the requester): only
    /// QPs with something to do are visited, so an idle QP's count stays put.
    pub round_visits: u64,
}

impl Counters {
    /// Adds another set of counters into this one.
    pub fn add(&mut self, o: &Counters) {
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.retransmitted_packets += o.retransmitted_packets;
        self.timeouts += o.timeouts;
        self.short_timeouts += o.short_timeouts;
        self.probe_resends += o.probe_resends;
        self.window_cuts += o.window_cuts;
        self.naks_sent.add(&o.naks_sent);
        self.naks_received.add(&o.naks_received);
        self.duplicate_requests += o.duplicate_requests;
        self.unmatched_duplicates += o.unmatched_duplicates;
        self.out_of_sequence_drops += o.out_of_sequence_drops;
        self.rnr_waits += o.rnr_waits;
        self.icrc_errors += o.icrc_errors;
        self.malformed_drops += o.malformed_drops;
        self.response_psn_drops += o.response_psn_drops;
        self.response_opcode_drops += o.response_opcode_drops;
        self.nak_msn_drops += o.nak_msn_drops;
        self.source_port_drops += o.source_port_drops;
        self.unknown_qpn_drops += o.unknown_qpn_drops;
        self.qkey_drops += o.qkey_drops;
        self.no_receive_drops += o.no_receive_drops;
        self.pkey_drops += o.pkey_drops;
        self.port_down_drops += o.port_down_drops;
        self.cq_overruns += o.cq_overruns;
        self.round_visits += o.round_visits;
    }
}
