//! `proftap annotate F`: a function's source with, per line, what the
//! profile has on it: gcov's count and the time spent (recorded with
//! `--lines`) and the share of stack samples taken on it (as `perf
//! annotate` and `callgrind_annotate` show).

use crate::report::coverage::{LOWER_BOUND_LEGEND, count_text, count_width};
use crate::report::text::{format_value, group_digits, metric_label};
use anyhow::{Context, Result, bail};
use proftap_probes::symbols::{DebugDirs, Declaration};
use proftap_profile::{Mode, Profile, SampleProfile, SampledFrame};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `proftap annotate`.
#[derive(clap::Args)]
pub struct Args {
    /// The function (its name as the report shows it; one inlined everywhere
    /// it ran, which only samples name, is found in its module's debug info).
    function: String,
    /// The profile (default proftap.profile).
    #[arg(default_value = "proftap.profile")]
    file: PathBuf,
    /// Print straight to the terminal, without a pager.
    #[arg(long)]
    no_pager: bool,
    /// Where separate debug files are looked for, for a function only
    /// samples name (repeatable; default /usr/lib/debug).
    #[arg(long, value_name = "DIR")]
    debug_dir: Vec<PathBuf>,
}

/// Runs the command.
pub fn run(args: Args) -> Result<ExitCode> {
    let profile = proftap_profile::read_profile(&args.file)?;
    let text = annotate(&profile, &args.function, &DebugDirs::asked_or_default(&args.debug_dir))
        .with_context(|| format!("cannot annotate {} from {}", args.function, args.file.display()))?;
    crate::output::show(&text, args.no_pager)?;
    Ok(ExitCode::SUCCESS)
}

/// The most source lines shown for one function.
const MOST_LINES_SHOWN: u32 = 20_000;

/// `text` with the control characters a terminal would act on (escape
/// sequences in a source or a path that anyone's profile names) shown as
/// `?`; tabs kept.
fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().any(|c| c.is_control() && c != '\t') {
        text.chars().map(|c| if c.is_control() && c != '\t' { '?' } else { c }).collect::<String>().into()
    } else {
        text.into()
    }
}

/// How a function is known to the profile.
enum Known {
    /// As its function `id`.
    Function(usize),
    /// By its samples only: its frames name it, `inlined` where the
    /// compiler inlined it (everywhere it ran).
    Sampled { inlined: bool },
}

/// Where a function the profile names is declared (file, line, and the
/// line of the next function declared after it there, if known), and how
/// the profile knows it; one only the samples name (inlined everywhere it
/// ran) is looked up in its module's debug info, with the rights of the
/// user who ran proftap (the profile names the module).
fn declared(profile: &Profile, name: &str, dirs: &DebugDirs) -> Result<(Declaration, Known)> {
    let next_in_profile =
        |file: &str, line: u32| profile.functions.iter().filter(|f| f.file.as_deref() == Some(file) && f.line > line).map(|f| f.line).min();
    if let Some((id, info)) = profile.functions.iter().enumerate().find(|(_, f)| f.name == name) {
        let Some(file) = info.file.clone() else {
            bail!("{name} has no source file in the debug info");
        };
        let line = info.line.max(1);
        let next = next_in_profile(&file, line);
        return Ok((Declaration { file, line, next }, Known::Function(id)));
    }
    let sampled = profile.samples.as_ref().and_then(|s| s.frames.iter().find(|f| f.name == name));
    let Some(frame) = sampled else {
        bail!("the profile has no function named '{name}' (proftap report lists them)");
    };
    let module = std::path::Path::new(&frame.module);
    let found = crate::sources::as_invoking_user(|| Ok(proftap_probes::symbols::declaration(module, name, dirs)))
        .map_err(|e| e.to_string())
        .and_then(|found| found);
    let mut declaration = found.map_err(|why| anyhow::anyhow!("{name} is named by the samples only, and {why}"))?;
    // The next function the profile knows in that file may come before the next its unit declares.
    declaration.next = declaration.next.into_iter().chain(next_in_profile(&declaration.file, declaration.line)).min();
    Ok((declaration, Known::Sampled { inlined: frame.inlined }))
}

