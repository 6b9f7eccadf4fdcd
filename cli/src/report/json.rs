//! The JSON report (`proftap.report/1`) scripts rely on.

use super::{SortKey, function_name, sort_functions};
use proftap_profile::{CallTree, FunctionStats, Note, Profile, SampleProfile, Stat, ThrottledSamples};
use serde_json::{Map, Value, json};

/// The whole report as a JSON value.
pub fn report(profile: &Profile) -> Value {
    report_in_order(profile, &Order::default())
}

/// Which functions a report lists, in what order: every one as recorded,
/// unless sorted (by a key of a metric) and cut to the first `top`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Order {
    /// The key and the metric's index.
    pub sort: Option<(SortKey, usize)>,
    /// How many to keep.
    pub top: Option<usize>,
}

impl Order {
    fn apply(&self, profile: &Profile, mut functions: Vec<FunctionStats>) -> Vec<FunctionStats> {
        if let Some((key, metric)) = self.sort {
            sort_functions(profile, &mut functions, key, metric);
        }
        functions.truncate(self.top.unwrap_or(usize::MAX));
        functions
    }
}

/// [`report`], its function lists in `order`.
pub fn report_in_order(profile: &Profile, order: &Order) -> Value {
    // The whole process's: a throttled function's CPU time after its probes
    // were removed, from its samples, which are not kept by thread.
    let (after_throttle, untimed) = (profile.own_times_after_throttle(), profile.own_times_untimed());
    let with_estimate = |f: &FunctionStats| {
        let mut value = function(profile, f);
        value["own_cpu_ns_after_throttle"] = json!(after_throttle.get(&f.function).copied().unwrap_or(0));
        if let Some(&ns) = untimed.get(&f.function) {
            value["own_cpu_ns_untimed"] = json!(ns);
        }
        let info = profile.functions.get(f.function as usize);
        value["calls_after_throttle"] = json!(info.and_then(|i| i.calls_after_throttle));
        if let Some(until) = info.and_then(|i| i.calls_counted_until_stopped) {
            value["calls_counted_until_stopped"] = json!(until);
            value["calls_after_counting_unknown"] = json!(info.is_some_and(|i| i.calls_after_counting_unknown));
        }
        value
    };
    let functions: Vec<Value> = order.apply(profile, profile.merged_functions()).iter().map(with_estimate).collect();
    let threads: Vec<Value> = profile
        .threads
        .iter()
        .map(|t| {
            json!({
                "tid": t.tid,
                "pid": t.pid,
                "name": t.name,
                "functions": order.apply(profile, t.functions.clone()).iter().map(|f| function(profile, f)).collect::<Vec<_>>(),
                "tree": tree(profile, &t.tree),
            })
        })
        .collect();
    json!({
        "schema": "proftap.report/1",
        "target": {
            "command": profile.target.command,
            "pid": profile.target.pid,
            "exe": profile.target.exe,
            "build_id": profile.target.build_id,
            "exit_code": profile.target.exit_code,
            "signal": profile.target.signal,
            "ended": profile.target.has_ended(),
            "attached": profile.target.attached,
        },
        "recording": {
            "engine": profile.recording.engine,
            "exits": profile.recording.exits,
            "started_unix_ns": profile.recording.started_unix_ns,
            "duration_ns": profile.recording.duration_ns,
            "events": profile.recording.events,
            "peak_events_per_second": profile.recording.peak_events_per_second,
            "follow_forks": profile.recording.follow_forks,
        },
        "metrics": profile.metrics,
        "functions": functions,
        "threads": threads,
        "tree": tree(profile, &profile.merged_tree()),
        "lost_events": profile.lost.events,
        "lost": {
            "events": profile.lost.events,
            "by_function": profile.lost.by_function.iter().map(|c| json!({"function": function_name(profile, c.id as u32), "count": c.count})).collect::<Vec<_>>(),
            "by_thread": profile.lost.by_thread.iter().map(|c| json!({"tid": c.id, "count": c.count})).collect::<Vec<_>>(),
            "unmatched_returns": profile.lost.unmatched_returns,
        },
        "overhead": {
            "per_hit_ns": profile.overhead.per_hit_ns,
            "estimated_ns": profile.overhead.estimated_ns,
            "hits": profile.overhead.hits,
            "compensated": profile.overhead.compensated,
            "call_ns_emulated": profile.overhead.call_ns_emulated,
            "call_ns_stepped": profile.overhead.call_ns_stepped,
            "call_ns_injected": profile.overhead.call_ns_injected,
            "call_cpu_ns": profile.overhead.call_cpu_ns,
            "self_ns": profile.overhead.self_ns,
        },
        "lines": profile.lines.iter().map(|l| {
            let metric = |key: &str| profile.metric_index(key).and_then(|i| l.cost.get(i).copied());
            let branches: Vec<serde_json::Value> = l.branches.iter().map(|b| json!({ "taken": b.taken, "not_taken": b.not_taken })).collect();
            json!({
                "file": l.file,
                "line": l.line,
                "count": l.count,
                "wall_ns": metric("wall_ns"),
                "cpu_ns": metric("cpu_ns"),
                "branches": branches,
                "throttled": l.throttled,
            })
        }).collect::<Vec<_>>(),
        "regions": profile.regions.iter().map(|r| json!({
            "name": r.name,
            "file": r.file,
            "start": r.start,
            "end": r.end,
            "entries": r.entries,
            "inclusive": stats(profile, &r.inclusive, r.entries),
        })).collect::<Vec<_>>(),
        "runs": profile.runs,
        "samples": profile.samples.as_ref().map(|samples| with_throttled(samples, json!({
            "event": samples.event,
            "frequency_hz": samples.frequency_hz,
            "total": samples.total,
            "in_counting_stubs": samples.in_counting_stubs,
            "on_every_cpu": samples.on_every_cpu,
            "functions": sampled_in_order(samples, order).iter().map(|f| json!({
                "name": f.frame.name,
                "module": f.frame.module,
                "inlined": f.frame.inlined,
                "self": f.self_samples,
                "total": f.total_samples,
                "self_ns": samples.estimated_ns(f.self_samples),
                "total_ns": samples.estimated_ns(f.total_samples),
            })).collect::<Vec<_>>(),
            "lines": samples.lines.iter().map(|l| json!({ "file": l.file, "line": l.line, "self": l.count })).collect::<Vec<_>>(),
        }))),
        "processes": profile.processes.iter().map(|p| json!({"pid": p.pid, "parent": p.parent, "execs": p.execs})).collect::<Vec<_>>(),
        "notes": profile.notes.iter().map(crate::wording::note).collect::<Vec<_>>(),
        // The same, typed and whole: a note names a few of a list, this
        // every one (each function whose lines were not counted, and why).
        "findings": profile.notes.iter().filter_map(|n| match n {
            Note::Found(finding) => Some(finding),
            Note::Text(_) => None,
        }).collect::<Vec<_>>(),
    })
}

