//! What a profile must satisfy before anything renders, merges or compares
//! it. A profile file is hostile input: its indexes, lengths and shapes are
//! checked once, right after decoding, so that every later use may index
//! without checking and no renderer can be driven into unbounded work.
//! The limits are documented in `docs/FORMAT.md`.

use crate::model::{CallTree, FunctionInfo, Profile, ROOT, SampleProfile, ThreadProfile, Trace};

/// The deepest call tree a profile may hold, in levels below the root:
/// above the 262,144 nested calls the in-process engine times (kernel
/// uprobes follow recursion as deep as the program goes).
pub const MAX_TREE_DEPTH: u32 = 300_000;

/// The largest source line number a profile may name.
pub const MAX_LINE: u32 = 10_000_000;

/// The most metrics a profile may measure (a recording takes at most 8).
pub const MAX_METRICS: usize = 64;

/// The most bytes of names (function name, module and file) a profile may
/// refer to, counted at every reference: a thread's entry, a call tree node,
/// a sampled frame in a stack. Reports print a name at each reference, so
/// this bounds what a small file can make them print.
pub const MAX_NAME_REFERENCES: u64 = 2 << 30;

/// Why a profile cannot be used: a clause naming what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidProfile(String);

type Check = Result<(), InvalidProfile>;

fn fail(reason: String) -> Check {
    Err(InvalidProfile(reason))
}

impl Profile {
    /// Checks every index, length and bound the model relies on: function
    /// ids, tree parents (each before its children, so trees have no cycle),
    /// tree depth, sampled frames, per-metric vector lengths, line numbers
    /// and the bytes of names referred to. Readers call it on every profile
    /// they decode; the daemon should call it on profiles it receives.
    pub fn validate(&self) -> Check {
        let metrics = self.metrics.len();
        if metrics > MAX_METRICS {
            return fail(format!("it measures {metrics} metrics, more than the {MAX_METRICS} a profile may have"));
        }
        if self.functions.len() >= ROOT as usize {
            return fail(format!("it lists {} functions, more than function ids can number", self.functions.len()));
        }
        for (id, f) in self.functions.iter().enumerate() {
            line_in_range(f.line, || format!("function {id} is declared"))?;
        }
        let weights: Vec<u64> = self.functions.iter().map(name_weight).collect();
        let mut names = NameBudget(0);
        for thread in &self.threads {
            check_thread(thread, metrics, &weights, &mut names)?;
        }
        self.check_lines(metrics)?;
        for c in &self.lost.by_function {
            if !usize::try_from(c.id).is_ok_and(|id| id < self.functions.len()) {
                return fail(format!("its lost events name function {}, but it has {} functions", c.id, self.functions.len()));
            }
            names.add(weights[c.id as usize])?;
        }
        if let Some(samples) = &self.samples {
            check_samples(samples, &mut names)?;
            // One entry per function at most: each is looked up by name for each function.
            let untimed = samples.throttled.untimed.len();
            if untimed > self.functions.len() {
                return fail(format!(
                    "its samples list {untimed} functions' calls not timed, but it has {} functions",
                    self.functions.len()
                ));
            }
        }
        if let Some(trace) = &self.trace {
            let stacks = self.samples.as_ref().map_or(0, |s| s.stacks.len());
            check_trace(trace, self.functions.len(), stacks)?;
        }
        Ok(())
    }

    fn check_lines(&self, metrics: usize) -> Check {
        for l in &self.lines {
            line_in_range(l.line, || format!("a line record of {}", l.file))?;
            if !l.cost.is_empty() {
                lengths(l.cost.len(), metrics, || format!("the line record of {} line {}", l.file, l.line))?;
            }
        }
        for r in &self.regions {
            line_in_range(r.start.max(r.end), || format!("region {}", r.name))?;
            lengths(r.inclusive.len(), metrics, || format!("region {}", r.name))?;
        }
        Ok(())
    }
}

/// Bytes of a function's names that a reference to it may print.
fn name_weight(f: &FunctionInfo) -> u64 {
    (f.name.len() + f.module.len() + f.file.as_ref().map_or(0, String::len)) as u64
}

