//! How much a tool prints on stdout: perftest's whole output, or with perftest's `--output`
//! the one figure asked for and nothing else (what a script reads without parsing a table).

use std::cell::Cell;

thread_local! {
    // Per thread: tests run several tools in one process, each on its own thread.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Whether the tool running on this thread prints its one figure only.
pub fn quiet() -> bool {
    QUIET.with(Cell::get)
}

/// Sets it for the tool about to run on this thread.
pub fn set_quiet(quiet: bool) {
    QUIET.with(|q| q.set(quiet));
}
