//! Shared pieces of output.

/// One line for the user: the error and its causes, without repeating a
/// cause the message already states.
pub fn error_sentence(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}
