//! The text report: a header, a flat profile per metric like gprof's, the
//! call tree and per-thread profiles on request.

use super::{SortKey, function_name, sort_functions};
use proftap_probes::sampling::{FORK_FRAME, PROBE_OVERHEAD_FRAME};
use proftap_profile::{CallTree, Engine, ExitMode, FunctionStats, Mode, Profile, Unit};
use std::collections::HashMap;
use std::fmt::Write as _;

/// What the text report shows.
#[derive(Clone, Debug)]
pub struct TextOptions {
    /// Sort order of the flat profile.
    pub sort: SortKey,
    /// Show at most this many functions per table.
    pub top: Option<usize>,
    /// Show the call tree.
    pub tree: bool,
    /// Show each thread.
    pub threads: bool,
    /// Metrics to show (indexes into the profile's metrics); all when empty.
    pub metrics: Vec<usize>,
    /// Show each source file with its line counts and times.
    pub lines: bool,
    /// Show the call tree this many levels deep at most.
    pub depth: Option<usize>,
    /// Hide calling contexts under this share of the run (a fraction).
    pub min_share: f64,
    /// Fit the report in this many columns (a terminal's width); `None`:
    /// every column, names in full.
    pub width: Option<usize>,
}

/// Formats a metric value: times with a unit, counts with separators.
pub fn format_value(key: &str, value: u64) -> String {
    match Unit::of(key) {
        Unit::Nanoseconds => format_ns(value),
        Unit::Count => group_digits(value),
    }
}

/// `64 MiB`, `1 GiB`, `4097 bytes`: a size as it was most likely given.
pub fn format_bytes(bytes: u64) -> String {
    match [(30, "GiB"), (20, "MiB"), (10, "KiB")].into_iter().find(|(shift, _)| bytes != 0 && bytes % (1 << shift) == 0) {
        Some((shift, unit)) => format!("{} {unit}", bytes >> shift),
        None => format!("{bytes} bytes"),
    }
}

/// `1.23 ms`, `456 ns`, `2.000 s`.
pub fn format_ns(ns: u64) -> String {
    let ns_f = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.2} us", ns_f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", ns_f / 1e6)
    } else {
        format!("{:.3} s", ns_f / 1e9)
    }
}

/// `1234567` -> `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// How a metric key reads in a sentence (`wall_ns`: "wall time").
pub fn metric_label(key: &str) -> &str {
    match key {
        "wall_ns" => "wall time",
        "cpu_ns" => "CPU time",
        other => other,
    }
}

/// Renders the report.
pub fn render(profile: &Profile, options: &TextOptions) -> String {
    let mut out = String::new();
    header(profile, &mut out);
    let metrics: Vec<usize> = if options.metrics.is_empty() { (0..profile.metrics.len()).collect() } else { options.metrics.clone() };
    let mut merged = profile.merged_functions();
    let probed = probed(profile);
    for &m in metrics.iter().filter(|_| probed) {
        flat(profile, &mut merged, m, options, "", &mut out);
    }
    if options.tree && probed {
        let m = metrics.first().copied().unwrap_or(0);
        let label = profile.metrics.get(m).map_or("no metric", |k| metric_label(k));
        let _ = writeln!(out, "\nCall tree ({label}, inclusive / exclusive)");
        tree(profile, &profile.merged_tree(), m, options, &mut out);
    }
    throttled(profile, &merged, options, &mut out);
    untimed(profile, options, &mut out);
    sampled_only(profile, options, &mut out);
    if !profile.regions.is_empty() {
        regions(profile, &metrics, &mut out);
    }
    if options.lines {
        listing(profile, &metrics, &mut out);
    }
    if options.threads {
        for thread in &profile.threads {
            let title =
                format!(" of thread {} ({}, pid {})", thread.tid, if thread.name.is_empty() { "?" } else { &thread.name }, thread.pid);
            let mut functions = thread.functions.clone();
            for &m in &metrics {
                flat(profile, &mut functions, m, options, &title, &mut out);
            }
            if options.tree {
                let m = metrics.first().copied().unwrap_or(0);
                let _ = writeln!(out, "\nCall tree{title}");
                tree(profile, &thread.tree, m, options, &mut out);
            }
        }
    }
    match options.width {
        Some(width) => wrap(&out, width),
        None => out,
    }
}

/// Lines past `width` wrapped at words, each continued under where its
/// text starts (after a header's label, or its own indentation).
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.chars().count() <= width {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        // `  note        text`: continue under the text.
        let label = line[indent..]
            .find("  ")
            .filter(|&at| at < 14)
            .map_or(indent + 2, |at| indent + at + line[indent + at..].len() - line[indent + at..].trim_start().len());
        let hang = " ".repeat(label.min(width / 2));
        let options = textwrap::Options::new(width).subsequent_indent(&hang).break_words(true);
        for piece in textwrap::wrap(line, options) {
            out.push_str(&piece);
            out.push('\n');
        }
    }
    out
}

/// The CPU time the threads took, when `key` is CPU time and more than one
/// thread ran (threads run side by side, and their CPU time is not a
/// share of the run's wall time): what their outermost timed calls
/// measured and the `untimed_ns` the samples give calls no probe timed
/// (begun before an attach), or where more, all their samples' time (the
/// program outside every timed call).
fn threads_cpu_ns(profile: &Profile, metric: usize, key: &str, untimed_ns: u64) -> Option<u64> {
    if key != "cpu_ns" || profile.threads.len() < 2 {
        return None;
    }
    let outermost = |t: &proftap_profile::ThreadProfile| -> u64 {
        t.tree.nodes.iter().skip(1).filter(|n| n.parent == 0).map(|n| n.inclusive.get(metric).copied().unwrap_or(0)).sum()
    };
    let measured = profile.threads.iter().map(outermost).fold(untimed_ns, u64::saturating_add);
    // Both sampling events stand for CPU time at their frequency.
    let sampled =
        profile.samples.as_ref().filter(|s| matches!(s.event.as_str(), "cpu-clock" | "cycles")).map_or(0, |s| s.estimated_ns(s.total));
    Some(measured.max(sampled))
}

