//! A patched process's totals (see [`super::patched`]) as per-thread
//! profiles: the runtime's calling contexts are the call tree; each
//! function's numbers are its contexts' numbers added up, with the rule
//! every engine keeps for recursion (a function's inclusive total counts
//! its outermost frames only, so it never exceeds the run); calls still in
//! progress end at the end of the recording, marked unfinished.

use super::clock::TscClock;
use super::reading::ThreadTotals;
use super::totals::{Node, Stat as RawStat};
use proftap_profile::{CallTree, FunctionStats, ROOT, Stat, ThreadProfile, TreeNode};

/// How the raw totals become a profile's numbers.
pub struct Conversion<'a> {
    /// TSC cycles to nanoseconds.
    pub clock: &'a TscClock,
    /// Metrics in the profile: 1 (wall time) or 2 (wall and CPU time).
    pub metrics: usize,
    /// When the recording ended (TSC): calls in progress end then.
    pub end_tsc: u64,
    /// What a patched call costs, per metric, to subtract: in itself and
    /// to its caller (nanoseconds).
    pub compensation: Option<[Cost; 2]>,
}

/// What one patched call adds, nanoseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cost {
    /// To its own inclusive time.
    pub own: u64,
    /// To its caller's.
    pub call: u64,
}

/// A thread's profile from its totals; `off_cpu_now` is its time off CPU
/// at the end (nanoseconds), when known, for the calls still in progress.
pub fn thread_profile(pid: i32, name: String, thread: &ThreadTotals, off_cpu_now: Option<u64>, how: &Conversion<'_>) -> ThreadProfile {
    let mut nodes: Vec<Node> = thread.nodes.clone();
    let mut unfinished = vec![0u64; thread.calls.len()];
    close_open_frames(thread, &mut nodes, &mut unfinished, off_cpu_now, how);
    let ns = |cycles: u64| how.clock.duration_ns(cycles);
    let pick = |wall: u64, cpu: u64| -> Vec<u64> { [ns(wall), ns(cpu)][..how.metrics].to_vec() };
    let mut tree: Vec<TreeNode> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| TreeNode {
            function: if i == 0 { ROOT } else { n.function },
            parent: if i == 0 { ROOT } else { n.parent },
            calls: if i == 0 { 0 } else { n.calls },
            inclusive: pick(n.incl_wall.total, n.incl_cpu.total),
            exclusive: vec![0; how.metrics],
            estimated: false,
        })
        .collect();
    if let Some(costs) = &how.compensation {
        compensate(&mut tree, costs);
    }
    exclusive_from_children(&mut tree, how.metrics);
    let functions = function_stats(thread, &nodes, &tree, &unfinished, how);
    ThreadProfile { pid, tid: thread.tid as i32, name, functions, tree: CallTree { nodes: tree } }
}

/// One region's totals over threads, in the profile's units.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionSum {
    /// Times a frame entered it.
    pub entries: u64,
    /// Cost per timed entry, per metric.
    pub inclusive: Vec<Stat>,
    /// Entries not timed: left past the runtime's open regions, left by a
    /// longjmp or an exception, or still open at the end.
    pub untimed: u64,
    /// Leaves the runtime saw no entry for.
    pub unpaired: u64,
}

/// Adds `thread`'s region totals to `into` (one per region).
pub fn add_regions(into: &mut Vec<RegionSum>, thread: &ThreadTotals, how: &Conversion<'_>) {
    if into.len() < thread.regions.len() {
        into.resize(thread.regions.len(), RegionSum { inclusive: vec![Stat::default(); how.metrics], ..RegionSum::default() });
    }
    let stat = |raw: &RawStat, timed: u64| match timed {
        0 => Stat::default(),
        _ => Stat::new(how.clock.duration_ns(raw.total), how.clock.duration_ns(raw.min), how.clock.duration_ns(raw.max)),
    };
    for (sum, r) in into.iter_mut().zip(&thread.regions) {
        sum.entries = sum.entries.saturating_add(r.entries);
        for (total, raw) in sum.inclusive.iter_mut().zip([&r.wall, &r.cpu]) {
            total.merge(&stat(raw, r.timed));
        }
        sum.untimed = sum.untimed.saturating_add(r.entries.saturating_sub(r.timed));
        sum.unpaired = sum.unpaired.saturating_add(r.unpaired);
    }
}

