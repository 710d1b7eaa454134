//! railshift's poll-mode driver.
//!
//! Providers (the softnic and, behind the `mlx5` feature, ConnectX NICs through rdma-sys and
//! mlx5dv) hand the driver raw queue memory; the driver writes work-queue entries, rings
//! doorbells and polls completions itself on pinned lcores. The SHIFT failover layer builds on
//! the same datapath to move in-flight work to a backup NIC when the default one fails.