/// The function to look at first: the most exclusive time (CPU time, else
/// the first metric; a throttled function's with its time after the
/// throttle, from its samples), or with only samples, the most samples in
/// itself.
fn hottest(profile: &Profile, out: &mut String) {
    let duration = profile.recording.duration_ns.max(1) as f64;
    // CPU time where recorded, as perf's samples count: a thread waiting
    // for others spends wall time in itself and does nothing.
    let metric = profile.metric_index("cpu_ns").unwrap_or(0);
    let key = profile.metrics.get(metric).map_or("", String::as_str);
    let timed = Unit::of(key) == Unit::Nanoseconds;
    let after_throttle_by_function = if timed { profile.own_times_after_throttle() } else { Default::default() };
    let after_throttle = |function: u32| after_throttle_by_function.get(&function).copied().unwrap_or(0);
    let untimed_by_function = if timed { profile.own_times_untimed() } else { Default::default() };
    let untimed = |function: u32| untimed_by_function.get(&function).copied().unwrap_or(0);
    let merged = profile.merged_functions();
    // An instrumented function whose calls no probe timed (one begun
    // before an attach that never returned) may have no calls at all.
    let with_calls: std::collections::HashSet<u32> = merged.iter().map(|f| f.function).collect();
    let mut only_untimed: Vec<FunctionStats> = untimed_by_function
        .keys()
        .filter(|function| !with_calls.contains(function))
        .map(|&function| FunctionStats { function, ..FunctionStats::default() })
        .collect();
    only_untimed.sort_by_key(|f| f.function);
    let instrumented = merged
        .iter()
        .chain(&only_untimed)
        .filter(|f| profile.functions.get(f.function as usize).is_some_and(|i| i.mode != Mode::Sampled))
        .map(|f| {
            let measured = f.exclusive.get(metric).map_or(0, |s| s.total);
            let estimated = after_throttle(f.function).saturating_add(untimed(f.function));
            (f, measured.saturating_add(estimated), estimated)
        })
        .max_by_key(|(_, total, _)| *total);
    if let Some((f, total, estimated)) = instrumented.filter(|(f, total, _)| f.calls > 0 || *total > 0) {
        let untimed_ns = untimed_by_function.values().fold(0, |sum: u64, &ns| sum.saturating_add(ns));
        let share = match (timed, threads_cpu_ns(profile, metric, key, untimed_ns)) {
            (false, _) => String::new(),
            (true, Some(cpu)) => format!(", {:.1}% of the threads' CPU time", 100.0 * total as f64 / cpu.max(1) as f64),
            (true, None) => format!(", {:.1}% of the run", 100.0 * total as f64 / duration),
        };
        // Without samples, time in callees after their probes were removed
        // stays in this function's own: say so rather than name it hottest bare.
        let unseen = if profile.samples.is_none() && timed && calls_throttled(profile, f.function) {
            " (with the time of callees whose probes were removed, which sampling would tell apart)"
        } else {
            ""
        };
        let info = profile.functions.get(f.function as usize);
        let (about, calls) = if untimed(f.function) > 0 && info.is_some_and(|i| i.mode != Mode::Throttled) {
            ("about ", untimed_calls(f.calls))
        } else {
            let (after, until) = (info.and_then(|i| i.calls_after_throttle), info.and_then(|i| i.calls_counted_until_stopped));
            // Older files say nothing of it: without samples, nothing estimated their calls either.
            // After counting stopped, the samples estimate them only where
            // enough were taken while counted (see `throttled`).
            let sampled = |name: &str| profile.samples.as_ref()?.throttled.functions.iter().find(|t| t.name == name);
            let estimable = match until {
                Some(counted) => info.and_then(|i| sampled(&i.name)).and_then(|t| t.calls_since_counting_stopped(counted)).is_some(),
                None => true,
            };
            let calls_estimated = profile.samples.is_some() && estimable && !info.is_some_and(|i| i.calls_after_counting_unknown);
            let uncounted = match info.is_some_and(|i| i.mode == Mode::Throttled) {
                false => Uncounted::None,
                true if calls_estimated => Uncounted::Estimated,
                true => Uncounted::Unknown,
            };
            hottest_calls(f.calls, estimated, after, until, uncounted)
        };
        let _ = writeln!(
            out,
            "  hottest     {}: {about}{} {} in itself{unseen}{share}, {calls}",
            function_name(profile, f.function),
            format_value(key, total),
            metric_label(key),
        );
    } else if let Some(samples) = &profile.samples
        && let Some(f) = samples.functions().into_iter().max_by_key(|f| f.self_samples).filter(|f| f.self_samples > 0)
    {
        let _ = writeln!(
            out,
            "  hottest     {}: {:.1}% of the samples in itself",
            f.frame.name,
            100.0 * f.self_samples as f64 / samples.total.max(1) as f64
        );
    }
}

/// Whether `function` calls, on some path, a function whose probes the
/// governor removed.
fn calls_throttled(profile: &Profile, function: u32) -> bool {
    let throttled = |f: u32| profile.functions.get(f as usize).is_some_and(|i| i.mode == Mode::Throttled);
    profile.threads.iter().any(|thread| {
        let nodes = &thread.tree.nodes;
        nodes.iter().any(|n| throttled(n.function) && nodes.get(n.parent as usize).is_some_and(|p| p.function == function))
    })
}

/// Whether any function was instrumented (not a sampling-only recording).
fn probed(profile: &Profile) -> bool {
    profile.functions.iter().any(|f| f.mode != Mode::Sampled)
}

/// What saw the calls: the in-process engine asked for may have patched
/// none of the functions (each too short, say), all of them falling back
/// to uprobes, or some.
fn engines_used(profile: &Profile) -> String {
    let uprobes = match profile.recording.exits {
        ExitMode::ReturnSites => "uprobes (returns seen by probes on return instructions)",
        ExitMode::Uretprobe => "uprobes (returns seen by return probes)",
    };
    let patched = "entries patched in the process (returns through proftap's return trampoline)";
    if profile.recording.engine == Engine::Uprobe {
        return uprobes.to_string();
    }
    let by = |engine| profile.functions.iter().filter(|f| f.engine == Some(engine)).count();
    match (by(Engine::Inject), by(Engine::Uprobe)) {
        (0, probed) if probed > 0 => format!("{uprobes}: no function could be patched in the process"),
        (_, 0) => patched.to_string(),
        (_, probed) => format!("{patched}, and {probed} function{} seen by {uprobes}", if probed == 1 { "" } else { "s" }),
    }
}

