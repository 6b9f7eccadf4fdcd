//! Address spaces as types.
//!
//! A uprobe takes a file offset, the line table and symbol table speak ELF
//! virtual addresses, and samples and `/proc/PID/maps` give runtime addresses.
//! Mixing them up is the classic profiler bug, so each has its own type.

use serde::Serialize;
use std::fmt;

macro_rules! address_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Default)]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

address_type!(
    /// A virtual address as the ELF file states it (symbol values, DWARF
    /// `DW_AT_low_pc`, line-table rows), before any load bias.
    VirtAddr
);
address_type!(
    /// A byte offset into the ELF file: what a uprobe is placed at.
    FileOffset
);
address_type!(
    /// An address in a running process: an ELF virtual address plus the load
    /// bias of the module that contains it.
    RuntimeAddr
);

/// The difference between where a module is loaded and where its ELF file
/// says it is: `runtime = virtual + bias` (wrapping, as biases may be negative).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct LoadBias(pub u64);

impl LoadBias {
    /// The runtime address of `addr` in a module loaded with this bias.
    pub fn to_runtime(self, addr: VirtAddr) -> RuntimeAddr {
        RuntimeAddr(addr.0.wrapping_add(self.0))
    }

    /// The ELF virtual address of a runtime address in this module.
    pub fn to_virtual(self, addr: RuntimeAddr) -> VirtAddr {
        VirtAddr(addr.0.wrapping_sub(self.0))
    }
}

impl fmt::Display for LoadBias {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}
