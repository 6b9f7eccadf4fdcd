//! What to record, as plain data: the front ends build a [`RecordRequest`]
//! from their own arguments (a command line, a session request) and the
//! recorder never sees how it was asked.

use proftap_probes::symbols::Debuginfod;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// Everything a recording needs to know, before any file is read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordRequest {
    /// The program: launched or running.
    pub target: RecordTarget,
    /// Which functions to instrument: globs on names, `FILE:*`, `MODULE:PAT`,
    /// `!PAT` to exclude (see [`proftap_probes::select`]). With no positive
    /// pattern, every function of the executable with debug info, in hybrid
    /// mode (sampled too, and governed).
    pub functions: Vec<String>,
    /// Metrics by name (`wall`, `cpu`, `page-faults`, counters); empty: wall and CPU time.
    pub metrics: Vec<String>,
    /// How calls are seen.
    pub engine: EngineChoice,
    /// How returns are seen.
    pub exits: ExitsChoice,
    /// Record forked child processes too.
    pub follow_forks: bool,
    /// Subtract the measured cost of the probes from the times.
    pub compensate: bool,
    /// Stack sampling.
    pub sampling: Sampling,
    /// Instrument functions (false: sample only, placing no probe).
    pub instrument: bool,
    /// The overhead governor.
    pub governor: Governor,
    /// Line counts: `None` for none, else the source files to count (path
    /// suffixes; empty: every source file of the executable outside the
    /// system headers).
    pub lines: Option<Vec<String>>,
    /// Ranges of lines timed like functions.
    pub regions: Vec<RegionSpec>,
    /// Time each line too (a probe on every line), not only count them.
    #[serde(default)]
    pub line_times: bool,
    /// Ring buffer per CPU, MiB.
    pub buffer_mib: usize,
    /// Where separate debug files are looked for (empty: the system's).
    pub debug_dirs: Vec<PathBuf>,
    /// Debuginfod servers asked for debug info found nowhere on disk, and
    /// the cache kept for them: the requester's own settings, applied with
    /// the requester's rights (`None`: no network use).
    #[serde(default)]
    pub debuginfod: Option<Debuginfod>,
    /// Measure the probe cost again instead of using this boot's measurement.
    pub recalibrate: bool,
    /// Tell the calls by function once a second while recording (a live view).
    #[serde(default)]
    pub live_calls: bool,
    /// Keep every finished call and the samples' times for a timeline, up
    /// to this many bytes (at most [`MAX_TRACE_BYTES`]); `None`: no trace.
    #[serde(default)]
    pub trace_bytes: Option<u64>,
}

impl RecordRequest {
    /// A request with the defaults of `proftap run` and `proftap attach`.
    pub fn new(target: RecordTarget) -> Self {
        RecordRequest {
            target,
            functions: Vec::new(),
            metrics: Vec::new(),
            engine: EngineChoice::Auto,
            exits: ExitsChoice::Auto,
            follow_forks: true,
            compensate: false,
            sampling: Sampling::Default,
            instrument: true,
            governor: Governor::Default,
            lines: None,
            regions: Vec::new(),
            line_times: false,
            buffer_mib: 8,
            debug_dirs: Vec::new(),
            debuginfod: None,
            recalibrate: false,
            live_calls: false,
            trace_bytes: None,
        }
    }

    /// Hybrid mode, the default when no function is named: sample
    /// everything, instrument every function, and let the governor remove
    /// costly probes.
    pub fn is_hybrid(&self) -> bool {
        self.functions.iter().all(|f| f.starts_with('!'))
    }

