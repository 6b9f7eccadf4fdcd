//! Saved event streams: a recording written down as it is aggregated (its
//! setup, every event in the order the aggregator took it, the named stack
//! samples, and how it ended), one JSON value a line, and replayed through
//! the same aggregator and assembly into the same profile. Golden tests and
//! the aggregator's benchmark are made of them.

use crate::aggregate::Aggregator;
use crate::assemble::{Ending, Setup, assemble};
use crate::events::Event;
use crate::samples::SampleAggregator;
use proftap_probes::sampling::ResolvedStack;
use proftap_profile::Profile;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};

/// One line of a saved stream.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    /// First: how to aggregate and what the profile says of the target.
    Setup(Box<Setup>),
    /// An event, as the aggregator took it.
    Event(Event),
    /// A stack sample, named.
    Stack(ResolvedStack),
    /// Last: how the recording ended.
    Ending(Box<Ending>),
}

/// Writes a recording's stream as it goes; the first error stops it.
pub struct Saver {
    out: Box<dyn Write + Send>,
    error: Option<std::io::Error>,
}

impl Saver {
    /// A saver writing to `out`.
    pub fn new(out: impl Write + Send + 'static) -> Self {
        Saver { out: Box::new(std::io::BufWriter::new(out)), error: None }
    }

    fn write(&mut self, line: &Line) {
        if self.error.is_some() {
            return;
        }
        let written = serde_json::to_writer(&mut self.out, line).map_err(std::io::Error::from).and_then(|()| self.out.write_all(b"\n"));
        self.error = written.err();
    }

    /// The recording's setup.
    pub fn setup(&mut self, setup: &Setup) {
        self.write(&Line::Setup(Box::new(setup.clone())));
    }

    /// An event the aggregator takes.
    pub fn event(&mut self, event: &Event) {
        self.write(&Line::Event(event.clone()));
    }

    /// The named stack samples, in the order they were counted, and how the
    /// recording ended; says whether everything was written.
    pub fn finish(mut self, stacks: &[ResolvedStack], ending: &Ending) -> std::io::Result<()> {
        for stack in stacks {
            self.write(&Line::Stack(stack.clone()));
        }
        self.write(&Line::Ending(Box::new(ending.clone())));
        if self.error.is_none() {
            self.error = self.out.flush().err();
        }
        self.error.map_or(Ok(()), Err)
    }
}

/// Why a saved stream could not be replayed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// It could not be read.
    #[error("cannot read the saved events: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not one of a saved stream.
    #[error("line {line} of the saved events is not an event stream's: {reason}")]
    Bad {
        /// Its number, from 1.
        line: usize,
        /// What the parser said.
        reason: String,
    },
    /// The stream does not begin with its setup or end with its ending.
    #[error("the saved events {0}; save them again")]
    Incomplete(&'static str),
}

/// A saved recording, read back.
#[derive(Debug)]
pub struct SavedRecording {
    /// How to aggregate it and what the profile says of the target.
    pub setup: Setup,
    /// The events, in the order the aggregator took them.
    pub events: Vec<Event>,
    /// The named stack samples, in the order they were counted.
    pub stacks: Vec<ResolvedStack>,
    /// How it ended.
    pub ending: Ending,
}

impl SavedRecording {
    /// Reads a saved stream.
    pub fn load(input: impl BufRead) -> Result<Self, ReplayError> {
        let (mut setup, mut events, mut stacks) = (None, Vec::new(), Vec::new());
        for (n, text) in input.lines().enumerate() {
            let text = text?;
            let line: Line = serde_json::from_str(&text).map_err(|e| ReplayError::Bad { line: n + 1, reason: e.to_string() })?;
            match (line, &setup) {
                (Line::Setup(first), None) => setup = Some(*first),
                (Line::Setup(_), Some(_)) => return Err(ReplayError::Incomplete("have two setups")),
                (_, None) => return Err(ReplayError::Incomplete("do not begin with the recording's setup")),
                (Line::Event(event), Some(_)) => events.push(event),
                (Line::Stack(stack), Some(_)) => stacks.push(stack),
                (Line::Ending(ending), Some(_)) => {
                    let setup = setup.take().ok_or(ReplayError::Incomplete("do not begin with the recording's setup"))?;
                    return Ok(SavedRecording { setup, events, stacks, ending: *ending });
                }
            }
        }
        Err(ReplayError::Incomplete("end before the recording did"))
    }

    /// The profile the recording made: its events through the aggregator,
    /// its stacks through the sample counts, and the assembly.
    pub fn replay(&self) -> Profile {
        let mut aggregator = Aggregator::new(self.setup.aggregation.clone());
        for event in &self.events {
            aggregator.push(event);
        }
        let samples = self.setup.sampling.as_ref().map(|(event, hz)| {
            let mut samples = SampleAggregator::new(event, *hz);
            self.stacks.iter().for_each(|stack| samples.add(0, stack));
            let mut profile = samples.profile();
            profile.throttled = self.ending.throttled.clone();
            profile.in_counting_stubs = self.ending.in_counting_stubs;
            profile
        });
        assemble(&self.setup, aggregator.finish(), samples, self.ending.clone())
    }
}
