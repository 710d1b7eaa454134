//! perftest-style tools (write, send, read and atomic bandwidth and latency) and a collective
//! ring-allreduce workload on the railshift driver, with HdrHistogram latency reports, a
//! bandwidth timeline and JSON output.
