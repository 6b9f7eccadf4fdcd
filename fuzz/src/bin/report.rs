//! The renderers of `proftap report` and `proftap export` (text with every
//! part shown, JSON, folded stacks and their flame graph, pprof, gcov,
//! lcov, gcov JSON, a function's callers and callees) on every profile
//! `read_profile` accepts: a profile file is anyone's to write, and a report
//! of it must not panic.

use proftap_cli::report::{SortKey, callgraph, coverage, flame, json, pprof, text};

proftap_fuzz::target!(run);

fn run(data: &[u8]) {
    let file = proftap_fuzz::profile_file(data);
    let Ok(profile) = proftap_fuzz::with_file("fuzz.profile", &file, proftap_profile::read_profile) else { return };
    for sort in [SortKey::Excl, SortKey::Avg, SortKey::Name] {
        let options = text::TextOptions {
            sort,
            top: Some(20),
            tree: true,
            threads: true,
            metrics: Vec::new(),
            lines: true,
            depth: None,
            min_share: 0.0,
            width: Some(100),
        };
        let _ = text::render(&profile, &options);
    }
    let _ = json::report(&profile);
    for m in 0..profile.metrics.len().min(2) {
        if let Ok(lines) = flame::folded(&profile, None, m) {
            let _ = flame::svg(&lines, "fuzz", "ns");
        }
    }
    let _ = flame::folded_samples(&profile);
    let _ = pprof::encode(&profile);
    let files = coverage::by_file(&profile);
    let _ = coverage::gcov_file_names(&files);
    for file in files.iter().take(4) {
        let _ = coverage::gcov_text(&profile, file, Some("int main(void)\n{\n}\n"), "fuzz.gcda", coverage::BranchOutput::Percent);
    }
    let _ = coverage::lcov(&profile);
    let _ = coverage::gcov_json(&profile, "fuzz.gcda");
    if let Some(f) = profile.functions.first() {
        for side in [callgraph::Side::Callers, callgraph::Side::Callees] {
            let _ = callgraph::render(&profile, &f.name, side, 0);
        }
    }
}