/// Takes what the probes cost out of each node's inclusive totals: its
/// calls' own cost, and what each call made below it cost it.
fn compensate(tree: &mut [TreeNode], costs: &[Cost; 2]) {
    // Calls below each node; children come after their parents.
    let mut below = vec![0u64; tree.len()];
    for i in (1..tree.len()).rev() {
        let parent = tree[i].parent as usize;
        if parent != 0 {
            below[parent] = below[parent].saturating_add(below[i]).saturating_add(tree[i].calls);
        }
    }
    for (node, below) in tree.iter_mut().zip(&below).skip(1) {
        for (value, cost) in node.inclusive.iter_mut().zip(costs) {
            let probes = node.calls.saturating_mul(cost.own).saturating_add(below.saturating_mul(cost.call));
            *value = value.saturating_sub(probes);
        }
    }
    // One measured cost stands for every call: where a node's calls cost
    // less than it says, the node keeps at least what its children kept,
    // so that its own time is 0 there, never less, and a parent holds its
    // children. Children come after their parents: last to first, each
    // node's children are done before it.
    let width = costs.len();
    let mut kept_below = vec![0u64; tree.len() * width];
    for i in (1..tree.len()).rev() {
        for (value, kept) in tree[i].inclusive.iter_mut().zip(&kept_below[i * width..][..width]) {
            *value = (*value).max(*kept);
        }
        let parent = tree[i].parent as usize;
        if parent != 0 && parent < i {
            for (sum, value) in kept_below[parent * width..][..width].iter_mut().zip(&tree[i].inclusive) {
                *sum = sum.saturating_add(*value);
            }
        }
    }
}

/// Each node's exclusive cost: its inclusive cost less its children's, in
/// the profile's units (converted one by one, sums would drift apart by
/// rounding); the thread's own node: everything its outermost calls took.
fn exclusive_from_children(tree: &mut [TreeNode], metrics: usize) {
    // One array, a node's `metrics` sums after another's: a process's
    // profile is made of thousands of nodes, hundreds of processes a run.
    let mut children = vec![0u64; tree.len() * metrics];
    for node in tree.iter().skip(1) {
        for (sum, v) in children[node.parent as usize * metrics..][..metrics].iter_mut().zip(&node.inclusive) {
            *sum = sum.saturating_add(*v);
        }
    }
    tree[0].inclusive = children[..metrics].to_vec();
    for (node, below) in tree.iter_mut().zip(children.chunks_exact(metrics)).skip(1) {
        node.exclusive = node.inclusive.iter().zip(below).map(|(incl, below)| incl.saturating_sub(*below)).collect();
    }
}

/// Ends each call still in progress at `end`, innermost first, as the
/// runtime ends a call: its times to its node, its inclusive times to its caller.
fn close_open_frames(thread: &ThreadTotals, nodes: &mut [Node], unfinished: &mut [u64], off_cpu_now: Option<u64>, how: &Conversion<'_>) {
    let (mut child_wall, mut child_cpu) = (0u64, 0u64);
    // A call caught as it was entered has no entry time yet (all ones):
    // its tree node is left as it was (its function's calls counted it).
    for frame in thread.open.iter().rev().filter(|f| f.entry_tsc != u64::MAX) {
        let wall = how.end_tsc.saturating_sub(frame.entry_tsc);
        let off = off_cpu_now.map_or(0, |now| how.clock.cycles_of(now.saturating_sub(frame.entry_off)));
        let cpu = wall.saturating_sub(off);
        // The frame's own figures are the target's word: they may be anything.
        let (frame_child_wall, frame_child_cpu) = (frame.child_wall.saturating_add(child_wall), frame.child_cpu.saturating_add(child_cpu));
        // Node 0 is the thread, no call's context: a frame that names it,
        // or a node there is not, is a lie or a call whose context did not
        // fit (`NO_NODE`), and counts in no context.
        if let Some(node) = nodes.get_mut(frame.node as usize).filter(|_| frame.node != 0) {
            node.calls += 1;
            observe(&mut node.incl_wall, wall);
            observe(&mut node.excl_wall, wall.saturating_sub(frame_child_wall));
            observe(&mut node.incl_cpu, cpu);
            observe(&mut node.excl_cpu, cpu.saturating_sub(frame_child_cpu));
            if let Some(count) = unfinished.get_mut(node.function as usize) {
                *count += 1;
            }
        }
        (child_wall, child_cpu) = (wall, cpu);
    }
}

