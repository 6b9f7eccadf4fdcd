//! Errors become one line for the user.

/// One line: the error and its causes, without repeating a cause the
/// message already states. Control characters an error quotes (from a
/// file's names, say) are escaped to keep it one line.
pub fn sentence(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let said = e.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = e.source();
    }
    if text.contains(char::is_control) {
        text = text.chars().flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] }).collect();
    }
    text
}
