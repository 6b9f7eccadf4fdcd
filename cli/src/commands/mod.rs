//! One module per subcommand.

pub mod annotate;
pub mod check;
pub mod diff;
pub mod export;
pub mod flamegraph;
pub mod gcov;
pub mod merge;
pub mod record;
pub mod report;
pub mod session;
pub mod symbols;
pub mod top;