fn observe(stat: &mut RawStat, value: u64) {
    stat.total = stat.total.saturating_add(value);
    stat.min = stat.min.min(value);
    stat.max = stat.max.max(value);
}

/// Each function's numbers over its contexts. Its calls are the runtime's
/// count of entries, which includes calls it could not time.
fn function_stats(
    thread: &ThreadTotals,
    nodes: &[Node],
    tree: &[TreeNode],
    unfinished: &[u64],
    how: &Conversion<'_>,
) -> Vec<FunctionStats> {
    let outermost = outermost_nodes(nodes);
    // By function: a thread runs few of them, of the thousands patched.
    let mut by_function: std::collections::BTreeMap<u32, FunctionStats> = std::collections::BTreeMap::new();
    let ns = |cycles: u64| how.clock.duration_ns(cycles);
    let own = |m: usize| how.compensation.map_or(0, |c| c[m].own);
    // Totals from the tree (in the profile's units, compensated); the
    // extremes of single calls from the runtime's.
    let extremes = |raw: &RawStat, m: usize| {
        let min = if raw.min == u64::MAX { u64::MAX } else { ns(raw.min).saturating_sub(own(m)) };
        Stat::new(0, min, ns(raw.max).saturating_sub(own(m)))
    };
    let mut timed = vec![0u64; thread.calls.len()];
    // A forked child's frames carried over from its parent are timed here,
    // the parent counted their calls: the first nodes, one interval each.
    let mut carried = vec![0u64; thread.calls.len()];
    for (i, (node, counted)) in nodes.iter().zip(tree).enumerate().skip(1) {
        if node.function as usize >= thread.calls.len() {
            continue;
        }
        let f = by_function.entry(node.function).or_insert_with(|| FunctionStats::new(node.function, how.metrics));
        f.unwound += node.unwound;
        timed[node.function as usize] = timed[node.function as usize].saturating_add(node.calls);
        if i as u64 <= thread.carried && node.calls > 0 {
            carried[node.function as usize] += 1;
        }
        if node.calls == 0 {
            continue;
        }
        // A call's extremes lose only its own probes' cost, the totals also
        // its callees' probes': the extremes are kept within the totals.
        let within = |raw: &RawStat, m: usize, total: u64| {
            let mut stat = Stat { total, ..extremes(raw, m) };
            stat.keep_extremes_within(node.calls);
            stat
        };
        for m in 0..how.metrics {
            let (incl_raw, excl_raw) = if m == 0 { (&node.incl_wall, &node.excl_wall) } else { (&node.incl_cpu, &node.excl_cpu) };
            let incl = within(incl_raw, m, counted.inclusive[m]);
            // A call's own time is within its whole: so are the extremes,
            // each kept within a total compensated its own way.
            let mut excl = within(excl_raw, m, counted.exclusive[m]);
            (excl.min, excl.max) = (excl.min.min(incl.min), excl.max.min(incl.max));
            // A call within one of the same function is counted in that
            // one's total: its own is nested (see Stat::nested).
            let (total, nested) = if outermost[i] { (incl.total, 0) } else { (0, incl.total) };
            f.inclusive[m].merge(&Stat { total, nested, ..incl });
            f.exclusive[m].merge(&excl);
        }
    }
    for (function, calls) in thread.calls.iter().enumerate() {
        if *calls > 0 {
            by_function.entry(function as u32).or_insert_with(|| FunctionStats::new(function as u32, how.metrics));
        }
    }
    by_function
        .into_values()
        .map(|mut f| {
            let function = f.function as usize;
            f.calls = thread.calls[function];
            f.unfinished = unfinished[function];
            // Counted by the runtime, in no context: out of room, too deep,
            // or made while the runtime was busy.
            f.carried = carried[function];
            f.untimed = f.calls.saturating_sub(timed[function].saturating_sub(f.carried));
            f
        })
        .collect()
}