fn header(profile: &Profile, out: &mut String) {
    let t = &profile.target;
    let how = if t.attached { "attached to" } else { "ran" };
    let ended = match (t.exit_code, t.signal) {
        (Some(code), _) => format!(", exited {code}"),
        (_, Some(sig)) => format!(", killed by signal {sig}"),
        _ if t.has_ended() => ", ended while recorded".to_string(),
        _ => String::new(),
    };
    let _ = writeln!(out, "proftap profile: {how} {} (pid {}{ended})", t.command.join(" "), t.pid);
    hottest(profile, out);
    let _ = writeln!(out, "  executable  {}{}", t.exe, t.build_id.as_deref().map(|b| format!(" (build-id {b})")).unwrap_or_default());
    let r = &profile.recording;
    if !probed(profile) {
        let _ = writeln!(
            out,
            "  recorded    {} by sampling only (no probes), {} process{}",
            format_ns(r.duration_ns),
            profile.processes.len().max(1),
            if profile.processes.len() > 1 { "es" } else { "" }
        );
        for note in crate::wording::notes(&profile.notes) {
            let _ = writeln!(out, "  note        {note}");
        }
        return;
    }
    let _ = writeln!(
        out,
        "  recorded    {} with {}, {} thread{}, {} process{}",
        format_ns(r.duration_ns),
        engines_used(profile),
        profile.threads.len(),
        if profile.threads.len() == 1 { "" } else { "s" },
        profile.processes.len().max(1),
        if profile.processes.len() > 1 { "es" } else { "" }
    );
    let _ = writeln!(out, "  metrics     {}", profile.metrics.iter().map(|m| metric_label(m)).collect::<Vec<_>>().join(", "));
    let calls = profile.total_calls();
    let _ = writeln!(
        out,
        "  calls       {} in {} functions, {} probe hits",
        group_digits(calls),
        // Calls are counted in the instrumented ones; the sampled have none.
        profile.functions.iter().filter(|f| f.mode != Mode::Sampled).count(),
        group_digits(r.events)
    );
    let o = &profile.overhead;
    if o.estimated_ns > 0 || o.call_ns_stepped > 0 {
        let share = if r.duration_ns > 0 { 100.0 * o.estimated_ns as f64 / r.duration_ns as f64 } else { 0.0 };
        // What the samples measured beside the estimate: a call's cost is
        // calibrated on a loop, and a real program's calls can cost more.
        let sampled = profile.samples.as_ref().and_then(|s| s.leaf_share(PROBE_OVERHEAD_FRAME));
        let sampled = sampled.map(|s| format!("; {:.1}% of the samples in the probes", 100.0 * s)).unwrap_or_default();
        // Counting the calls of functions whose probes were removed costs
        // too; its samples name the functions.
        let counting = profile.samples.as_ref().and_then(|s| s.counting_share());
        let sampled = sampled + &counting.map(|s| format!(", {:.1}% in their counting stubs", 100.0 * s)).unwrap_or_default();
        // Forked children making their memory: once per child, apart.
        let forks = profile.samples.as_ref().and_then(|s| s.leaf_share(FORK_FRAME)).filter(|&s| s > 0.0);
        let sampled = sampled + &forks.map(|s| format!(", {:.1}% making forked children's memory", 100.0 * s)).unwrap_or_default();
        let _ = writeln!(
            out,
            "  overhead    {} per probe hit, about {} of the run ({share:.1}%{sampled}); times {}",
            format_ns(o.per_hit_ns),
            format_ns(o.estimated_ns),
            if o.compensated { "compensated" } else { "not compensated (--compensate subtracts it)" }
        );
    } else {
        let _ = writeln!(out, "  overhead    not measured");
    }
    let l = &profile.lost;
    let _ = write!(out, "  lost        {} events", group_digits(l.events));
    if l.unmatched_returns > 0 {
        let attached = profile.target.attached;
        let why = if attached { "entered before recording, or" } else { "their" };
        let _ = write!(out, ", {} returns of calls not seen entering ({why} entry probe missed)", group_digits(l.unmatched_returns));
    }
    let _ = writeln!(out);
    if let Some(trace) = &profile.trace {
        let kept: u64 = trace.threads.iter().map(|t| t.calls.len() as u64).sum();
        let _ = write!(out, "  trace       {} calls one by one", group_digits(kept));
        if trace.cut > 0 {
            let size = format_bytes(trace.limit_bytes);
            let full = trace.cut.saturating_sub(trace.missed);
            let _ = write!(out, ", {} calls not kept", group_digits(trace.cut));
            let why = [
                (full > 0).then(|| format!("{} past the trace's {size} (--trace-size)", group_digits(full))),
                (trace.missed > 0).then(|| format!("{} finished faster than proftap read them", group_digits(trace.missed))),
            ];
            let _ = write!(out, " ({})", why.into_iter().flatten().collect::<Vec<_>>().join(", "));
        }
        let _ = writeln!(out, " (proftap report --slowest N F; proftap export --format chrome-trace)");
    }
    for note in crate::wording::notes(&profile.notes) {
        let _ = writeln!(out, "  note        {note}");
    }
}

fn flat(profile: &Profile, functions: &mut [FunctionStats], m: usize, options: &TextOptions, title: &str, out: &mut String) {
    let Some(key) = profile.metrics.get(m) else { return };
    sort_functions(profile, functions, options.sort, m);
    let duration = profile.recording.duration_ns.max(1);
    let share = |v: u64| -> String {
        if Unit::of(key) == Unit::Nanoseconds { format!("{:5.1}", 100.0 * v as f64 / duration as f64) } else { "    -".into() }
    };
    // With samples, each function also shows the share of samples with it on the stack.
    let sampled: HashMap<String, u64> =
        profile.samples.iter().flat_map(|s| s.functions().into_iter().map(|f| (f.frame.name, f.total_samples))).collect();
    let sample_total = profile.samples.as_ref().map_or(0, |s| s.total.max(1));
    let sampled_share = |name: &str| -> String {
        match (sample_total, sampled.get(name)) {
            (0, _) => String::new(),
            (_, Some(&n)) => format!(" {:5.1}", 100.0 * n as f64 / sample_total as f64),
            (_, None) => format!(" {:>5}", "0.0"),
        }
    };
    let _ = writeln!(
        out,
        "\nFlat profile{title}, {} (sorted by {}; %run: share of the recording's duration{})",
        metric_label(key),
        options.sort.describe(),
        if sample_total > 0 { "; %smp: share of samples with the function on the stack" } else { "" }
    );
    // On a narrow terminal: no min and max, narrower numbers, names
    // shortened to the width left.
    let smp = if sample_total > 0 { 6 } else { 0 };
    let narrow = options.width.is_some_and(|w| w < FULL_COLUMNS + smp + 30);
    let (wide, value_width) = if narrow { (NARROW_COLUMNS, 10) } else { (FULL_COLUMNS, 12) };
    let name_width = options.width.map_or(usize::MAX, |w| w.saturating_sub(wide + smp).max(16));
    let row = |cells: [&str; 8], smp_cell: &str, name: &str| -> String {
        let [calls, incl, incl_share, excl, excl_share, avg, min, max] = cells;
        let extremes = if narrow { String::new() } else { format!(" {min:>11} {max:>11}") };
        format!(
            "{calls:>w$} {incl:>w$} {incl_share:>5} {excl:>w$} {excl_share:>5} {avg:>a$}{extremes}{smp_cell}  {name}",
            w = value_width,
            a = value_width - 1
        )
    };
    let _ = writeln!(
        out,
        "{}",
        row(
            ["calls", "inclusive", "%run", "exclusive", "%run", "avg", "min", "max"],
            if sample_total > 0 { "  %smp" } else { "" },
            "function"
        )
    );
    let shown = options.top.unwrap_or(usize::MAX);
    for f in functions.iter().take(shown) {
        let incl = f.inclusive[m];
        let excl = f.exclusive[m];
        let name = function_name(profile, f.function);
        let mut label = String::new();
        if let Some(info) = profile.functions.get(f.function as usize).filter(|i| i.mode == Mode::Throttled) {
            label.push_str(&throttled_label(info.calls_after_throttle, info.calls_counted_until_stopped, narrow));
        }
        // Left to uprobes by the in-process engine: its times carry their cost.
        if profile.recording.engine == Engine::Inject
            && profile.functions.get(f.function as usize).is_some_and(|i| i.engine == Some(Engine::Uprobe))
        {
            label.push_str("  [uprobes]");
        }
        if f.unwound > 0 {
            label.push_str(&format!("  [{} unwound]", f.unwound));
        }
        if f.unfinished > 0 {
            label.push_str(&format!("  [{} unfinished]", f.unfinished));
        }
        if f.carried > 0 {
            label.push_str(&format!("  [{} carried on by forked children]", f.carried));
        }
        let timed = f.timed_calls();
        if f.untimed > 0 {
            // Their cost is their callers': no time of theirs to show.
            label.push_str(&if timed == 0 { "  [not timed]".to_string() } else { format!("  [{} not timed]", f.untimed) });
        }
        let untimed = timed == 0 && f.calls > 0;
        let time = |value: u64| if untimed { "-".to_string() } else { format_value(key, value) };
        let time_share = |value: u64| if untimed { "-".to_string() } else { share(value) };
        let cells = [
            group_digits(f.calls),
            time(incl.total),
            time_share(incl.total),
            time(excl.total),
            time_share(excl.total),
            time(incl.avg(timed)),
            time(incl.min_or_zero()),
            time(incl.max),
        ];
        let shortened = crate::output::shorten_middle(name, name_width.saturating_sub(label.chars().count()).max(12));
        let _ = writeln!(out, "{}", row(cells.each_ref().map(String::as_str), &sampled_share(name), &format!("{shortened}{label}")));
    }
    if functions.len() > shown {
        let _ = writeln!(out, "{:>12} more functions (--top)", functions.len() - shown);
    }
}

