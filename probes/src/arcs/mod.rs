//! Edge counting on the machine code of an unmodified binary, the way
//! `gcc -fprofile-arcs` counts in the programs it compiles: a function's
//! control-flow graph ([`cfg`]), counters only on the edges off a spanning
//! tree of it ([`placement`]; Knuth, Ball and Larus 1994), and every other
//! edge and block count derived from those by flow conservation ([`solve`]).
//!
//! Counters may also hold blocks' counts ([`counters`]): a counter patched
//! in anywhere inside a block counts the block. [`sites`] finds where each
//! counter is patched in (a 5-byte window of whole instructions in one
//! block, and whether the flags are live there), and [`stub`] writes the
//! code its jump leads to.
//!
//! Nothing here patches a process: this is the part that decides where
//! counters go, the code that counts, and what their values mean.
//!
//! ```
//! use proftap_probes::arcs::{BranchCount, Cfg, CodeRange, EdgeKind, default_costs, place, solve};
//! // `test edi,edi; jne +5; mov eax,1; ret`: an if without else.
//! let code = [0x85, 0xff, 0x75, 0x05, 0xb8, 0x01, 0, 0, 0, 0xc3];
//! let cfg = Cfg::build(&[CodeRange { address: 0x1000, bytes: &code }])?;
//! let placement = place(&cfg, &default_costs(&cfg));
//! // 3 blocks + ENTRY + EXIT, 6 edges with EXIT→ENTRY: 2 counters, here
//! // on the `jne` not taken and on the `ret`.
//! let kinds: Vec<EdgeKind> = placement.counted().iter().map(|&e| cfg.edges()[e].kind).collect();
//! assert_eq!(kinds, [EdgeKind::NotTaken { jcc: 0x1002 }, EdgeKind::Return { at: 0x1009 }]);
//! // Called 10 times, 3 of them skipping the mov.
//! let counts = solve(&cfg, &placement, &[7, 10])?;
//! assert_eq!(counts.calls(), 10);
//! assert_eq!(counts.blocks(), [10, 7, 10]);
//! assert_eq!(counts.branches(&cfg), [BranchCount { jcc: 0x1002, taken: 3, not_taken: 7 }]);
//! # Ok::<(), proftap_probes::arcs::Error>(())
//! ```

pub mod cfg;
pub mod counters;
pub mod flight;
mod graph;
pub mod lines;
pub mod loops;
pub mod placement;
pub mod regions;
pub mod sites;
pub mod solve;
pub mod stub;
pub mod tables;
mod turns;

pub use cfg::{Block, Cfg, CodeRange, Edge, EdgeKind, Node};
pub use counters::{Cost, CounterPlacement, Quantity, place_counters, quantities, solve_counters};
pub use flight::{Frame, solve_with_frames};
pub use lines::{FunctionLines, LineEntries, line_branches, line_entries, unsettled};
pub use placement::{Placement, default_costs, place};
pub use regions::{RegionHook, region_hooks};
pub use sites::{FunctionCode, Place, Site, SiteCounter, add_region_hooks, counter_costs, plan_sites};
pub use solve::{BranchCount, Counts, solve};
pub use stub::{Stub, stub, stub_with_hooks};
pub use tables::Data;

