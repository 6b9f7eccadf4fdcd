//! proftap's recorder: a typed [`request::RecordRequest`] in, a
//! [`proftap_profile::Profile`] out. [`prepare`] reads the program's
//! symbols and chooses what to probe and how; [`recorder`] starts the
//! target and runs the [`driver`] over the event [`sources`] (kernel
//! uprobes, the in-process engine's rings, the stack sampler), which all
//! speak one [`events::Event`]; the [`governor`] changes the probes while
//! the target runs; the [`aggregate`] turns the ordered events into
//! per-thread statistics and call trees; [`assemble`] makes the profile.
//! Progress, warnings and notes go to an [`observer::Observer`]: the
//! recorder prints nothing. [`saved`] event streams replay through the
//! same aggregator and assembly.

pub mod aggregate;
pub mod assemble;
pub mod calibration;
pub mod cost;
pub mod driver;
pub mod error;
pub mod events;
pub mod governor;
pub mod host;
pub mod observer;
pub mod options;
pub mod prepare;
pub mod protocol;
pub mod queue;
pub mod recorder;
pub mod request;
pub mod samples;
pub mod saved;
pub mod sources;
pub mod trace;
