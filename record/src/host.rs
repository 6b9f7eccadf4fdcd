//! What a front end needs to define uprobes somewhere else than in this
//! process's tracefs: a privileged service defines them for a recorder that
//! runs without the right to (see `proftapd`'s session workers), and says
//! which host the recorder uses with [`set_host`].

pub use proftap_probes::addr::FileOffset;
pub use proftap_probes::exits::ExitMode;
pub use proftap_probes::offcpu::{OffCpu, set_source as set_off_cpu_source};
pub use proftap_probes::target::pidfd;
pub use proftap_probes::tracefs::{
    DefinedGroup, ProbeEvent, ProbeKind, Tracefs, TracefsError, UprobeGroup, UprobeHost, UprobeSpec, set_host,
};
