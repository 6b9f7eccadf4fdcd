//! Folded stacks and flame graphs (through inferno), from samples or from
//! the exact calling-context tree.

use anyhow::Result;
use proftap_probes::sampling::KERNEL_SUFFIX;
use proftap_profile::Profile;
use std::borrow::Cow;
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

/// The most bytes of folded stacks proftap builds: a stack names every
/// frame of its path, so a deep tree costs its depth at every node.
pub const MAX_FOLDED_BYTES: u64 = 512 << 20;

fn too_large(bytes: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "its stacks would take {} MiB as folded stacks, more than the {} MiB proftap builds (each stack names all its callers); proftap report --tree shows a tree this deep",
        bytes >> 20,
        MAX_FOLDED_BYTES >> 20
    )
}

/// Folded stacks (`outer;inner count`) of the sampled stacks.
pub fn folded_samples(profile: &Profile) -> Result<Vec<String>> {
    let Some(samples) = &profile.samples else { return Ok(Vec::new()) };
    let name = |f: u32| samples.frames.get(f as usize).map_or("?", |frame| frame.name.as_str());
    let bytes = samples.stacks.iter().flat_map(|s| &s.frames).fold(0u64, |sum, &f| sum.saturating_add(name(f).len() as u64 + 1));
    if bytes > MAX_FOLDED_BYTES {
        return Err(too_large(bytes));
    }
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for stack in &samples.stacks {
        let path: Vec<String> = stack.frames.iter().map(|&f| clean(name(f))).collect();
        let count = lines.entry(path.join(";")).or_default();
        *count = count.saturating_add(stack.count);
    }
    Ok(lines.into_iter().map(|(path, count)| format!("{path} {count}")).collect())
}

/// Folded stacks of the calling-context tree over all threads, each path
/// weighted by its exclusive cost in metric `m`.
pub fn folded_calls(profile: &Profile, m: usize) -> Result<Vec<String>> {
    let tree = profile.merged_tree();
    let weight = |i: usize| tree.nodes[i].exclusive.get(m).copied().unwrap_or(0);
    // What each path takes, from its parent's (parents come before their
    // children), so that a tree too deep to fold is refused before any
    // string is built.
    let mut path_bytes = vec![0u64; tree.nodes.len()];
    let mut total = 0u64;
    for (i, node) in tree.nodes.iter().enumerate().skip(1) {
        let parent = path_bytes.get(node.parent as usize).copied().unwrap_or(0);
        path_bytes[i] = parent.saturating_add(super::function_name(profile, node.function).len() as u64 + 1);
        if weight(i) > 0 {
            total = total.saturating_add(path_bytes[i]);
        }
    }
    if total > MAX_FOLDED_BYTES {
        return Err(too_large(total));
    }
    let mut lines = BTreeMap::new();
    for i in (1..tree.nodes.len()).filter(|&i| weight(i) > 0) {
        let mut names: Vec<String> =
            tree.path(i as u32).map(|n| clean(super::function_name(profile, tree.nodes[n as usize].function))).collect();
        names.reverse();
        let sum = lines.entry(names.join(";")).or_insert(0u64);
        *sum = sum.saturating_add(weight(i));
    }
    Ok(lines.into_iter().map(|(path, weight)| format!("{path} {weight}")).collect())
}

/// The folded stacks of a profile: samples if it has them, else calls.
pub fn folded(profile: &Profile, source: Option<Source>, m: usize) -> Result<Vec<String>> {
    match source.unwrap_or(if profile.samples.is_some() { Source::Samples } else { Source::Calls }) {
        Source::Samples => folded_samples(profile),
        Source::Calls => folded_calls(profile, m),
    }
}

/// The largest sum of counts handed to inferno, which adds them up in a
/// `usize` that must not overflow.
const MAX_TOTAL: u128 = 1 << 62;

