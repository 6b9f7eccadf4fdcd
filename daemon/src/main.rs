//! `proftapd`: the session daemon. Not implemented yet; it says so.

use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--version" || a == "-V") {
        println!("proftapd {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    eprintln!("proftapd: the session daemon is not available in this version; profile directly with `proftap run` or `proftap attach`");
    ExitCode::from(2)
}
