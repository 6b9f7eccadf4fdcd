//! proftap's contact with binaries and live processes: the ELF/DWARF
//! symbolizer, function selection and `/proc` readers.
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
mod error;
pub mod procfs;
pub mod select;
pub mod symbols;

pub use error::{Error, Result};
