//! proftap's contact with binaries and live processes, mechanisms only: the
//! ELF/DWARF symbolizer, function selection and probe planning, `/proc`
//! readers, uprobes in tracefs, perf events and their ring buffers, the
//! in-process engine (patching, runtime, shared memory), and the sampler's
//! unwinding. What to record and how to read the results is the recorder's
//! (`proftap-record`).
//!
//! ```no_run
//! use proftap_probes::symbols::{LoadOptions, SymbolIndex};
//! let index = SymbolIndex::load("/usr/bin/true".as_ref(), &LoadOptions::default())?;
//! for f in &index.functions {
//!     println!("{} {} {:?}", f.address, f.name, f.file_offset);
//! }
//! # Ok::<(), proftap_probes::Error>(())
//! ```

pub mod addr;
pub mod arcs;
pub mod boot_cache;
mod bpf;
pub mod btf;
pub mod calibrate;
pub mod entry;
mod error;
pub mod exits;
pub mod inject;
pub mod libs;
pub mod lines;
pub mod memfd;
pub mod metrics;
pub mod offcpu;
pub mod parallel;
pub mod perf;
pub mod plan;
pub mod procfs;
pub mod sampled_processes;
pub mod sampling;
pub mod select;
pub mod symbols;
pub mod target;
pub mod tracefs;

pub use error::{Error, Result};