/// Why a function's graph cannot be built, or its counts not derived.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No code was given.
    #[error("the function has no code")]
    NoCode,
    /// An instruction reached from the entry does not decode.
    #[error("the instruction at {address:#x} does not decode")]
    Undecodable {
        /// Where.
        address: u64,
    },
    /// Execution would run past the end of the function's code.
    #[error("the code at {address:#x} runs past the end of the function")]
    RunsOff {
        /// The instruction whose successor is outside the function.
        address: u64,
    },
    /// A branch lands in the middle of an instruction.
    #[error("the branch at {from:#x} lands at {target:#x}, inside another instruction")]
    IntoInstruction {
        /// The branch.
        from: u64,
        /// Where it lands.
        target: u64,
    },
    /// An indirect jump that is not a tail call (a jump table, a computed
    /// goto): its targets cannot be read from the code alone.
    #[error("the indirect jump `{instruction}` at {address:#x} has targets that cannot be read from the code")]
    IndirectJump {
        /// Where.
        address: u64,
        /// The instruction, disassembled.
        instruction: String,
    },
    /// An instruction whose control flow is not modelled (`xbegin`).
    #[error("the instruction `{instruction}` at {address:#x} has a control flow that is not handled")]
    Unsupported {
        /// Where.
        address: u64,
        /// The instruction, disassembled.
        instruction: String,
    },
    /// The counts given are not one per counted edge.
    #[error("{given} counts given for {expected} counted edges")]
    CountNumber {
        /// Counted edges.
        expected: usize,
        /// Counts given.
        given: usize,
    },
    /// A count derived for an edge that is executed is negative: the counts
    /// given do not come from one execution of this graph.
    #[error("the counts are inconsistent: edge {edge} would run {count} times")]
    Negative {
        /// The edge.
        edge: usize,
        /// Its derived count.
        count: i128,
    },
    /// A count given or derived is beyond what a 63-bit counter holds.
    #[error("the counts are inconsistent: edge {edge} would run more than 2^63 times")]
    Overflow {
        /// The edge.
        edge: usize,
    },
    /// A block's derived count is beyond 64 bits.
    #[error("the counts are inconsistent: block {block} would run more than 2^64 times")]
    BlockOverflow {
        /// The block.
        block: usize,
    },
    /// The counted edges do not determine the others (they are not the
    /// complement of a spanning tree).
    #[error("{unknown} edge counts cannot be derived from the counted edges")]
    Unresolvable {
        /// Edges left without a count.
        unknown: usize,
    },
    /// No window of the code can hold the counter of a quantity: it was
    /// placed where [`counter_costs`] says none fits.
    #[error("no counter can be patched in for {quantity:?}")]
    NoSite {
        /// The quantity.
        quantity: Quantity,
    },
    /// A counting stub cannot be built or reached.
    #[error("the counter at {at:#x}: {reason}")]
    Stub {
        /// The site's address.
        at: u64,
        /// Why.
        reason: String,
    },
    /// A line-table row starts inside an instruction.
    #[error("a line starts at {address:#x}, inside an instruction")]
    RowInsideInstruction {
        /// The row's address.
        address: u64,
    },
    /// A thread was in the function's code at an address inside an
    /// instruction when counting started or ended.
    #[error("a thread was at {pc:#x}, inside an instruction")]
    FrameInsideInstruction {
        /// Its address.
        pc: u64,
    },
    /// A frame counting ended in the middle of a block leaves a line there
    /// entered fewer times than none: the counts are not one execution's.
    #[error("the counts are inconsistent: the line at {address:#x} would be entered fewer than 0 times")]
    LineBelowZero {
        /// The line's row.
        address: u64,
    },
    /// A frame may arrive at a place both inside a region and outside it,
    /// or leave a region there on one way out of a block and not another:
    /// no hook there can tell whether it enters or leaves.
    #[error("whether a frame enters or leaves a region at {address:#x} depends on the path it took there")]
    RegionUndetermined {
        /// The place.
        address: u64,
    },
    /// No window of the code can hold a region's hook.
    #[error("no region hook can be patched in at {address:#x}")]
    NoHookSite {
        /// The instruction it runs before.
        address: u64,
    },
    /// Flow is not conserved at a node once every count is known.
    #[error("the counts are inconsistent: {inflow} in and {outflow} out of node {node}")]
    Unbalanced {
        /// The node's index (see [`Cfg::node_index`]).
        node: usize,
        /// What flows in.
        inflow: i128,
        /// What flows out.
        outflow: i128,
    },
}

#[cfg(test)]
mod tests;