struct NameBudget(u64);

impl NameBudget {
    fn add(&mut self, bytes: u64) -> Check {
        self.0 = self.0.saturating_add(bytes);
        if self.0 > MAX_NAME_REFERENCES {
            return fail(format!(
                "it refers to more than {} GiB of function and frame names in all, which no recording does",
                MAX_NAME_REFERENCES >> 30
            ));
        }
        Ok(())
    }
}

fn line_in_range(line: u32, what: impl Fn() -> String) -> Check {
    if line > MAX_LINE {
        return fail(format!("{} at line {line}, beyond the largest line number a profile may name, {MAX_LINE}", what()));
    }
    Ok(())
}

fn lengths(len: usize, metrics: usize, what: impl Fn() -> String) -> Check {
    if len != metrics {
        return fail(format!("{} has {len} values per metric where the profile measures {metrics} metrics", what()));
    }
    Ok(())
}

fn function_in_range(id: u32, functions: usize, what: impl Fn() -> String) -> Check {
    if id as usize >= functions {
        return fail(format!("{} names function {id}, but the profile has {functions} functions", what()));
    }
    Ok(())
}

fn check_thread(thread: &ThreadProfile, metrics: usize, weights: &[u64], names: &mut NameBudget) -> Check {
    let tid = thread.tid;
    for s in &thread.functions {
        function_in_range(s.function, weights.len(), || format!("thread {tid}"))?;
        lengths(s.inclusive.len(), metrics, || format!("thread {tid}'s entry for function {}", s.function))?;
        lengths(s.exclusive.len(), metrics, || format!("thread {tid}'s entry for function {}", s.function))?;
        names.add(weights[s.function as usize])?;
    }
    check_tree(&thread.tree, metrics, weights, names).map_err(|e| InvalidProfile(format!("thread {tid}'s call tree: {}", e.0)))
}

/// Node 0 is the root; every other node names an earlier node as its
/// parent, which rules out cycles and lets one pass compute depths.
fn check_tree(tree: &CallTree, metrics: usize, weights: &[u64], names: &mut NameBudget) -> Check {
    let Some(root) = tree.nodes.first() else { return fail("it has no root node".into()) };
    if root.function != ROOT || root.parent != ROOT {
        return fail("its first node is not the root".into());
    }
    if tree.nodes.len() > ROOT as usize {
        return fail(format!("it has {} nodes, more than node indexes can number", tree.nodes.len()));
    }
    let mut depth = vec![0u32; tree.nodes.len()];
    for (i, node) in tree.nodes.iter().enumerate() {
        lengths(node.inclusive.len(), metrics, || format!("node {i}"))?;
        lengths(node.exclusive.len(), metrics, || format!("node {i}"))?;
        if i == 0 {
            continue;
        }
        if node.parent as usize >= i {
            return fail(format!("node {i} has parent {}, which is not an earlier node", node.parent));
        }
        function_in_range(node.function, weights.len(), || format!("node {i}"))?;
        depth[i] = depth[node.parent as usize] + 1;
        if depth[i] > MAX_TREE_DEPTH {
            return fail(format!("it is deeper than {MAX_TREE_DEPTH} levels"));
        }
        names.add(weights[node.function as usize])?;
    }
    Ok(())
}

fn check_samples(samples: &SampleProfile, names: &mut NameBudget) -> Check {
    let frames = samples.frames.len();
    if frames > u32::MAX as usize {
        return fail(format!("its samples list {frames} frames, more than frame indexes can number"));
    }
    for (i, stack) in samples.stacks.iter().enumerate() {
        for &f in &stack.frames {
            let Some(frame) = samples.frames.get(f as usize) else {
                return fail(format!("sampled stack {i} names frame {f}, but the samples have {frames} frames"));
            };
            names.add(frame.name.len() as u64)?;
        }
    }
    for l in &samples.lines {
        line_in_range(l.line, || format!("the samples of {}", l.file))?;
    }
    let throttled = &samples.throttled;
    let by_function = throttled.functions.iter().chain(&throttled.untimed).map(|t| &t.name);
    let held = throttled.held.iter().flat_map(|h| [&h.name, &h.callee, &h.callee_module]);
    for name in by_function.chain(held).chain(throttled.kept.iter().map(|k| &k.name)) {
        names.add(name.len() as u64)?;
    }
    Ok(())
}