/// Folded stacks whose counts add up to at most [`MAX_TOTAL`]: counts
/// summing past it (only a damaged profile's can) are scaled down alike.
fn fit_counts(lines: &[String]) -> Cow<'_, [String]> {
    let count = |line: &str| line.rsplit_once(' ').and_then(|(_, n)| n.parse::<u64>().ok()).unwrap_or(0);
    let total: u128 = lines.iter().map(|l| u128::from(count(l))).sum();
    if total <= MAX_TOTAL {
        return Cow::Borrowed(lines);
    }
    let scale = total / MAX_TOTAL + 1;
    let scaled = lines.iter().filter_map(|l| Some(format!("{} {}", l.rsplit_once(' ')?.0, u128::from(count(l)) / scale))).collect();
    Cow::Owned(scaled)
}

/// Renders folded stacks as an SVG flame graph.
pub fn svg(lines: &[String], title: &str, count_name: &str) -> std::io::Result<Vec<u8>> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = count_name.to_string();
    options.deterministic = true;
    // The kernel's frames in orange, apart from the program's, as perf's
    // flame graphs colour them (frames named `_[k]`).
    if lines.iter().any(|l| l.contains(KERNEL_SUFFIX)) {
        options.colors = inferno::flamegraph::color::Palette::Multi(inferno::flamegraph::color::MultiPalette::Perl);
    }
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(&mut options, fit_counts(lines).iter().map(String::as_str), &mut out)?;
    Ok(out)
}

/// A differential flame graph: the shape of `new`, coloured by the change from `base`.
pub fn diff_svg(base: &[String], new: &[String], title: &str, count_name: &str) -> std::io::Result<Vec<u8>> {
    let mut folded = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        std::io::Cursor::new(fit_counts(base).join("\n")),
        std::io::Cursor::new(fit_counts(new).join("\n")),
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
        tree.nodes.push(TreeNode { function: 0, parent: 0, calls: 1, inclusive: vec![100], exclusive: vec![40], estimated: false });
        tree.nodes.push(TreeNode { function: 1, parent: 1, calls: 3, inclusive: vec![60], exclusive: vec![60], estimated: false });
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
        assert_eq!(folded_calls(&p, 0).expect("small"), vec!["main 40".to_string(), "main;ns::f:g 60".to_string()]);
        assert_eq!(folded_samples(&p).expect("small"), vec!["main 2".to_string(), "main;work 7".to_string()]);
    }

    #[test]
    fn counts_summing_past_inferno_s_range_are_scaled() {
        let lines = vec![format!("main {}", u64::MAX), format!("main;f {}", u64::MAX)];
        let fitted = fit_counts(&lines);
        assert_eq!(fitted.as_ref(), [format!("main {}", u64::MAX / 8), format!("main;f {}", u64::MAX / 8)]);
        assert!(svg(&lines, "t", "ns").is_ok());
        assert!(diff_svg(&lines, &lines, "t", "ns").is_ok());
        let small = vec!["main 1".to_string()];
        assert!(matches!(fit_counts(&small), Cow::Borrowed(_)));
    }

    #[test]
    fn stacks_past_the_byte_limit_are_refused() {
        let mut p = profile();
        // 600 calls deep under a name of 4 KiB: 700 MiB of paths.
        p.functions[0].name = "x".repeat(4096);
        let tree = &mut p.threads[0].tree;
        for parent in 2..602 {
            tree.nodes.push(TreeNode { function: 0, parent, calls: 1, inclusive: vec![1], exclusive: vec![1], estimated: false });
        }
        let err = folded_calls(&p, 0).expect_err("too large");
        assert!(err.to_string().contains("more than the 512 MiB proftap builds"), "{err}");
        let samples = p.samples.as_mut().expect("samples");
        samples.frames[0].name = "x".repeat(1 << 20);
        samples.stacks[0].frames = vec![0; 600];
        assert!(folded_samples(&p).is_err());
    }

    #[test]
    fn svgs_name_the_frames() {
        let p = profile();
        let svg = String::from_utf8(svg(&folded_samples(&p).expect("small"), "t", "samples").expect("renders")).expect("utf-8");
        assert!(svg.starts_with("<?xml") && svg.contains("work") && svg.contains("</svg>"));
        let (base, new) = (folded_samples(&p).expect("small"), folded_calls(&p, 0).expect("small"));
        let diff = String::from_utf8(diff_svg(&base, &new, "d", "ns").expect("renders")).expect("utf-8");
        assert!(diff.contains("ns::f:g"));
    }
}