    /// Checks what a request can get wrong however it was built.
    pub fn validate(&self) -> Result<(), RequestError> {
        if let Sampling::Frequency { hz: 0 } = self.sampling {
            return Err(RequestError::NoFrequency);
        }
        if let Governor::Budget { percent } = self.governor
            && !(0.0..=100.0).contains(&percent)
        {
            return Err(RequestError::Budget { percent });
        }
        if !self.instrument && (self.lines.is_some() || !self.regions.is_empty()) {
            return Err(RequestError::LinesWithoutProbes);
        }
        if let Some(bytes) = self.trace_bytes.filter(|b| !(MIN_TRACE_BYTES..=MAX_TRACE_BYTES).contains(b)) {
            return Err(RequestError::TraceSize { bytes });
        }
        if self.regions.len() > MOST_REGIONS {
            return Err(RequestError::TooManyRegions { count: self.regions.len() });
        }
        for region in &self.regions {
            region.validate()?;
        }
        if let RecordTarget::Attach { duration, auto_instrument, .. } = &self.target {
            for (what, wait) in [("recording", *duration), ("warm-up", auto_instrument.map(|a| a.warmup))] {
                if let Some(wait) = wait.filter(|wait| *wait > MAX_WAIT) {
                    return Err(RequestError::TooLong { what, seconds: wait.as_secs() });
                }
            }
        }
        match &self.target {
            RecordTarget::Launch { command, .. } if command.is_empty() => Err(RequestError::NoCommand),
            RecordTarget::Attach { auto_instrument: Some(_), .. } if !self.instrument => Err(RequestError::AutoWithoutProbes),
            RecordTarget::Attach { pid, .. } if *pid <= 0 => Err(RequestError::BadPid { pid: *pid }),
            _ => Ok(()),
        }
    }

    /// The sampling this request asks for, defaults resolved.
    pub fn sample_settings(&self) -> Option<SampleSettings> {
        let by_default = self.is_hybrid() || !self.instrument || self.auto_instrument().is_some();
        match self.sampling {
            Sampling::Frequency { hz } => Some(SampleSettings { frequency_hz: hz.clamp(1, MAX_FREQUENCY_HZ), ..SampleSettings::default() }),
            Sampling::Default if by_default => Some(SampleSettings::default()),
            Sampling::Default | Sampling::Off => None,
        }
    }

    /// The governor's budget per function as a share of the elapsed time
    /// (0.05: 5%), defaults resolved; `None` keeps every probe. Lines and
    /// regions seen by probes (`line_probes`) need every probe; those the
    /// in-process engine counts and hooks do not.
    pub fn overhead_budget(&self, line_probes: bool) -> Option<f64> {
        match self.governor {
            Governor::Budget { percent } => (percent > 0.0).then_some(percent / 100.0),
            Governor::Off => None,
            Governor::Default => (self.is_hybrid() && !line_probes && self.instrument).then_some(DEFAULT_BUDGET),
        }
    }

    /// Automatic instrumentation, when attaching asks for it.
    pub fn auto_instrument(&self) -> Option<AutoInstrument> {
        match self.target {
            RecordTarget::Attach { auto_instrument, .. } => auto_instrument,
            RecordTarget::Launch { .. } => None,
        }
    }

    /// The ring buffer per CPU, bytes (between 1 MiB and 4 GiB).
    pub fn buffer_bytes(&self) -> usize {
        self.buffer_mib.clamp(1, 4096) << 20
    }
}

/// The longest recording or warm-up a request may ask for: a year. (A
/// deadline past what the clock can count would panic, and a warm-up is
/// counted in nanoseconds.)
pub const MAX_WAIT: Duration = Duration::from_secs(366 * 24 * 3600);

/// The largest trace a recording keeps: proftap holds it in memory (the
/// daemon, for every session) and writes it into the profile.
pub const MAX_TRACE_BYTES: u64 = 1 << 30;
/// The smallest: a trace that keeps nothing is a mistake.
pub const MIN_TRACE_BYTES: u64 = 4096;
/// The trace's limit unless told: about 2.8 million calls.
pub const DEFAULT_TRACE_BYTES: u64 = 64 << 20;

/// The governor's budget unless one is given: 5% of the elapsed time per function.
pub(crate) const DEFAULT_BUDGET: f64 = 0.05;
/// The highest sampling frequency asked for that is honoured.
const MAX_FREQUENCY_HZ: u64 = 100_000;