/// The function's lines: from its declaration to the line before the next
/// function declared after it in the same file (or the file's end).
fn annotate(profile: &Profile, name: &str, dirs: &DebugDirs) -> Result<String> {
    let (declaration, known) = declared(profile, name, dirs)?;
    let id = match known {
        Known::Function(id) => Some(id),
        Known::Sampled { .. } => None,
    };
    let (file, first) = (declaration.file.as_str(), declaration.line);
    let last = declaration.next.map_or(u32::MAX, |next| next - 1);
    let counts: HashMap<u32, &proftap_profile::LineRecord> =
        profile.lines.iter().filter(|l| l.file == file && (first..=last).contains(&l.line)).map(|l| (l.line, l)).collect();
    let samples = profile.samples.as_ref();
    let sampled: HashMap<u32, u64> = samples
        .map(|s| s.lines.iter().filter(|l| l.file == file && (first..=last).contains(&l.line)).map(|l| (l.line, l.count)).collect())
        .unwrap_or_default();
    if counts.is_empty() && sampled.is_empty() {
        if profile.lines.is_empty() && samples.is_none_or(|s| s.lines.is_empty()) {
            bail!(
                "the profile has neither line counts nor samples in it: record with --lines (counts and times per line) or with sampling (-F)"
            );
        }
        let range = if last == u32::MAX { format!("{first} on") } else { format!("{first} to {last}") };
        let inlined = samples.map(|s| inlined_into(s, name)).unwrap_or_default();
        if !inlined.is_empty() {
            let listed: Vec<String> =
                inlined.iter().take(5).map(|(callee, n)| format!("{callee} ({} samples)", group_digits(*n))).collect();
            bail!(
                "no line of {name} ({file}, lines {range}) has a sample: its samples are in functions the compiler inlined into it, {}; `proftap annotate {}` shows the lines of the first",
                listed.join(", "),
                inlined[0].0
            );
        }
        bail!("no line of {name} ({file}, lines {range}) has a line count or a sample in this profile");
    }
    let source = crate::sources::read_source(file).with_context(|| format!("cannot read its source {file}"))?;
    let text: Vec<&str> = source.lines().collect();
    if first as usize > text.len() {
        bail!("{file} has {} lines, and {name} is declared at line {first}: was the source changed since the build?", text.len());
    }
    // A function declared last in a long file shows its lines up to a bound.
    let last = last.min(text.len() as u32).min(first.saturating_add(MOST_LINES_SHOWN - 1));

    let mut out = String::new();
    let merged = profile.merged_functions();
    let stats = id.and_then(|id| merged.iter().find(|s| s.function == id as u32));
    let info = id.and_then(|id| profile.functions.get(id));
    let key = profile.metrics.first().map_or("wall_ns", String::as_str);
    let _ = writeln!(
        out,
        "proftap annotate: {} ({}:{first}){}",
        printable(name),
        printable(file),
        match (stats, info) {
            (_, None) if matches!(known, Known::Sampled { inlined: true }) => ", inlined everywhere it ran: sampled only".to_string(),
            (_, None) => ", sampled only".to_string(),
            (Some(s), Some(info)) if info.mode != Mode::Sampled => format!(
                ", {} {}, {} {} inclusive",
                group_digits(s.calls),
                if s.calls == 1 { "call" } else { "calls" },
                format_value(key, s.inclusive.first().map_or(0, |x| x.total)),
                metric_label(key)
            ),
            _ => String::new(),
        }
    );
    let sample_total = samples.map_or(0, |s| s.total.max(1));
    let (with_counts, with_samples) = (!counts.is_empty(), !sampled.is_empty());
    let width = count_width(counts.values().copied());
    let mut heading = String::new();
    if with_counts {
        let _ = write!(heading, "{:>width$} {:>12} ", "count", metric_label(key));
    }
    if with_samples {
        let _ = write!(heading, "{:>6} ", "%smp");
    }
    if counts.values().any(|l| l.throttled) {
        let _ = writeln!(out, "({LOWER_BOUND_LEGEND})");
    }
    let _ = writeln!(out, "{heading}{:>5}  source", "line");
    for number in first..=last {
        let mut row = String::new();
        if with_counts {
            match counts.get(&number) {
                None => {
                    let _ = write!(row, "{:>width$} {:>12} ", "-", "");
                }
                Some(l) => {
                    let time = l.cost.first().map_or(String::new(), |&v| format_value(key, v));
                    let _ = write!(row, "{:>width$} {time:>12} ", count_text(l));
                }
            }
        }
        if with_samples {
            let share =
                sampled.get(&number).map_or(String::new(), |&n| format!("{:.1}", 100.0 * n.min(sample_total) as f64 / sample_total as f64));
            let _ = write!(row, "{share:>6} ");
        }
        let _ = writeln!(out, "{row}{number:>5}: {}", printable(text.get(number as usize - 1).copied().unwrap_or("")));
    }
    Ok(out)
}

/// The functions the compiler inlined into `name` that its samples were
/// in (the frame under its own in each stack, when inlined), with how many
/// samples, most first.
fn inlined_into(samples: &SampleProfile, name: &str) -> Vec<(String, u64)> {
    let mut found: HashMap<&str, u64> = HashMap::new();
    for stack in &samples.stacks {
        let frames: Vec<&SampledFrame> = stack.frames.iter().filter_map(|&f| samples.frames.get(f as usize)).collect();
        let Some(own) = frames.iter().rposition(|f| f.name == name) else { continue };
        if let Some(callee) = frames.get(own + 1).filter(|f| f.inlined) {
            let n = found.entry(callee.name.as_str()).or_default();
            *n = n.saturating_add(stack.count);
        }
    }
    let mut found: Vec<(String, u64)> = found.into_iter().map(|(callee, n)| (callee.to_string(), n)).collect();
    found.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_profile::SampledStack;

    /// Under a function's own frame (inlined itself or not), the samples of
    /// the functions inlined into it: only the frame right under it, and
    /// only when inlined.
    #[test]
    fn the_samples_of_the_functions_inlined_into_one_are_told_by_callee() {
        let frame = |name: &str, inlined| SampledFrame { name: name.into(), module: "/bin/p".into(), inlined };
        let frames = vec![frame("main", false), frame("step", false), frame("mix", true), frame("round", true), frame("leaf", false)];
        let stack = |frames: Vec<u32>, count| SampledStack { frames, count };
        let samples = SampleProfile {
            frames,
            stacks: vec![
                stack(vec![0, 1, 2], 5),
                stack(vec![0, 1, 2, 3], 2),
                stack(vec![0, 1, 3], 4),
                stack(vec![0, 1, 4], 9),
                stack(vec![0, 1], 1),
            ],
            ..SampleProfile::default()
        };
        assert_eq!(inlined_into(&samples, "step"), vec![("mix".to_string(), 7), ("round".to_string(), 4)]);
        assert_eq!(inlined_into(&samples, "mix"), vec![("round".to_string(), 2)], "mix is inlined too");
        assert!(inlined_into(&samples, "main").is_empty(), "step is a call of its own");
    }

    #[test]
    fn control_characters_are_not_passed_to_the_terminal() {
        assert_eq!(printable("\tint x; /* \u{1b}[2J */"), "\tint x; /* ?[2J */");
        assert!(matches!(printable("plain"), std::borrow::Cow::Borrowed("plain")));
    }
}
