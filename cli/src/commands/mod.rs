//! One module per subcommand.

pub mod symbols;