/// The profiled program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordTarget {
    /// Launch a command and record it from its first instruction.
    Launch {
        /// The program and its arguments; the program is found on `PATH`
        /// unless it has a slash, relative to `cwd` when relative.
        #[serde(with = "os_strings")]
        command: Vec<OsString>,
        /// Its working directory (`None`: the recorder's).
        cwd: Option<PathBuf>,
        /// Its whole environment, `KEY=VALUE` (`None`: the recorder's).
        #[serde(with = "optional_os_strings")]
        env: Option<Vec<OsString>>,
    },
    /// Record a running process until asked to stop, for `duration`, or
    /// until it exits.
    Attach {
        /// Its pid.
        pid: i32,
        /// Stop after this long.
        duration: Option<Duration>,
        /// Sample first, then instrument the hottest functions.
        auto_instrument: Option<AutoInstrument>,
    },
}

/// Sample for a warm-up, then instrument the hottest functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoInstrument {
    /// How many functions.
    pub count: usize,
    /// How long to sample first.
    pub warmup: Duration,
}

/// How calls are seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineChoice {
    /// The in-process engine unless the recording needs what only uprobes
    /// do (other metrics, lines, a program that forks or cancels threads).
    #[default]
    Auto,
    /// Kernel uprobes on entries and returns.
    Uprobe,
    /// Jumps patched over function entries; uprobes where that cannot be done.
    Inject,
}

/// How returns are seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitsChoice {
    /// Return instructions for programs that may unwind their stack, else return probes.
    #[default]
    Auto,
    /// Return probes (uretprobes).
    Uretprobe,
    /// Probes on each return instruction.
    ReturnSites,
}

/// Whether to sample stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampling {
    /// In hybrid mode, when sampling only and with automatic
    /// instrumentation, at the default frequency; otherwise not.
    #[default]
    Default,
    /// Never.
    Off,
    /// At this frequency, samples per second of CPU time.
    Frequency {
        /// Samples per second.
        hz: u64,
    },
}

/// The overhead governor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Governor {
    /// 5% in hybrid mode without line probes or regions, and for the
    /// functions recorded only for their lines beside named ones (lines
    /// counted in process); else off.
    #[default]
    Default,
    /// Every probe stays to the end.
    Off,
    /// The most all probes together may cost, in percent of the elapsed
    /// time, before the costliest functions' are removed (0 turns the
    /// governor off).
    Budget {
        /// Percent, 0 to 100.
        percent: f64,
    },
}

/// How to sample stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleSettings {
    /// Samples per second of CPU time.
    pub frequency_hz: u64,
    /// Bytes of user stack copied per sample, for unwinding.
    pub stack_bytes: u32,
}

impl Default for SampleSettings {
    fn default() -> Self {
        SampleSettings { frequency_hz: 1000, stack_bytes: 16 * 1024 }
    }
}

/// A region to time: lines `start..=end` of a source file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionSpec {
    /// Its name.
    pub name: String,
    /// The source file (a path or a path suffix).
    pub file: String,
    /// First line.
    pub start: u32,
    /// Last line.
    pub end: u32,
}

/// The most regions one recording times: each thread keeps their totals in
/// the memory it shares with proftap.
pub const MOST_REGIONS: usize = 1024;

/// Per line of `lines` (file and line number), the indexes of the
/// `regions` that hold it.
pub fn regions_of_lines(lines: &[(String, u32)], regions: &[RegionSpec]) -> Vec<Vec<u32>> {
    lines
        .iter()
        .map(|(file, line)| regions.iter().enumerate().filter(|(_, r)| r.contains(file, *line)).map(|(i, _)| i as u32).collect())
        .collect()
}

