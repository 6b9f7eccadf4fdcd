//! Folded stacks and flame graphs (through inferno), from samples or from
//! the exact calling-context tree.

use proftap_profile::Profile;
use std::collections::BTreeMap;

/// Where a flame graph's stacks come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// Sampled stacks, weighted by samples.
    Samples,
    /// The exact call tree, weighted by each call path's exclusive cost.
    Calls,
}

/// A frame name as folded stacks can carry it (`;` separates frames).
fn clean(name: &str) -> String {
    name.replace(';', ":").replace('\n', " ")
}

/// Folded stacks (`outer;inner count`) of the sampled stacks.
pub fn folded_samples(profile: &Profile) -> Vec<String> {
    let Some(samples) = &profile.samples else { return Vec::new() };
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for stack in &samples.stacks {
        let path: Vec<String> = stack.frames.iter().map(|&f| clean(&samples.frames[f as usize].name)).collect();
        *lines.entry(path.join(";")).or_default() += stack.count;
    }
    lines.into_iter().map(|(path, count)| format!("{path} {count}")).collect()
}

/// Folded stacks of the calling-context tree over all threads, each path
/// weighted by its exclusive cost in metric `m`.
pub fn folded_calls(profile: &Profile, m: usize) -> Vec<String> {
    let tree = profile.merged_tree();
    let mut paths: Vec<String> = vec![String::new(); tree.nodes.len()];
    let mut lines = BTreeMap::new();
    // Parents come before their children.
    for (i, node) in tree.nodes.iter().enumerate().skip(1) {
        let name = clean(super::function_name(profile, node.function));
        let parent = &paths[node.parent as usize];
        paths[i] = if parent.is_empty() { name } else { format!("{parent};{name}") };
        let weight = node.exclusive.get(m).copied().unwrap_or(0);
        if weight > 0 {
            *lines.entry(paths[i].clone()).or_insert(0u64) += weight;
        }
    }
    lines.into_iter().map(|(path, weight)| format!("{path} {weight}")).collect()
}

/// The folded stacks of a profile: samples if it has them, else calls.
pub fn folded(profile: &Profile, source: Option<Source>, m: usize) -> Vec<String> {
    match source.unwrap_or(if profile.samples.is_some() { Source::Samples } else { Source::Calls }) {
        Source::Samples => folded_samples(profile),
        Source::Calls => folded_calls(profile, m),
    }
}

/// Renders folded stacks as an SVG flame graph.
pub fn svg(lines: &[String], title: &str, count_name: &str) -> std::io::Result<Vec<u8>> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = count_name.to_string();
    options.deterministic = true;
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)?;
    Ok(out)
}

/// A differential flame graph: the shape of `new`, coloured by the change from `base`.
pub fn diff_svg(base: &[String], new: &[String], title: &str, count_name: &str) -> std::io::Result<Vec<u8>> {
    let mut folded = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        std::io::Cursor::new(base.join("\n")),
        std::io::Cursor::new(new.join("\n")),
        &mut folded,
    )?;
    let text = String::from_utf8_lossy(&folded).into_owned();
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    svg(&lines, title, count_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_profile::{CallTree, FunctionInfo, SampleProfile, SampledFrame, SampledStack, ThreadProfile, TreeNode};

    fn profile() -> Profile {
        let mut tree = CallTree::new(1);
        tree.nodes.push(TreeNode { function: 0, parent: 0, calls: 1, inclusive: vec![100], exclusive: vec![40] });
        tree.nodes.push(TreeNode { function: 1, parent: 1, calls: 3, inclusive: vec![60], exclusive: vec![60] });
        let frame = |name: &str| SampledFrame { name: name.into(), module: String::new(), inlined: false };
        Profile {
            metrics: vec!["wall_ns".into()],
            functions: vec![
                FunctionInfo { name: "main".into(), ..FunctionInfo::default() },
                FunctionInfo { name: "ns::f;g".into(), ..FunctionInfo::default() },
            ],
            threads: vec![ThreadProfile { pid: 1, tid: 1, name: String::new(), functions: Vec::new(), tree }],
            samples: Some(SampleProfile {
                frames: vec![frame("main"), frame("work")],
                stacks: vec![SampledStack { frames: vec![0, 1], count: 7 }, SampledStack { frames: vec![0], count: 2 }],
                ..SampleProfile::default()
            }),
            ..Profile::default()
        }
    }

    #[test]
    fn folded_stacks_from_calls_and_samples() {
        let p = profile();
        assert_eq!(folded_calls(&p, 0), vec!["main 40".to_string(), "main;ns::f:g 60".to_string()]);
        assert_eq!(folded_samples(&p), vec!["main 2".to_string(), "main;work 7".to_string()]);
    }

    #[test]
    fn svgs_name_the_frames() {
        let p = profile();
        let svg = String::from_utf8(svg(&folded_samples(&p), "t", "samples").expect("renders")).expect("utf-8");
        assert!(svg.starts_with("<?xml") && svg.contains("work") && svg.contains("</svg>"));
        let diff = String::from_utf8(diff_svg(&folded_samples(&p), &folded_calls(&p, 0), "d", "ns").expect("renders")).expect("utf-8");
        assert!(diff.contains("ns::f:g"));
    }
}
