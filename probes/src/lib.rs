//! proftap's contact with binaries and live processes: the ELF/DWARF
//! symbolizer, function selection, `/proc` readers, uprobes and the
//! recorder that turns probe hits into a [`proftap_profile::Profile`].
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
pub mod calibrate;
pub mod entry;
mod error;
pub mod exits;
pub mod inject;
pub mod libs;
pub mod lines;
pub mod metrics;
pub mod perf;
pub mod plan;
pub mod procfs;
pub mod record;
pub mod sampling;
pub mod select;
pub mod symbols;
pub mod target;
pub mod tracefs;

pub use error::{Error, Result};