impl RegionSpec {
    /// Parses `NAME=FILE:START-END`.
    pub fn parse(text: &str) -> Result<Self, RequestError> {
        let bad = || RequestError::BadRegion { text: text.into() };
        let (name, rest) = text.split_once('=').ok_or_else(bad)?;
        let (file, range) = rest.rsplit_once(':').ok_or_else(bad)?;
        let (start, end) = range.split_once('-').ok_or_else(bad)?;
        let (start, end): (u32, u32) = (start.trim().parse().map_err(|_| bad())?, end.trim().parse().map_err(|_| bad())?);
        let region = RegionSpec { name: name.into(), file: file.into(), start, end };
        region.validate().map_err(|_| bad())?;
        Ok(region)
    }

    fn validate(&self) -> Result<(), RequestError> {
        if self.name.is_empty() || self.file.is_empty() || self.start == 0 || self.end < self.start {
            return Err(RequestError::BadRegion { text: format!("{}={}:{}-{}", self.name, self.file, self.start, self.end) });
        }
        Ok(())
    }

    /// Whether line `line` of `file` is in the region.
    pub fn contains(&self, file: &str, line: u32) -> bool {
        (self.start..=self.end).contains(&line) && proftap_probes::lines::LineFiles(vec![self.file.clone()]).contains(file)
    }
}

/// What a request can get wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// Sampling at zero samples a second.
    #[error("the sampling frequency must be above 0 samples a second")]
    NoFrequency,
    /// A budget outside 0..=100.
    #[error("the overhead budget is a percentage between 0 and 100, not {percent}")]
    Budget {
        /// As given.
        percent: f64,
    },
    /// Lines or regions without probes.
    #[error("line counts and regions need probes, and sampling only places none: choose one")]
    LinesWithoutProbes,
    /// Automatic instrumentation without probes.
    #[error("automatic instrumentation instruments functions after the warm-up, and sampling only never does: choose one")]
    AutoWithoutProbes,
    /// Nothing to launch.
    #[error("there is no command to launch")]
    NoCommand,
    /// A pid no process can have.
    #[error("{pid} is not a process id")]
    BadPid {
        /// As given.
        pid: i32,
    },
    /// A recording or warm-up longer than [`MAX_WAIT`].
    #[error("a {what} of {seconds} s is longer than the year proftap records at most")]
    TooLong {
        /// What: the recording or the warm-up.
        what: &'static str,
        /// As given.
        seconds: u64,
    },
    /// A trace size out of bounds.
    #[error("a trace of {bytes} bytes is out of bounds: give between 4K and 1G")]
    TraceSize {
        /// As given.
        bytes: u64,
    },
    /// A region that is not one.
    #[error("'{text}' is not a region; write NAME=FILE:START-END, for example parse=src/io.c:40-62")]
    BadRegion {
        /// As given.
        text: String,
    },
    /// More regions than one recording times.
    #[error("{count} regions were asked for; one recording times at most {MOST_REGIONS}")]
    TooManyRegions {
        /// As given.
        count: usize,
    },
}

/// Argument vectors as JSON strings where they are UTF-8, else as their bytes.
mod os_strings {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::ffi::OsString;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Wire {
        Text(String),
        Bytes(Vec<u8>),
    }

    fn wire(s: &OsString) -> Wire {
        match s.to_str() {
            Some(text) => Wire::Text(text.into()),
            None => Wire::Bytes(s.as_bytes().to_vec()),
        }
    }

    fn unwire(w: Wire) -> OsString {
        match w {
            Wire::Text(text) => text.into(),
            Wire::Bytes(bytes) => OsString::from_vec(bytes),
        }
    }

