//! proftapd's parts, for its binary (`src/main.rs`) and its fuzz target
//! (`fuzz/src/bin/protocol.rs`), which feeds what users send to the checks
//! that need no root: request lines, the worker's frames, limits.

pub mod access;
pub mod broker;
pub mod channel;
pub mod connection;
pub mod messages;
pub mod privileges;
pub mod sessions;
pub mod worker;
