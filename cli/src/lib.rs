//! The `proftap` command line: its arguments become a
//! [`proftap_record::request::RecordRequest`], the recorder's events are
//! shown as they come, and profiles are rendered (text, JSON, flame graphs,
//! pprof, gcov, lcov).

pub mod calibration;
pub mod client;
pub mod commands;
pub mod output;
pub mod report;
pub mod sources;
pub mod status;
pub mod wording;