/// The sampled functions, sorted as `order` says (else by samples on the stack).
fn sampled_in_order(samples: &SampleProfile, order: &Order) -> Vec<proftap_profile::SampledFunction> {
    let mut functions = samples.functions();
    if let Some((key, _)) = order.sort {
        super::sort_sampled(&mut functions, key, |f| (f.self_samples, f.total_samples, &f.frame.name));
    }
    functions.truncate(order.top.unwrap_or(usize::MAX));
    functions
}

/// The samples' object, with what they say of throttled functions when
/// any was throttled.
fn with_throttled(samples: &SampleProfile, mut object: Value) -> Value {
    if samples.throttled.is_empty() {
        return object;
    }
    let by_function = |t: &ThrottledSamples| {
        json!({
            "name": t.name,
            "self": t.self_samples,
            "total": t.total_samples,
            "self_ns": samples.estimated_ns(t.self_samples),
            "total_ns": samples.estimated_ns(t.total_samples),
            "total_uncounted": t.total_samples_uncounted,
            "in_counting_stub": t.counting_samples,
        })
    };
    let held = samples.throttled.held.iter().map(|h| {
        json!({
            "tid": h.tid,
            "name": h.name,
            "callee": h.callee,
            "callee_module": h.callee_module,
            "samples": h.samples,
            // What the caller gave back for them.
            "ns": h.taken_ns.unwrap_or_else(|| samples.estimated_ns(h.samples)),
        })
    });
    object["throttled"] = Value::Array(samples.throttled.functions.iter().map(by_function).collect());
    // Calls of instrumented functions that no probe timed: begun before the
    // probes were placed (an attach), or left untimed by the engine.
    object["untimed_calls"] = Value::Array(samples.throttled.untimed.iter().map(by_function).collect());
    object["held_by_callers"] = Value::Array(held.collect());
    // The samples in those callers' own code, which their exclusive time keeps.
    let kept = samples.throttled.kept.iter().map(|k| json!({"tid": k.tid, "name": k.name, "samples": k.samples}));
    object["kept_by_callers"] = Value::Array(kept.collect());
    object
}

