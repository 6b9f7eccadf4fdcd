//! The pieces of the `proftap` command line that `proftapd` shares: the
//! options of a recording and how they become one, and the renderers.

pub mod calibration;
pub mod commands;
pub mod output;
pub mod report;
pub mod session;
pub mod sources;
pub mod status;
