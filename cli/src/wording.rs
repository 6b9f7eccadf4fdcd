//! What the recorder reports in types, in proftap's words: the sentences
//! that may name proftap's own flags are written here, not below.

use proftap_record::observer::Warning;

/// A warning, as a sentence.
pub fn warning(warning: &Warning) -> String {
    match warning {
        Warning::Symbols { message } | Warning::Planning { message } => message.clone(),
        Warning::NoProbeCost { reason } => {
            format!("cannot measure the cost of a probe: {reason}; the report will not estimate the overhead")
        }
    }
}