fn stats(profile: &Profile, stats: &[Stat], calls: u64) -> Value {
    let mut map = Map::new();
    for (key, s) in profile.metrics.iter().zip(stats) {
        map.insert(key.clone(), json!({ "total": s.total, "nested": s.nested, "min": s.min_or_zero(), "max": s.max, "avg": s.avg(calls) }));
    }
    Value::Object(map)
}

fn function(profile: &Profile, f: &FunctionStats) -> Value {
    let info = profile.functions.get(f.function as usize).cloned().unwrap_or_default();
    json!({
        "name": info.name,
        "module": info.module,
        "file": info.file,
        "line": info.line,
        "address": info.address,
        "calls": f.calls,
        "unwound": f.unwound,
        "unfinished": f.unfinished,
        "untimed": f.untimed,
        "carried": f.carried,
        "mode": info.mode,
        "engine": info.engine,
        "inclusive": stats(profile, &f.inclusive, f.timed_calls()),
        "exclusive": stats(profile, &f.exclusive, f.timed_calls()),
    })
}

fn totals(profile: &Profile, values: &[u64]) -> Value {
    Value::Object(profile.metrics.iter().zip(values).map(|(k, v)| (k.clone(), json!(v))).collect())
}

/// How deep the nested tree goes: JSON readers limit nesting (serde_json to
/// 128 objects and arrays, which a node and its children list take two of),
/// and deep recursion in the target makes trees thousands of calls deep.
const TREE_DEPTH: usize = 60;

/// The tree, nested, down to [`TREE_DEPTH`]: a node there lists no children
/// and says how many nodes below it were left out (its costs include them).
pub fn tree(profile: &Profile, tree: &CallTree) -> Value {
    let children = tree.children();
    fn below(children: &[Vec<u32>], i: u32) -> u64 {
        let mut count = 0;
        let mut stack = children[i as usize].clone();
        while let Some(c) = stack.pop() {
            count += 1;
            stack.extend_from_slice(&children[c as usize]);
        }
        count
    }
    fn node(profile: &Profile, tree: &CallTree, children: &[Vec<u32>], i: u32, depth: usize) -> Value {
        let n = &tree.nodes[i as usize];
        let name = if i == 0 { "<root>" } else { function_name(profile, n.function) };
        let mut value = json!({
            "name": name,
            "calls": n.calls,
            "inclusive": totals(profile, &n.inclusive),
            "exclusive": totals(profile, &n.exclusive),
        });
        if n.estimated {
            value["estimated"] = json!(true);
        }
        if depth < TREE_DEPTH {
            value["children"] = children[i as usize].iter().map(|&c| node(profile, tree, children, c, depth + 1)).collect();
        } else {
            value["children"] = json!([]);
            value["nodes_left_out"] = json!(below(children, i));
        }
        value
    }
    node(profile, tree, &children, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proftap_profile::Finding;

    #[test]
    fn findings_list_every_function_the_notes_name_a_few_of() {
        let functions: Vec<String> = (0..5).map(|i| format!("f{i}: its code is too short")).collect();
        let profile = Profile {
            notes: vec![
                Note::Text("an old note".into()),
                Finding::LinesNotCounted { functions: functions.clone(), budget_percent: Some(5.0) }.into(),
            ],
            ..Profile::default()
        };
        let value = report(&profile);
        let note = value["notes"][1].as_str().unwrap_or_default();
        assert!(note.contains("f2: its code") && !note.contains("f3:") && note.contains("and 2 more"), "{note}");
        let findings = value["findings"].as_array().expect("findings");
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0]["kind"], "lines_not_counted");
        assert_eq!(findings[0]["functions"], json!(functions));
    }
}
