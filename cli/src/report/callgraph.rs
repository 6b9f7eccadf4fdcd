//! One function's callers and callees, from the calling contexts (as
//! gprof's call graph entry and `perf report --children`'s callers): per
//! caller, the calls it made of the function and the time they took; per
//! callee, the calls the function made and their time.

use super::text::{format_value, group_digits, metric_label};
use proftap_profile::{CallTree, Profile, ROOT};
use std::collections::HashMap;
use std::fmt::Write as _;

/// Which side of the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Who called it.
    Callers,
    /// What it called.
    Callees,
}

/// The table of `name`'s callers or callees for metric `m`; an error names
/// a function the profile does not have.
pub fn render(profile: &Profile, name: &str, side: Side, m: usize) -> Result<String, String> {
    let ids: Vec<u32> = profile.functions.iter().enumerate().filter(|(_, f)| f.name == name).map(|(i, _)| i as u32).collect();
    if ids.is_empty() {
        return Err(format!("the profile has no function named '{name}' (proftap report lists them)"));
    }
    let key = profile.metrics.get(m).map_or("", String::as_str);
    let tree = profile.merged_tree();
    let rows = rows(&tree, &ids, side, m);
    let all = rows.iter().fold(0u64, |n, r| n.saturating_add(r.1)).max(1);
    let mut out = String::new();
    let (title, column) = match side {
        Side::Callers => ("Callers of", "caller"),
        Side::Callees => ("Callees of", "callee"),
    };
    let _ = writeln!(out, "{title} {name} ({}; inclusive: what the calls took)", metric_label(key));
    let _ = writeln!(out, "{:>12} {:>12} {:>6}  {column}", "calls", "inclusive", "%");
    for (function, value, calls) in &rows {
        let label = if *function == ROOT { "[thread]".to_string() } else { super::function_name(profile, *function).to_string() };
        let share = 100.0 * *value as f64 / all as f64;
        let _ = writeln!(out, "{:>12} {:>12} {share:>6.1}  {label}", group_digits(*calls), format_value(key, *value));
    }
    if rows.is_empty() {
        let _ = writeln!(out, "{:>12}  (none)", "");
    }
    Ok(out)
}

/// (caller or callee, its value of metric `m`, calls), largest value first.
fn rows(tree: &CallTree, ids: &[u32], side: Side, m: usize) -> Vec<(u32, u64, u64)> {
    let mut by: HashMap<u32, (u64, u64)> = HashMap::new();
    for node in tree.nodes.iter().skip(1) {
        let parent = tree.nodes.get(node.parent as usize);
        let of = match side {
            Side::Callers if ids.contains(&node.function) => parent.map_or(ROOT, |p| p.function),
            Side::Callees if parent.is_some_and(|p| ids.contains(&p.function)) => node.function,
            _ => continue,
        };
        let entry = by.entry(of).or_default();
        entry.0 = entry.0.saturating_add(node.inclusive.get(m).copied().unwrap_or(0));
        entry.1 = entry.1.saturating_add(node.calls);
    }
    let mut rows: Vec<(u32, u64, u64)> = by.into_iter().map(|(f, (value, calls))| (f, value, calls)).collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)));
    rows
}