/// Sampled functions that were not instrumented: their share of samples
/// and estimated CPU time, the only numbers proftap has for them.
/// How sampled tables are sorted under `key` (see [`super::sort_sampled`]).
fn sampled_order(key: SortKey) -> &'static str {
    match key {
        SortKey::Name => "name",
        SortKey::Excl => "self",
        _ => "total",
    }
}

fn sampled_only(profile: &Profile, options: &TextOptions, out: &mut String) {
    let Some(samples) = &profile.samples else { return };
    let instrumented: std::collections::HashSet<&str> =
        profile.functions.iter().filter(|f| f.mode != Mode::Sampled).map(|f| f.name.as_str()).collect();
    let mut functions: Vec<_> = samples.functions().into_iter().filter(|f| !instrumented.contains(f.frame.name.as_str())).collect();
    super::sort_sampled(&mut functions, options.sort, |f| (f.self_samples, f.total_samples, &f.frame.name));
    let total = samples.total.max(1);
    let _ = writeln!(
        out,
        "\nSampled {} ({} samples at {} Hz of {}; not instrumented: estimated time, no call counts; sorted by {})",
        if instrumented.is_empty() { "profile" } else { "only" },
        group_digits(samples.total),
        samples.frequency_hz,
        samples.event,
        sampled_order(options.sort)
    );
    let _ = writeln!(out, "{:>7} {:>7} {:>12} {:>12}  function", "%self", "%total", "self", "total");
    let shown = options.top.unwrap_or(usize::MAX);
    let name_width = options.width.map_or(usize::MAX, |w| w.saturating_sub(43).max(16));
    for f in functions.iter().take(shown) {
        let module = std::path::Path::new(&f.frame.module).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let label = format!(
            "{}{}{}",
            f.frame.name,
            if module.is_empty() { String::new() } else { format!("  ({module})") },
            if f.frame.inlined { "  [inlined]" } else { "" },
        );
        let _ = writeln!(
            out,
            "{:>7.1} {:>7.1} {:>12} {:>12}  {}",
            100.0 * f.self_samples as f64 / total as f64,
            100.0 * f.total_samples as f64 / total as f64,
            format_ns(samples.estimated_ns(f.self_samples)),
            format_ns(samples.estimated_ns(f.total_samples)),
            crate::output::shorten_middle(&label, name_width),
        );
    }
    if functions.len() > shown {
        let _ = writeln!(out, "{:>7} more functions (--top)", functions.len() - shown);
    }
}

/// The calls of a function that neither its probes nor its counter saw.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Uncounted {
    /// None: it was never throttled, every call was timed.
    None,
    /// Estimated from its samples.
    Estimated,
    /// Unknown (nothing sampled them): its count is a lower bound.
    Unknown,
}

/// The hottest function's calls: `timed` by its probes, then, where it
/// was throttled, counted to the end (`after`) or until its counting
/// stopped too (`until`), or neither, the rest `uncounted`; "about" its
/// time where some of it is `estimated` from samples.
fn hottest_calls(timed: u64, estimated: u64, after: Option<u64>, until: Option<u64>, uncounted: Uncounted) -> (&'static str, String) {
    let about = if estimated > 0 { "about " } else { "" };
    match (estimated, after, until) {
        (_, None, None) if uncounted == Uncounted::Unknown => {
            (about, format!("at least {} calls: timed until its probes were removed, none counted after", group_digits(timed)))
        }
        (_, None, Some(until)) if uncounted != Uncounted::Estimated => (
            about,
            format!(
                "at least {} calls: {} timed, {} counted after its probes were removed, none counted after its counting stopped too",
                group_digits(timed.saturating_add(until)),
                group_digits(timed),
                group_digits(until)
            ),
        ),
        (_, None, Some(until)) => (
            "about ",
            format!(
                "{} calls timed, {} counted after its probes were removed, then estimated from samples after its counting stopped too",
                group_digits(timed),
                group_digits(until)
            ),
        ),
        (0, None, None) => ("", format!("{} call{}", group_digits(timed), if timed == 1 { "" } else { "s" })),
        (0, Some(after), _) => (
            "",
            format!("{} calls ({} of them after its probes were removed)", group_digits(timed.saturating_add(after)), group_digits(after)),
        ),
        (_, Some(after), _) => (
            "about ",
            format!(
                "{} calls ({} of them after its probes were removed, counted; their time estimated from samples)",
                group_digits(timed.saturating_add(after)),
                group_digits(after)
            ),
        ),
        // Calls its probes saw were timed; those after, counted or not, are in the samples.
        (_, None, None) => {
            ("about ", format!("{} calls timed, then estimated from samples after its probes were removed", group_digits(timed)))
        }
    }
}

/// The hottest function's calls when some were not timed: `timed` by its
/// probes, the others estimated from samples.
fn untimed_calls(timed: u64) -> String {
    let not_timed = "calls no probe timed (begun before the probes were placed, or left untimed) estimated from samples";
    match timed {
        0 => format!("its {not_timed}"),
        _ => format!("{} call{} timed, its {not_timed}", group_digits(timed), if timed == 1 { "" } else { "s" }),
    }
}

/// The flat profile's label of a throttled function, whose row is its
/// calls while it was instrumented: with how many it made after, where they
/// were counted (to the end, or `until` its counting stopped).
fn throttled_label(calls_after: Option<u64>, until: Option<u64>, narrow: bool) -> String {
    match (calls_after, until, narrow) {
        (_, _, true) => "  [throttled]".to_string(),
        (Some(after), _, false) => {
            format!("  [throttled: timed until its probes were removed, {} more calls counted after]", group_digits(after))
        }
        (None, Some(until), false) => format!(
            "  [throttled: timed until its probes were removed, {} more calls counted until its counting stopped; calls are a lower bound]",
            group_digits(until)
        ),
        (None, None, false) => "  [throttled: exact until its probes were removed, calls are a lower bound]".to_string(),
    }
}