    pub fn serialize<S: Serializer>(strings: &[OsString], s: S) -> Result<S::Ok, S::Error> {
        strings.iter().map(wire).collect::<Vec<_>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<OsString>, D::Error> {
        Ok(Vec::<Wire>::deserialize(d)?.into_iter().map(unwire).collect())
    }

    pub fn serialize_optional<S: Serializer>(strings: &Option<Vec<OsString>>, s: S) -> Result<S::Ok, S::Error> {
        strings.as_ref().map(|v| v.iter().map(wire).collect::<Vec<_>>()).serialize(s)
    }

    pub fn deserialize_optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<OsString>>, D::Error> {
        Ok(Option::<Vec<Wire>>::deserialize(d)?.map(|v| v.into_iter().map(unwire).collect()))
    }
}

/// [`os_strings`] for an optional vector.
mod optional_os_strings {
    pub use super::os_strings::deserialize_optional as deserialize;
    pub use super::os_strings::serialize_optional as serialize;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn a_request_survives_json_with_arguments_that_are_not_utf8() {
        let command = vec![OsString::from("/bin/echo"), OsString::from_vec(vec![0xff, b'x'])];
        let mut request = RecordRequest::new(RecordTarget::Launch { command, cwd: None, env: Some(vec!["A=b".into()]) });
        request.regions.push(RegionSpec::parse("parse=src/io.c:40-62").expect("region"));
        let json = serde_json::to_string(&request).expect("json");
        assert!(json.contains(r#""command":["/bin/echo",[255,120]]"#), "{json}");
        assert_eq!(serde_json::from_str::<RecordRequest>(&json).expect("back"), request);
    }

    #[test]
    fn bad_requests_are_refused_in_words() {
        let mut request = RecordRequest::new(RecordTarget::Attach { pid: 1, duration: None, auto_instrument: None });
        request.sampling = Sampling::Frequency { hz: 0 };
        assert_eq!(request.validate(), Err(RequestError::NoFrequency));
        request.sampling = Sampling::Default;
        request.governor = Governor::Budget { percent: 150.0 };
        assert!(request.validate().is_err_and(|e| e.to_string().contains("between 0 and 100")));
        assert!(RegionSpec::parse("x=a.c:9-3").is_err());
        let mut many = RecordRequest::new(RecordTarget::Launch { command: vec!["/bin/true".into()], cwd: None, env: None });
        many.regions = vec![RegionSpec::parse("r=a.c:1-2").expect("region"); MOST_REGIONS + 1];
        assert_eq!(many.validate(), Err(RequestError::TooManyRegions { count: MOST_REGIONS + 1 }));
        // A deadline the clock cannot count (Instant + it panicked), a
        // warm-up past u64 nanoseconds.
        let wait = |duration, warmup| {
            let auto_instrument = Some(AutoInstrument { count: 5, warmup });
            RecordRequest::new(RecordTarget::Attach { pid: 1, duration, auto_instrument }).validate()
        };
        assert_eq!(wait(Some(MAX_WAIT), MAX_WAIT), Ok(()));
        let forever = Duration::from_secs(u64::MAX);
        assert!(wait(Some(forever), Duration::ZERO).is_err_and(|e| e.to_string().contains("a recording of")));
        assert!(wait(None, MAX_WAIT + Duration::from_nanos(1)).is_err_and(|e| e.to_string().contains("a warm-up of")));
        assert!(RegionSpec::parse("=a.c:1-3").is_err());
        let traced = |bytes| {
            let mut request = RecordRequest::new(RecordTarget::Attach { pid: 1, duration: None, auto_instrument: None });
            request.trace_bytes = Some(bytes);
            request.validate()
        };
        assert_eq!(traced(DEFAULT_TRACE_BYTES), Ok(()));
        assert_eq!(traced(MAX_TRACE_BYTES + 1), Err(RequestError::TraceSize { bytes: MAX_TRACE_BYTES + 1 }));
        assert!(traced(0).is_err_and(|e| e.to_string().contains("between 4K and 1G")));
    }

    #[test]
    fn defaults_follow_the_mode() {
        let launch = RecordTarget::Launch { command: vec!["prog".into()], cwd: None, env: None };
        let hybrid = RecordRequest::new(launch.clone());
        assert_eq!((hybrid.sample_settings().is_some(), hybrid.overhead_budget(false)), (true, Some(0.05)));
        let named = RecordRequest { functions: vec!["main".into()], ..RecordRequest::new(launch) };
        assert_eq!((named.sample_settings(), named.overhead_budget(false)), (None, None));
    }
}
