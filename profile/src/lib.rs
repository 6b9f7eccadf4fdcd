//! The profile: what a recording produced, as plain data. No kernel, no
//! command line: the recorder fills it, renderers read it, files carry it.
//!
//! ```
//! use proftap_profile::{Profile, Stat};
//! let mut s = Stat::default();
//! s.add(40);
//! s.add(2);
//! assert_eq!((s.total, s.min, s.max), (42, 2, 40));
//! ```

mod budget;
mod diff;
mod error;
mod file;
mod merge;
mod model;
mod notes;
mod ranks;
mod stats;
mod validate;
mod write;

pub use budget::{Budget, Measure, Missing, Outcome, Subject, check};
pub use diff::{Change, Diff, DiffError, DiffOptions, LineChange, Reason, Verdict, diff, diff_runs};
pub use error::FileError;
pub use file::{
    EXPANSION_FLOOR, FORMAT_VERSION, MAX_EXPANSION, MAX_JSON_BYTES, decode, read_profile, read_profile_from, write_profile,
    write_profile_private, write_profile_to,
};
pub use merge::MergeError;
pub use model::*;
pub use notes::{Finding, FunctionCalls, Note, Refusal, UprobeReason};
pub use ranks::Ratio;
pub use stats::Stat;
pub use validate::{InvalidProfile, MAX_LINE, MAX_METRICS, MAX_NAME_REFERENCES, MAX_TREE_DEPTH};
pub use write::{check_writable, write_atomically, write_in_dir, write_private};