/// Throttled functions after their probes were removed: their time from
/// the samples; their calls counted where the engine kept counting them,
/// else estimated (`~`, a rough figure): after counting stopped, at the
/// calls a sample stood for while they were counted, given enough such
/// samples, else the counted part and an unknown rest (`N+?`); where
/// nothing counted them, from the time at the CPU time per call measured
/// before the throttle, the only measure there is. The flat profile has
/// the exact part.
fn throttled(profile: &Profile, merged: &[FunctionStats], options: &TextOptions, out: &mut String) {
    let Some(samples) = &profile.samples else { return };
    if samples.throttled.functions.is_empty() {
        return;
    }
    let cpu = profile.metric_index("cpu_ns").or_else(|| profile.metric_index("wall_ns"));
    let info = |name: &str| profile.functions.iter().position(|f| f.name == name).map(|id| (id, &profile.functions[id]));
    // Outermost time per call, as the samples count a function's time once
    // however deep it recurses.
    let per_call = |id: usize| -> Option<u64> {
        let stats = merged.iter().find(|s| s.function == id as u32)?;
        stats.inclusive.get(cpu?)?.total.checked_div(stats.timed_calls()).filter(|&ns| ns > 0)
    };
    let _ = writeln!(
        out,
        "\nThrottled functions after their probes were removed (time estimated from {} samples at {} Hz; calls counted, ~ estimated from the samples, or N+? counted until counting stopped and the rest unknown; the flat profile has the exact part)",
        group_digits(samples.total),
        samples.frequency_hz
    );
    let _ = writeln!(out, "{:>12} {:>12} {:>12}  function", "calls", "~self", "~total");
    let shown = options.top.unwrap_or(usize::MAX);
    let mut functions: Vec<_> = samples.throttled.functions.iter().collect();
    super::sort_sampled(&mut functions, options.sort, |t| (t.self_samples, t.total_samples, &t.name));
    for t in functions.into_iter().take(shown) {
        let total = samples.estimated_ns(t.total_samples);
        let calls = match info(&t.name) {
            Some((id, f)) => match (f.calls_after_throttle, f.calls_counted_until_stopped) {
                (Some(counted), _) => group_digits(counted),
                // A run without samples stopped counting them: no estimate.
                (None, Some(counted)) if f.calls_after_counting_unknown => format!("{}+?", group_digits(counted)),
                // Counted until counting stopped, then estimated from the
                // samples since at the calls a sample stood for while
                // counted; else the counted part and an unknown rest. Not
                // at its cost per call when timed: counting stops for the
                // most frequent calls, the shortest, whose timed cost is
                // mostly the clock's (SQLite's and jq's such estimates were
                // 2 to 50 times off).
                (None, Some(counted)) => t
                    .calls_since_counting_stopped(counted)
                    .map_or(format!("{}+?", group_digits(counted)), |since| format!("~{}", group_digits(counted.saturating_add(since)))),
                (None, None) => per_call(id).map_or("?".to_string(), |ns| format!("~{}", group_digits(total / ns))),
            },
            None => "?".to_string(),
        };
        let _ = writeln!(out, "{:>12} {:>12} {:>12}  {}", calls, format_ns(samples.estimated_ns(t.self_samples)), format_ns(total), t.name);
    }
}

/// Instrumented functions' calls that no probe timed (begun before the
/// probes were placed, as in an attach to a loop that never returns, or
/// left untimed by the engine): their time from the samples. The flat
/// profile has the calls timed.
fn untimed(profile: &Profile, options: &TextOptions, out: &mut String) {
    let Some(samples) = &profile.samples else { return };
    if samples.throttled.untimed.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nCalls no probe timed, begun before the probes were placed or left untimed (time estimated from {} samples at {} Hz; the flat profile has the calls timed)",
        group_digits(samples.total),
        samples.frequency_hz
    );
    let _ = writeln!(out, "{:>12} {:>12}  function", "~self", "~total");
    let mut functions: Vec<_> = samples.throttled.untimed.iter().collect();
    super::sort_sampled(&mut functions, options.sort, |t| (t.self_samples, t.total_samples, &t.name));
    for t in functions.into_iter().take(options.top.unwrap_or(usize::MAX)) {
        let (own, total) = (samples.estimated_ns(t.self_samples), samples.estimated_ns(t.total_samples));
        let _ = writeln!(out, "{:>12} {:>12}  {}", format_ns(own), format_ns(total), t.name);
    }
}

fn regions(profile: &Profile, metrics: &[usize], out: &mut String) {
    for &m in metrics {
        let key = &profile.metrics[m];
        let _ = writeln!(out, "\nRegions, {}", metric_label(key));
        let _ = writeln!(out, "{:>12} {:>12} {:>11} {:>11} {:>11}  region", "entries", "inclusive", "avg", "min", "max");
        for r in &profile.regions {
            let s = r.inclusive[m];
            let _ = writeln!(
                out,
                "{:>12} {:>12} {:>11} {:>11} {:>11}  {} ({}:{}-{})",
                group_digits(r.entries),
                format_value(key, s.total),
                format_value(key, s.avg(r.entries)),
                format_value(key, s.min_or_zero()),
                format_value(key, s.max),
                r.name,
                r.file,
                r.start,
                r.end
            );
        }
    }
}

/// Each source file with, per line, its count (gcov's: `-` no code, `#####`
/// never run) and the time spent on it.
fn listing(profile: &Profile, metrics: &[usize], out: &mut String) {
    for file in super::coverage::by_file(profile) {
        let source = crate::sources::read_source(file.path).ok();
        let text: Vec<&str> = source.as_deref().map(|s| s.lines().collect()).unwrap_or_default();
        // Lines counted by edge counters have no time: no time columns.
        let metrics = if file.lines.values().any(|l| !l.cost.is_empty()) { metrics } else { &[][..] };
        let times = metrics.iter().map(|&m| metric_label(&profile.metrics[m])).collect::<Vec<_>>().join(", ");
        let mut what = if metrics.is_empty() { "count per line".to_string() } else { format!("count, then {times} per line") };
        if file.lines.values().any(|l| l.throttled) {
            what = format!("{what}; {}", super::coverage::LOWER_BOUND_LEGEND);
        }
        let _ = writeln!(out, "\nSource {} ({what})", file.path);
        let count_width = super::coverage::count_width(file.lines.values().copied());
        for number in super::coverage::shown_lines(&file, text.len()) {
            let source_line = text.get(number as usize - 1).copied().unwrap_or("");
            match file.lines.get(&number) {
                None => {
                    let _ = writeln!(out, "{:>count_width$} {:>width$} {number:>5}: {source_line}", "-", "", width = 12 * metrics.len());
                }
                Some(record) => {
                    let count = super::coverage::count_text(record);
                    let cost = |m: usize| record.cost.get(m).map_or(String::new(), |&v| format_value(&profile.metrics[m], v));
                    let costs: String = metrics.iter().map(|&m| format!("{:>12}", cost(m))).collect();
                    let _ = writeln!(out, "{count:>count_width$} {costs} {number:>5}: {source_line}");
                }
            }
        }
    }
}

/// Columns of the flat profile before the names: every column, and on a
/// narrow terminal without min and max.
const FULL_COLUMNS: usize = 12 + 1 + 12 + 1 + 5 + 1 + 12 + 1 + 5 + 1 + 11 + 12 + 12 + 2;
const NARROW_COLUMNS: usize = 10 + 1 + 10 + 1 + 5 + 1 + 10 + 1 + 5 + 1 + 9 + 2;

