//! Aggregator throughput on a recorded event stream: events per second on one core.
//!
//! Record a stream with `PROFTAP_SAVE_EVENTS=FILE proftap run ...`, then
//! `cargo bench -p proftap-record --bench aggregate -- FILE FUNCTIONS METRICS`.
//! `benches/aggregate.sh` does both.

use proftap_record::aggregate::Aggregator;
use proftap_record::events::{Event, Hit};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let [file, functions, metrics] = &args[..] else {
        eprintln!("usage: aggregate FILE FUNCTIONS METRICS (a stream saved with PROFTAP_SAVE_EVENTS)");
        std::process::exit(2);
    };
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
    let functions: usize = functions.parse().expect("FUNCTIONS is a number");
    let metrics: usize = metrics.parse().expect("METRICS is a number");
    let events: Vec<Event> = Hit::load_all(&bytes).into_iter().map(Event::Hit).collect();
    let mut best = f64::MAX;
    for _ in 0..10 {
        let start = Instant::now();
        let mut aggregator = Aggregator::new(functions, metrics, None);
        for event in &events {
            aggregator.push(event);
        }
        let result = aggregator.finish();
        std::hint::black_box(&result.threads);
        best = best.min(start.elapsed().as_secs_f64());
    }
    println!("{} events in {:.1} ms: {:.1} million events per second", events.len(), best * 1e3, events.len() as f64 / best / 1e6);
}
