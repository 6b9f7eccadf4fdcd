//! proftap's recorder: what to record in, a [`proftap_profile::Profile`] out.
//! It turns probe hits from the kernel's uprobes and records from the
//! in-process engine into one stream of events, keeps the overhead within
//! budget, aggregates the stream on per-thread shadow stacks and assembles
//! the profile. It prints nothing.

pub mod aggregate;
pub mod calibration;
pub mod error;
pub mod events;
pub mod governor;
pub mod host;
pub mod observer;
pub mod prepare;
pub mod protocol;
pub mod reader;
pub mod recorder;
pub mod request;
mod session;