/// How many levels of the text tree are shown by indentation; deeper nodes
/// are indented as this level and say their depth, so that a tree
/// thousands of calls deep prints lines of bounded width.
const TREE_INDENT_LEVELS: usize = 64;

/// The calling contexts, `--depth` levels at most and at least
/// `--min-share` of the run, each with its share of the recording's
/// duration (time metrics); a function calling itself shows as one line
/// with the levels folded into it.
fn tree(profile: &Profile, tree: &CallTree, m: usize, options: &TextOptions, out: &mut String) {
    let key = profile.metrics.get(m).map_or("", String::as_str);
    let value = |values: &[u64]| format_value(key, values.get(m).copied().unwrap_or(0));
    let duration = profile.recording.duration_ns.max(1);
    let time = Unit::of(key) == Unit::Nanoseconds;
    let share = |values: &[u64]| -> String {
        let v = values.get(m).copied().unwrap_or(0);
        if time { format!(" {:5.1}%", 100.0 * v as f64 / duration as f64) } else { String::new() }
    };
    let small = |values: &[u64]| time && (values.get(m).copied().unwrap_or(0) as f64) < options.min_share * duration as f64;
    let children = tree.children();
    let most = options.depth.unwrap_or(usize::MAX);
    let (mut deeper, mut smaller) = (0u64, 0u64);
    // Depth-first without recursion: deep recursion in the target must not
    // overflow proftap's stack.
    let mut stack: Vec<(u32, usize)> = children.first().into_iter().flatten().rev().map(|&c| (c, 0)).collect();
    while let Some((i, level)) = stack.pop() {
        let n = &tree.nodes[i as usize];
        if level >= most || small(&n.inclusive) {
            *(if level >= most { &mut deeper } else { &mut smaller }) += 1;
            stack.extend(children[i as usize].iter().map(|&c| (c, level + 1)));
            continue;
        }
        // Direct recursion, one call chain: folded into this line.
        let (mut last, mut levels, mut calls, mut exclusive) = (i, 0u64, 0u64, 0u64);
        while let [only] = children[last as usize].as_slice()
            && tree.nodes[*only as usize].function == n.function
        {
            let inner = &tree.nodes[*only as usize];
            (last, levels) = (*only, levels + 1);
            calls = calls.saturating_add(inner.calls);
            exclusive = exclusive.saturating_add(inner.exclusive.get(m).copied().unwrap_or(0));
        }
        let folded = if levels > 0 {
            format!("  [recursion: +{} levels, {} calls, {} self]", group_digits(levels), group_digits(calls), format_value(key, exclusive))
        } else {
            String::new()
        };
        let deep = if level >= TREE_INDENT_LEVELS { format!("[depth {}] ", level + 1) } else { String::new() };
        if n.estimated {
            let never = profile.functions.get(n.function as usize).is_some_and(|f| f.mode == Mode::Sampled);
            let why = if never { "not instrumented" } else { "after its probes were removed" };
            let _ = writeln!(
                out,
                "{:indent$}{deep}{} ~  ~{} / ~{}{}  [estimated from samples {why}]",
                "",
                function_name(profile, n.function),
                value(&n.inclusive),
                value(&n.exclusive),
                share(&n.inclusive),
                indent = 2 * level.min(TREE_INDENT_LEVELS) + 2
            );
            continue;
        }
        let _ = writeln!(
            out,
            "{:indent$}{deep}{} {}x  {} / {}{}{folded}",
            "",
            function_name(profile, n.function),
            group_digits(n.calls),
            value(&n.inclusive),
            value(&n.exclusive),
            share(&n.inclusive),
            indent = 2 * level.min(TREE_INDENT_LEVELS) + 2
        );
        stack.extend(children[last as usize].iter().rev().map(|&c| (c, level + 1)));
    }
    if deeper > 0 {
        let _ = writeln!(out, "  ({} calling contexts deeper than {most} levels not shown: --depth)", group_digits(deeper));
    }
    if smaller > 0 {
        let _ = writeln!(
            out,
            "  ({} calling contexts under {}% of the run not shown: --min-share)",
            group_digits(smaller),
            options.min_share * 100.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_profile::{FunctionInfo, ThreadProfile, TreeNode};

    /// A profile whose tree is one chain 1,000 calls deep, of `down` alone
    /// or of `down` and `up` in turn.
    fn deep(alternating: bool) -> Profile {
        let mut tree = CallTree::new(1);
        for parent in 0..1000u32 {
            let function = if alternating { parent % 2 } else { 0 };
            tree.nodes.push(TreeNode { function, parent, calls: 1, inclusive: vec![1], exclusive: vec![1], estimated: false });
        }
        Profile {
            metrics: vec!["wall_ns".into()],
            functions: ["down", "up"].iter().map(|n| FunctionInfo { name: (*n).into(), ..FunctionInfo::default() }).collect(),
            threads: vec![ThreadProfile { pid: 1, tid: 1, name: String::new(), functions: Vec::new(), tree }],
            ..Profile::default()
        }
    }

    fn options() -> TextOptions {
        TextOptions {
            sort: SortKey::Incl,
            top: None,
            tree: true,
            threads: false,
            metrics: Vec::new(),
            lines: false,
            depth: None,
            min_share: 0.0,
            width: None,
        }
    }

    #[test]
    fn recursion_folds_into_one_line() {
        let text = render(&deep(false), &options());
        let tree: Vec<&str> = text.lines().filter(|l| l.contains("down 1x")).collect();
        assert_eq!(tree, ["  down 1x  1 ns / 1 ns 100.0%  [recursion: +999 levels, 999 calls, 999 ns self]"]);
    }

    #[test]
    fn a_deep_tree_prints_lines_of_bounded_width() {
        let profile = deep(true);
        let options = options();
        let text = render(&profile, &options);
        let tree: Vec<&str> = text.lines().filter(|l| l.contains(" 1x ")).collect();
        assert_eq!(tree.len(), 1000);
        assert!(tree.iter().all(|l| l.len() < 2 * TREE_INDENT_LEVELS + 48), "{}", tree[999]);
        assert_eq!(tree[999].trim_start(), "[depth 1000] up 1x  1 ns / 1 ns 100.0%");
        assert_eq!(tree[63].trim_start(), "up 1x  1 ns / 1 ns 100.0%");
        // With --depth 10: ten levels, and a line saying what is left out.
        let text = render(&profile, &TextOptions { depth: Some(10), ..options });
        let tree: Vec<&str> = text.lines().filter(|l| l.contains(" 1x ")).collect();
        assert_eq!(tree.len(), 10);
        assert!(text.contains("990 calling contexts deeper than 10 levels not shown"), "{text}");
        assert!(tree.iter().all(|l| l.chars().count() <= 80), "{text}");
    }

    /// Thread `tid`, one call of function 0 taking a second of CPU time.
    fn busy_second(tid: i32) -> ThreadProfile {
        let mut tree = CallTree::new(1);
        tree.nodes.push(TreeNode {
            function: 0,
            parent: 0,
            calls: 1,
            inclusive: vec![1_000_000_000],
            exclusive: vec![1_000_000_000],
            estimated: false,
        });
        let mut stats = FunctionStats::new(0, 1);
        stats.calls = 1;
        stats.exclusive[0].total = 1_000_000_000;
        ThreadProfile { pid: 1, tid, name: String::new(), functions: vec![stats], tree }
    }

    /// Two threads each spending a whole second of CPU in `work` during a
    /// one-second run: `work` is all of their CPU time, not 200% of the run.
    #[test]
    fn a_threads_cpu_time_is_a_share_of_all_threads_not_of_the_run() {
        let mut profile = Profile {
            metrics: vec!["cpu_ns".into()],
            functions: vec![FunctionInfo { name: "work".into(), ..FunctionInfo::default() }],
            threads: vec![busy_second(1), busy_second(2)],
            ..Profile::default()
        };
        profile.recording.duration_ns = 1_000_000_000;
        let mut out = String::new();
        hottest(&profile, &mut out);
        assert_eq!(out, "  hottest     work: 2.000 s CPU time in itself, 100.0% of the threads' CPU time, 2 calls\n");
        profile.threads.pop();
        out.clear();
        hottest(&profile, &mut out);
        assert_eq!(out, "  hottest     work: 1.000 s CPU time in itself, 100.0% of the run, 1 call\n");
    }

    /// Threads that ran outside every timed call (calls begun before an
    /// attach): their CPU time is what the samples saw, more than the
    /// probes measured, and the hottest function's share is of it.
    #[test]
    fn the_threads_cpu_time_is_what_the_samples_saw_where_that_is_more() {
        let samples = |event: &str| proftap_profile::SampleProfile {
            event: event.into(),
            frequency_hz: 1000,
            total: 8000,
            ..proftap_profile::SampleProfile::default()
        };
        let mut profile = Profile {
            metrics: vec!["cpu_ns".into()],
            functions: vec![FunctionInfo { name: "work".into(), ..FunctionInfo::default() }],
            threads: vec![busy_second(1), busy_second(2)],
            samples: Some(samples("cpu-clock")),
            ..Profile::default()
        };
        profile.recording.duration_ns = 4_000_000_000;
        for event in ["cpu-clock", "cycles"] {
            profile.samples = Some(samples(event));
            let mut out = String::new();
            hottest(&profile, &mut out);
            assert!(out.contains("2.000 s CPU time in itself, 25.0% of the threads' CPU time"), "{event}: {out}");
        }
        // Samples of another event say nothing of time.
        profile.samples = Some(samples("page-faults"));
        let mut out = String::new();
        hottest(&profile, &mut out);
        assert!(out.contains("100.0% of the threads' CPU time"), "{out}");
        // Calls of `work` no probe timed, 2 s by the samples, of 3 s
        // sampled: its 4 s are all the threads' CPU time, not 133% of it.
        let mut some = samples("cpu-clock");
        some.total = 3000;
        some.throttled.untimed = vec![proftap_profile::ThrottledSamples {
            name: "work".into(),
            self_samples: 2000,
            total_samples: 2000,
            ..proftap_profile::ThrottledSamples::default()
        }];
        profile.samples = Some(some);
        let mut out = String::new();
        hottest(&profile, &mut out);
        assert!(out.contains("100.0% of the threads' CPU time"), "{out}");
    }

    /// The in-process engine asked for names what saw the calls: itself,
    /// uprobes alone where it patched nothing, or both.
    #[test]
    fn the_header_says_which_engines_saw_the_calls() {
        let function = |engine| FunctionInfo { name: "f".into(), engine, ..FunctionInfo::default() };
        let recorded = |engines: &[Engine]| {
            let mut profile = Profile::default();
            profile.recording.engine = Engine::Inject;
            profile.functions = engines.iter().map(|&e| function(Some(e))).collect();
            profile.functions.push(function(None));
            engines_used(&profile)
        };
        assert!(recorded(&[Engine::Inject]).starts_with("entries patched in the process"));
        assert_eq!(recorded(&[Engine::Uprobe]), "uprobes (returns seen by return probes): no function could be patched in the process");
        let both = recorded(&[Engine::Inject, Engine::Uprobe, Engine::Uprobe]);
        assert!(
            both.starts_with("entries patched") && both.ends_with("and 2 functions seen by uprobes (returns seen by return probes)"),
            "{both}"
        );
    }

    /// Counts from a profile file are anyone's to write: a count after a
    /// throttle that would overflow the total is shown saturated, no panic.
    #[test]
    fn a_hostile_count_after_a_throttle_saturates() {
        let mut stats = FunctionStats::new(0, 1);
        stats.calls = u64::MAX - 1;
        stats.exclusive[0].total = 5;
        let profile = Profile {
            metrics: vec!["cpu_ns".into()],
            functions: vec![FunctionInfo {
                name: "f".into(),
                mode: Mode::Throttled,
                calls_after_throttle: Some(10),
                ..FunctionInfo::default()
            }],
            threads: vec![ThreadProfile { pid: 1, tid: 1, name: String::new(), functions: vec![stats], tree: CallTree::new(1) }],
            ..Profile::default()
        };
        let mut out = String::new();
        hottest(&profile, &mut out);
        assert!(out.contains(&format!("{} calls (10 of them", group_digits(u64::MAX))), "{out}");
    }

    /// Without samples, or a merged run's that had none, a throttled
    /// function's calls its probes and counters did not see are unknown:
    /// the count is at least what they saw; its time "about" only where
    /// samples estimate some of it.
    #[test]
    fn the_hottest_throttled_functions_calls_nothing_estimated_are_a_lower_bound() {
        let (about, calls) = hottest_calls(1_000, 0, None, None, Uncounted::Unknown);
        assert_eq!((about, calls.as_str()), ("", "at least 1,000 calls: timed until its probes were removed, none counted after"));
        let (about, calls) = hottest_calls(1_000, 5, None, Some(978), Uncounted::Unknown);
        assert_eq!(about, "about ");
        assert!(calls.starts_with("at least 1,978 calls: 1,000 timed, 978 counted"), "{calls}");
        assert_eq!(hottest_calls(1_000, 0, None, None, Uncounted::None).1, "1,000 calls", "not throttled: every call timed");
        assert!(hottest_calls(1_000, 5, None, None, Uncounted::Estimated).1.contains("then estimated from samples"));
    }

    /// A throttled function whose calls after the throttle were not
    /// counted, or not to the end: those its probes saw were timed, those
    /// counted after are said, the rest are estimated.
    #[test]
    fn the_hottest_throttled_function_says_its_calls_were_timed_then_estimated() {
        use proftap_profile::{SampleProfile, ThrottledSamples};
        let mut stats = FunctionStats::new(0, 1);
        stats.calls = 1_000;
        stats.exclusive[0].total = 5_000_000;
        let mut samples = SampleProfile { frequency_hz: 1000, total: 40, ..SampleProfile::default() };
        samples.throttled.functions =
            vec![ThrottledSamples { name: "f".into(), self_samples: 10, total_samples: 20, ..ThrottledSamples::default() }];
        let mut profile = Profile {
            metrics: vec!["cpu_ns".into()],
            functions: vec![FunctionInfo { name: "f".into(), mode: Mode::Throttled, ..FunctionInfo::default() }],
            threads: vec![ThreadProfile { pid: 1, tid: 1, name: String::new(), functions: vec![stats], tree: CallTree::new(1) }],
            samples: Some(samples),
            ..Profile::default()
        };
        let mut out = String::new();
        hottest(&profile, &mut out);
        assert!(out.starts_with("  hottest     f: about 15.00 ms CPU time in itself"), "{out}");
        assert!(out.ends_with(", 1,000 calls timed, then estimated from samples after its probes were removed\n"), "{out}");
        // Counted for a while after the throttle, until counting stopped too.
        profile.functions[0].calls_counted_until_stopped = Some(978);
        let mut out = String::new();
        hottest(&profile, &mut out);
        let said =
            ", 1,000 calls timed, 978 counted after its probes were removed, then estimated from samples after its counting stopped too\n";
        assert!(out.ends_with(said), "{out}");
        // Five samples while it counted are too few to estimate the rest:
        // the calls counted are a lower bound.
        profile.samples.as_mut().unwrap().throttled.functions[0].total_samples_uncounted = 15;
        let mut out = String::new();
        hottest(&profile, &mut out);
        assert!(out.contains(", at least 1,978 calls: 1,000 timed, 978 counted after its probes were removed"), "{out}");
    }

    /// The overhead line gives the samples in the probes and, apart, those
    /// in the counting stubs (whose stacks name the functions counted); a
    /// profile file saying more samples there than in all says 100%.
    #[test]
    fn the_overhead_line_gives_the_samples_in_the_counting_stubs() {
        use proftap_profile::{SampleProfile, SampledFrame, SampledStack};
        let frame = |name: &str| SampledFrame { name: name.into(), module: String::new(), inlined: false };
        let line = |in_counting_stubs: u64| {
            let samples = SampleProfile {
                frames: vec![frame("main"), frame(PROBE_OVERHEAD_FRAME)],
                stacks: vec![SampledStack { frames: vec![0], count: 90 }, SampledStack { frames: vec![0, 1], count: 10 }],
                in_counting_stubs,
                ..SampleProfile::default()
            };
            let f = FunctionInfo { name: "f".into(), mode: Mode::Throttled, ..FunctionInfo::default() };
            let mut profile = Profile { functions: vec![f], samples: Some(samples), ..Profile::default() };
            profile.overhead.estimated_ns = 1_000;
            let mut out = String::new();
            header(&profile, &mut out);
            out.lines().find(|l| l.starts_with("  overhead")).map(str::to_string).unwrap_or_else(|| panic!("{out}"))
        };
        assert!(line(0).contains("; 10.0% of the samples in the probes)"), "{}", line(0));
        assert!(line(5).contains("; 10.0% of the samples in the probes, 5.0% in their counting stubs)"), "{}", line(5));
        assert!(line(u64::MAX).contains(", 100.0% in their counting stubs)"), "{}", line(u64::MAX));
    }

    /// A throttled function's calls after its probes went: counted where
    /// the engine kept counting them, else estimated and marked `~`.
    #[test]
    fn throttled_functions_give_their_counted_calls_or_an_estimate() {
        use proftap_profile::{SampleProfile, ThrottledSamples};
        let info = |name: &str, after: Option<u64>| FunctionInfo {
            name: name.into(),
            mode: Mode::Throttled,
            calls_after_throttle: after.filter(|_| name != "stopped"),
            calls_counted_until_stopped: after.filter(|_| name == "stopped"),
            ..FunctionInfo::default()
        };
        // Both took 1,000 calls of 1 us each before the throttle.
        let stats = |function: u32| {
            let mut stats = FunctionStats::new(function, 1);
            stats.calls = 1_000;
            stats.inclusive[0].total = 1_000_000;
            stats
        };
        // Counting stopped 5 of the 20 samples before the end; too few
        // samples were taken while it counted to stand for calls.
        let sampled = |name: &str| ThrottledSamples {
            name: name.into(),
            self_samples: 10,
            total_samples: 20,
            total_samples_uncounted: if name == "stopped" { 15 } else { 0 },
            counting_samples: 0,
        };
        let mut samples = SampleProfile { frequency_hz: 1000, total: 40, ..SampleProfile::default() };
        samples.throttled.functions = vec![sampled("counted"), sampled("estimated"), sampled("stopped")];
        let profile = Profile {
            metrics: vec!["cpu_ns".into()],
            functions: vec![info("counted", Some(123_456)), info("estimated", None), info("stopped", Some(7_000))],
            samples: Some(samples),
            ..Profile::default()
        };
        let mut out = String::new();
        throttled(&profile, &[stats(0), stats(1), stats(2)], &options(), &mut out);
        let rows: Vec<&str> = out.lines().skip(3).collect();
        // 20 ms after the throttle at 1 us a call: about 20,000; 15 ms
        // after counting stopped: 7,000 counted and about 15,000 more.
        let expected = [
            "     123,456     10.00 ms     20.00 ms  counted",
            "     ~20,000     10.00 ms     20.00 ms  estimated",
            "     7,000+?     10.00 ms     20.00 ms  stopped",
        ];
        assert_eq!(rows, expected, "{out}");
        // Without a cost per call, the same.
        let mut out = String::new();
        throttled(&profile, &[stats(0), stats(1)], &options(), &mut out);
        assert!(out.lines().any(|l| l.trim_start().starts_with("7,000+?") && l.ends_with("stopped")), "{out}");
        // 9 samples while it counted are too few to stand for its calls.
        let mut few = profile.clone();
        few.samples.as_mut().unwrap().throttled.functions[2].total_samples = 24;
        let mut out = String::new();
        throttled(&few, &[stats(0), stats(1), stats(2)], &options(), &mut out);
        assert!(out.lines().any(|l| l.trim_start().starts_with("7,000+?") && l.ends_with("stopped")), "{out}");
        // With 10 samples or more while it counted, at the calls each stood
        // for then: 7,000 calls over 10 samples, then 15 samples.
        let mut more = profile.clone();
        let stopped = &mut more.samples.as_mut().unwrap().throttled.functions[2];
        stopped.total_samples = 25;
        for stats in [vec![stats(0), stats(1), stats(2)], vec![stats(0), stats(1)]] {
            let mut out = String::new();
            throttled(&more, &stats, &options(), &mut out);
            assert!(out.lines().any(|l| l.trim_start().starts_with("~17,500 ") && l.ends_with("stopped")), "{out}");
        }
        // The flat profile's row says how many more were counted, where they were.
        assert!(throttled_label(Some(123_456), None, false).contains("123,456 more calls counted after"));
        assert!(throttled_label(None, None, false).contains("calls are a lower bound"));
        let until = throttled_label(None, Some(978), false);
        assert!(until.contains("978 more calls counted until its counting stopped; calls are a lower bound"), "{until}");
        assert_eq!(throttled_label(Some(1), None, true), "  [throttled]");
    }

    #[test]
    fn values_format_with_units() {
        assert_eq!(format_ns(999), "999 ns");
        assert_eq!(format_ns(1_500), "1.50 us");
        assert_eq!(format_ns(2_345_678), "2.35 ms");
        assert_eq!(format_ns(3_000_000_000), "3.000 s");
        assert_eq!(group_digits(1_234_567), "1,234,567");
        assert_eq!(group_digits(12), "12");
        assert_eq!(format_value("page_faults", 1000), "1,000");
    }
}