/// Whether each node is its function's outermost frame on its path.
/// Parents come before children, so one pass in order finds, for each node,
/// whether its function appears among its ancestors.
fn outermost_nodes(nodes: &[Node]) -> Vec<bool> {
    // Each node's children, in one array: those of node n are
    // `children[first[n]..first[n + 1]]`.
    let mut first = vec![0usize; nodes.len() + 1];
    for n in nodes.iter().skip(1) {
        first[n.parent as usize + 1] += 1;
    }
    for i in 1..first.len() {
        first[i] += first[i - 1];
    }
    let mut children = vec![0u32; nodes.len().saturating_sub(1)];
    let mut next = first.clone();
    for (i, n) in nodes.iter().enumerate().skip(1) {
        children[next[n.parent as usize]] = i as u32;
        next[n.parent as usize] += 1;
    }
    let mut outermost = vec![false; nodes.len()];
    // Depth-first with the count of each function's frames on the path.
    let mut active: rustc_hash::FxHashMap<u32, u32> = rustc_hash::FxHashMap::default();
    let mut stack: Vec<(u32, bool)> = vec![(0, false)];
    while let Some((node, leaving)) = stack.pop() {
        let function = nodes[node as usize].function;
        if leaving {
            if let Some(count) = active.get_mut(&function) {
                *count -= 1;
            }
            continue;
        }
        if node != 0 {
            let count = active.entry(function).or_default();
            outermost[node as usize] = *count == 0;
            *count += 1;
            stack.push((node, true));
        }
        let node = node as usize;
        stack.extend(children[first[node]..first[node + 1]].iter().map(|&c| (c, false)));
    }
    outermost
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::totals::Frame;

    fn node(parent: u32, function: u32, calls: u64, wall: u64, child: u64) -> Node {
        let s = |t: u64| RawStat { total: t, min: t.checked_div(calls).unwrap_or(u64::MAX), max: t / calls.max(1) };
        let mut n = Node::default();
        (n.parent, n.function, n.calls) = (parent, function, calls);
        (n.incl_wall, n.excl_wall, n.incl_cpu, n.excl_cpu) = (s(wall), s(wall - child), s(wall), s(wall - child));
        n
    }

    /// Thread 7 with these contexts, calls by function and frames in progress.
    fn thread_of(nodes: Vec<Node>, calls: Vec<u64>, open: Vec<Frame>) -> ThreadTotals {
        ThreadTotals { tid: 7, nodes, calls, open, untimed: 0, regions: Vec::new(), hooks_missed: 0, unpaired: 0, mixed: false, carried: 0 }
    }

    #[test]
    fn recursion_counts_the_outermost_frame_once_and_open_calls_end_at_the_end() {
        let clock = TscClock::new().expect("a constant TSC");
        let cycles = |ns: u64| (ns as f64 * clock.cycles_per_ns()) as u64;
        // main -> f -> f (recursive) and main still running at the end.
        let nodes = vec![Node::default(), node(0, 0, 0, 0, 0), node(1, 1, 1, cycles(1000), cycles(400)), node(2, 1, 1, cycles(400), 0)];
        let mut main = Frame::default();
        (main.node, main.child_wall, main.child_cpu) = (1, cycles(1000), cycles(1000));
        let thread = thread_of(nodes, vec![1, 2], vec![main]);
        let how = Conversion { clock: &clock, metrics: 2, end_tsc: cycles(5000), compensation: None };
        let profile = thread_profile(1, "t".into(), &thread, None, &how);
        let near = |a: u64, b: u64| a.abs_diff(b) <= 2;
        let f = profile.functions.iter().find(|f| f.function == 1).expect("f");
        assert_eq!(f.calls, 2);
        assert!(near(f.inclusive[0].total, 1000), "only the outer f counts: {:?}", f.inclusive[0]);
        assert!(near(f.inclusive[0].min, 400) && near(f.inclusive[0].max, 1000));
        assert!(near(f.exclusive[0].total, 1000), "{:?}", f.exclusive[0]);
        let main = profile.functions.iter().find(|f| f.function == 0).expect("main");
        assert_eq!((main.calls, main.unfinished), (1, 1));
        assert!(near(main.inclusive[0].total, 5000) && near(main.exclusive[0].total, 4000), "{main:?}");
        assert!(near(profile.tree.nodes[0].inclusive[0], 5000));
        assert_eq!(profile.tree.nodes[0].function, ROOT);
    }

    /// A forked child's first thread: main and run carried over from its
    /// parent (nodes 1 and 2), run then calling f twice and returning; the
    /// child calls run again itself. A thread that carried nothing has no
    /// carried calls, whatever its counts.
    #[test]
    fn the_frames_a_forked_child_carried_over_are_timed_not_counted() {
        let clock = TscClock::with_rate(1, 1);
        let nodes = vec![Node::default(), node(0, 0, 1, 1000, 900), node(1, 1, 2, 900, 200), node(2, 2, 2, 200, 0)];
        let mut thread = thread_of(nodes, vec![0, 1, 2], Vec::new());
        thread.carried = 2;
        let how = Conversion { clock: &clock, metrics: 1, end_tsc: 1000, compensation: None };
        let profile = thread_profile(1, "t".into(), &thread, None, &how);
        let counts = |f: u32| profile.functions.iter().find(|s| s.function == f).map(|s| (s.calls, s.carried, s.untimed, s.timed_calls()));
        assert_eq!([counts(0), counts(1), counts(2)], [Some((0, 1, 0, 1)), Some((1, 1, 0, 2)), Some((2, 0, 0, 2))]);
        thread.carried = 0;
        let profile = thread_profile(1, "t".into(), &thread, None, &how);
        assert!(profile.functions.iter().all(|s| s.carried == 0), "{:?}", profile.functions);
    }

    /// A call of `f` that made a thousand patched calls: compensation takes
    /// their probes' cost out of its total, and its one call's least and
    /// largest values with it (they kept only its own probes' cost out and
    /// stood above the average).
    #[test]
    fn compensated_extremes_stay_within_the_total() {
        let clock = TscClock::with_rate(1, 1);
        let nodes = vec![Node::default(), node(0, 0, 1, 100_000, 50_000), node(1, 1, 1000, 50_000, 0)];
        let thread = thread_of(nodes, vec![1, 1000], Vec::new());
        let cost = Cost { own: 10, call: 20 };
        let how = Conversion { clock: &clock, metrics: 1, end_tsc: 200_000, compensation: Some([cost, cost]) };
        let profile = thread_profile(1, "t".into(), &thread, None, &how);
        let f = profile.functions.iter().find(|f| f.function == 0).expect("f");
        let incl = &f.inclusive[0];
        assert_eq!(incl.total, 100_000 - 10 - 1000 * 20);
        assert_eq!((incl.min, incl.max), (incl.total, incl.total), "{incl:?}");
        let excl = &f.exclusive[0];
        assert_eq!((excl.min, excl.max), (excl.total, excl.total), "{excl:?}");
        let g = profile.functions.iter().find(|f| f.function == 1).expect("g");
        assert!(g.inclusive[0].min <= g.inclusive[0].total / 1000 && g.inclusive[0].max >= g.inclusive[0].min, "{:?}", g.inclusive[0]);
    }

    /// A probe cost larger than what a caller's calls took (one measured
    /// cost stands for all) leaves the caller what its callee kept, not
    /// less: its own time is 0, and the function's exclusive total stays
    /// within its inclusive one.
    #[test]
    fn a_cost_larger_than_a_callers_time_leaves_it_its_callees() {
        let clock = TscClock::with_rate(1, 1);
        // f (one call, 100 cycles) -> g (one call, 90): compensated, f loses 10 + 100, g 10.
        let nodes = vec![Node::default(), node(0, 0, 1, 100, 90), node(1, 1, 1, 90, 0)];
        let thread = thread_of(nodes, vec![1, 1], Vec::new());
        let cost = Cost { own: 10, call: 100 };
        let how = Conversion { clock: &clock, metrics: 1, end_tsc: 1000, compensation: Some([cost, cost]) };
        let profile = thread_profile(1, "t".into(), &thread, None, &how);
        let [_, f, g] = &profile.tree.nodes[..] else { panic!("{:?}", profile.tree.nodes) };
        assert_eq!((f.inclusive[0], f.exclusive[0], g.inclusive[0]), (80, 0, 80));
        let f = profile.functions.iter().find(|s| s.function == 0).expect("f");
        assert!(f.exclusive[0].total <= f.inclusive[0].total, "{f:?}");
    }

    /// Found by the `totals` fuzz target: a call in progress that named
    /// node 0 (the thread, whose numbers the reader does not check: the
    /// runtime never writes them) added a call to its count of 2^64 - 1.
    #[test]
    fn an_open_frame_in_the_threads_own_node_counts_nowhere() {
        let clock = TscClock::with_rate(3, 1);
        let mut root = Node::default();
        (root.calls, root.incl_wall.total) = (u64::MAX, u64::MAX);
        let nodes = vec![root, node(0, 0, 1, 300, 0)];
        let mut frame = Frame::default();
        (frame.node, frame.entry_tsc) = (0, 1000);
        let thread = thread_of(nodes, vec![1], vec![frame]);
        let how = Conversion { clock: &clock, metrics: 1, end_tsc: 4000, compensation: None };
        let profile = thread_profile(1, "t".into(), &thread, None, &how);
        assert_eq!(profile.tree.nodes[0].calls, 0);
        assert_eq!(profile.tree.nodes[0].inclusive, [100], "the thread's time is its calls' time");
        let f = &profile.functions[0];
        assert_eq!((f.calls, f.unfinished, f.inclusive[0].total), (1, 0, 100));
    }

    /// Found by the `totals` fuzz target: an open frame whose calls made so
    /// far were said to take nearly 2^64 cycles overflowed when the time of
    /// the frame inside it was added.
    #[test]
    fn open_frames_whose_children_took_forever_end_without_overflow() {
        let clock = TscClock::with_rate(3, 1);
        let nodes = vec![Node::default(), node(0, 0, 0, 0, 0), node(1, 1, 0, 0, 0)];
        let (mut outer, mut inner) = (Frame::default(), Frame::default());
        (outer.node, outer.entry_tsc, outer.child_wall, outer.child_cpu) = (1, 1000, u64::MAX, u64::MAX);
        (inner.node, inner.entry_tsc) = (2, 2000);
        let thread = thread_of(nodes, vec![1, 1], vec![outer, inner]);
        let how = Conversion { clock: &clock, metrics: 2, end_tsc: 5000, compensation: None };
        let profile = thread_profile(1, "t".into(), &thread, Some(0), &how);
        let outer = profile.functions.iter().find(|f| f.function == 0).expect("the outer function");
        assert_eq!((outer.calls, outer.unfinished), (1, 1));
        // Its frame says its children took all its time and more; the
        // tree, whose totals stand, leaves it what its callee did not take.
        assert_eq!((outer.exclusive[0].total, outer.exclusive[0].max), (4000 / 3 - 3000 / 3, 4000 / 3 - 3000 / 3));
        assert_eq!(outer.inclusive[0].max, 4000 / 3);
    }
}