fn check_trace(trace: &Trace, functions: usize, stacks: usize) -> Check {
    for thread in &trace.threads {
        for call in &thread.calls {
            function_in_range(call.function, functions, || format!("a traced call of thread {}", thread.tid))?;
        }
        if let Some(s) = thread.samples.iter().find(|s| s.stack as usize >= stacks) {
            return fail(format!("a traced sample of thread {} names stack {}, but the samples have {stacks} stacks", thread.tid, s.stack));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        FunctionInfo, FunctionStats, LineRecord, LostCount, SampledFrame, SampledStack, ThreadTrace, TracedCall, TracedSample, TreeNode,
    };
    use crate::stats::Stat;

    fn node(function: u32, parent: u32) -> TreeNode {
        TreeNode { function, parent, calls: 1, inclusive: vec![1], exclusive: vec![1], estimated: false }
    }

    /// main -> f, one thread, one metric, a line and a sampled stack.
    fn valid() -> Profile {
        let mut tree = CallTree::new(1);
        tree.nodes.push(node(0, 0));
        tree.nodes.push(node(1, 1));
        let frame = SampledFrame { name: "main".into(), module: String::new(), inlined: false };
        Profile {
            metrics: vec!["wall_ns".into()],
            functions: vec![
                FunctionInfo { name: "main".into(), ..FunctionInfo::default() },
                FunctionInfo { name: "f".into(), ..FunctionInfo::default() },
            ],
            threads: vec![ThreadProfile { pid: 1, tid: 7, name: String::new(), functions: vec![FunctionStats::new(1, 1)], tree }],
            lines: vec![LineRecord { file: "a.c".into(), line: 3, count: 1, cost: vec![2], branches: Vec::new(), throttled: false }],
            samples: Some(SampleProfile {
                frames: vec![frame],
                stacks: vec![SampledStack { frames: vec![0, 0], count: 1 }],
                ..SampleProfile::default()
            }),
            ..Profile::default()
        }
    }

    fn reason(p: &Profile) -> String {
        p.validate().expect_err("invalid").to_string()
    }

    #[test]
    fn a_recorded_shape_is_valid() {
        valid().validate().expect("valid");
        Profile::default().validate().expect("an empty profile is valid");
    }

    #[test]
    fn indexes_out_of_range_are_named() {
        let mut p = valid();
        p.threads[0].tree.nodes[2].parent = 999;
        assert_eq!(reason(&p), "thread 7's call tree: node 2 has parent 999, which is not an earlier node");
        let mut p = valid();
        p.threads[0].tree.nodes[1].function = 5;
        assert_eq!(reason(&p), "thread 7's call tree: node 1 names function 5, but the profile has 2 functions");
        let mut p = valid();
        p.threads[0].functions[0].function = ROOT;
        assert!(reason(&p).starts_with("thread 7 names function 4294967295"), "{}", reason(&p));
        let mut p = valid();
        p.samples.as_mut().expect("samples").stacks[0].frames.push(3);
        assert_eq!(reason(&p), "sampled stack 0 names frame 3, but the samples have 1 frames");
        let mut p = valid();
        p.lost.by_function.push(LostCount { id: -1, count: 1 });
        assert!(reason(&p).contains("name function -1"), "{}", reason(&p));
        // Each function's calls not timed are looked up by its name: no more entries than functions.
        let mut p = valid();
        let untimed = |name: &str| crate::ThrottledSamples { name: name.into(), self_samples: 1, total_samples: 1, ..Default::default() };
        p.samples.as_mut().expect("samples").throttled.untimed = vec![untimed("main"), untimed("f")];
        p.validate().expect("one entry a function");
        p.samples.as_mut().expect("samples").throttled.untimed.push(untimed("g"));
        assert_eq!(reason(&p), "its samples list 3 functions' calls not timed, but it has 2 functions");
    }

    #[test]
    fn traced_calls_and_samples_must_name_what_exists() {
        let traced = |function, stack| {
            let mut p = valid();
            let call = TracedCall { function, start_ns: 1, duration_ns: 2, depth: 0 };
            let thread = ThreadTrace { pid: 1, tid: 7, calls: vec![call], samples: vec![TracedSample { time_ns: 2, stack }] };
            p.trace = Some(Trace { limit_bytes: 1 << 20, cut: 0, missed: 0, threads: vec![thread] });
            p
        };
        traced(1, 0).validate().expect("valid");
        assert_eq!(reason(&traced(2, 0)), "a traced call of thread 7 names function 2, but the profile has 2 functions");
        assert_eq!(reason(&traced(1, 1)), "a traced sample of thread 7 names stack 1, but the samples have 1 stacks");
    }

    #[test]
    fn cycles_and_a_misplaced_root_are_refused() {
        let mut p = valid();
        p.threads[0].tree.nodes[1].parent = 2;
        assert!(reason(&p).contains("node 1 has parent 2"), "{}", reason(&p));
        let mut p = valid();
        p.threads[0].tree.nodes[0].parent = 0;
        assert_eq!(reason(&p), "thread 7's call tree: its first node is not the root");
        let mut p = valid();
        p.threads[0].tree.nodes.clear();
        assert_eq!(reason(&p), "thread 7's call tree: it has no root node");
    }

    #[test]
    fn depth_is_bounded() {
        let mut p = valid();
        let nodes = &mut p.threads[0].tree.nodes;
        nodes.truncate(1);
        for i in 0..MAX_TREE_DEPTH {
            nodes.push(node(0, i));
        }
        p.validate().expect("as deep as allowed");
        p.threads[0].tree.nodes.push(node(0, MAX_TREE_DEPTH));
        assert_eq!(reason(&p), "thread 7's call tree: it is deeper than 300000 levels");
    }

    #[test]
    fn metric_vectors_match_the_metrics() {
        let mut p = valid();
        p.threads[0].functions[0].inclusive.clear();
        assert_eq!(reason(&p), "thread 7's entry for function 1 has 0 values per metric where the profile measures 1 metrics");
        let mut p = valid();
        p.threads[0].tree.nodes[2].exclusive.push(0);
        assert!(reason(&p).contains("node 2 has 2 values per metric"), "{}", reason(&p));
        let mut p = valid();
        p.lines[0].cost.push(1);
        assert!(reason(&p).contains("the line record of a.c line 3"), "{}", reason(&p));
        // Counted, not timed.
        let mut p = valid();
        p.lines[0].cost.clear();
        assert!(p.validate().is_ok());
        let mut p = valid();
        p.regions.push(crate::model::RegionRecord { name: "r".into(), inclusive: vec![Stat::default(); 3], ..Default::default() });
        assert!(reason(&p).starts_with("region r has 3 values"), "{}", reason(&p));
        let mut p = valid();
        p.metrics = vec![String::new(); MAX_METRICS + 1];
        assert!(reason(&p).contains("65 metrics"), "{}", reason(&p));
    }

    #[test]
    fn line_numbers_are_bounded() {
        let mut p = valid();
        p.lines[0].line = u32::MAX;
        assert!(reason(&p).starts_with("a line record of a.c at line 4294967295"), "{}", reason(&p));
        let mut p = valid();
        p.functions[0].line = MAX_LINE + 1;
        assert!(reason(&p).starts_with("function 0 is declared at line 10000001"), "{}", reason(&p));
    }

    #[test]
    fn names_referred_to_are_bounded() {
        let mut p = valid();
        p.functions[0].name = "x".repeat(1 << 20);
        // 2100 nodes calling main: more than 2 GiB of its name.
        let nodes = &mut p.threads[0].tree.nodes;
        nodes.truncate(1);
        nodes.extend((0..2100).map(|_| node(0, 0)));
        assert!(reason(&p).contains("more than 2 GiB of function and frame names"), "{}", reason(&p));
    }
}
