//! Resolved stack samples in, a [`SampleProfile`] out: frames, stacks and
//! source lines counted, each kept once.

use proftap_probes::sampling::ResolvedStack;
use proftap_profile::{SampleProfile, SampledFrame, SampledLine, SampledStack};
use rustc_hash::FxHashMap;
use std::collections::HashMap;

/// Counts resolved stacks.
pub struct SampleAggregator {
    event: String,
    frequency_hz: u64,
    frames: Vec<SampledFrame>,
    frame_ids: HashMap<SampledFrame, u32>,
    stacks: FxHashMap<Vec<u32>, u64>,
    lines: HashMap<(String, u32), u64>,
    total: u64,
}

impl SampleAggregator {
    /// Samples of `event` taken at `frequency_hz`.
    pub fn new(event: &str, frequency_hz: u64) -> Self {
        SampleAggregator {
            event: event.into(),
            frequency_hz,
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            stacks: FxHashMap::default(),
            lines: HashMap::new(),
            total: 0,
        }
    }

    /// Takes in one sample.
    pub fn add(&mut self, stack: &ResolvedStack) {
        self.total += 1;
        let ids: Vec<u32> = stack.frames.iter().map(|frame| self.frame_id(frame)).collect();
        *self.stacks.entry(ids).or_default() += 1;
        if let Some(line) = &stack.line {
            *self.lines.entry(line.clone()).or_default() += 1;
        }
    }

    fn frame_id(&mut self, frame: &SampledFrame) -> u32 {
        if let Some(&id) = self.frame_ids.get(frame) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame.clone(), id);
        id
    }

    /// Hot functions by samples anywhere on the stack so far: (frame name, module, samples).
    pub fn hottest(&self) -> Vec<(String, String, u64)> {
        self.profile().functions().into_iter().map(|f| (f.frame.name, f.frame.module, f.total_samples)).collect()
    }

    /// The samples so far, as a profile: stacks by count, lines by file and line.
    pub fn profile(&self) -> SampleProfile {
        let mut stacks: Vec<SampledStack> =
            self.stacks.iter().map(|(frames, &count)| SampledStack { frames: frames.clone(), count }).collect();
        stacks.sort_by(|a, b| b.count.cmp(&a.count).then(a.frames.cmp(&b.frames)));
        let mut lines: Vec<SampledLine> =
            self.lines.iter().map(|((file, line), &count)| SampledLine { file: file.clone(), line: *line, count }).collect();
        lines.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        SampleProfile {
            event: self.event.clone(),
            frequency_hz: self.frequency_hz,
            total: self.total,
            frames: self.frames.clone(),
            stacks,
            lines,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str) -> SampledFrame {
        SampledFrame { name: name.into(), module: "/bin/p".into(), inlined: false }
    }

    #[test]
    fn stacks_frames_and_lines_are_counted_once_each() {
        let mut samples = SampleAggregator::new("cpu-clock", 1000);
        let deep = ResolvedStack { frames: vec![frame("main"), frame("f")], line: Some(("p.c".into(), 3)) };
        let shallow = ResolvedStack { frames: vec![frame("main")], line: None };
        for stack in [&deep, &shallow, &deep] {
            samples.add(stack);
        }
        let profile = samples.profile();
        assert_eq!((profile.total, profile.frames.len()), (3, 2));
        assert_eq!(profile.stacks[0], SampledStack { frames: vec![0, 1], count: 2 });
        assert_eq!(profile.lines, vec![SampledLine { file: "p.c".into(), line: 3, count: 2 }]);
        assert_eq!(samples.hottest()[0], ("main".into(), "/bin/p".into(), 3));
    }
}
