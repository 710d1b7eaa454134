//! Benchmarks of the railshift datapath and of the wire, each printing a ratio against a
//! baseline measured in the same run.
