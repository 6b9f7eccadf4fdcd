//! Aggregator throughput on a saved event stream: events per second on one core.
//!
//! Save a stream with `proftap run --save-events FILE ...`, then
//! `cargo bench -p proftap-record --bench aggregate -- FILE`.
//! `benches/aggregate.sh` does both.

use proftap_record::aggregate::Aggregator;
use proftap_record::events::Event;
use proftap_record::saved::SavedRecording;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let [file] = &args[..] else {
        eprintln!("usage: aggregate FILE (a stream saved with proftap run --save-events FILE)");
        std::process::exit(2);
    };
    let saved = std::fs::File::open(file)
        .map_err(|e| e.to_string())
        .and_then(|f| SavedRecording::load(std::io::BufReader::new(f)).map_err(|e| e.to_string()));
    let saved = saved.unwrap_or_else(|e| {
        eprintln!("cannot read {file}: {e}");
        std::process::exit(2);
    });
    let hits = saved.events.iter().filter(|e| matches!(e, Event::Hit(_))).count();
    let mut best = f64::MAX;
    for _ in 0..10 {
        let start = Instant::now();
        let mut aggregator = Aggregator::new(saved.setup.aggregation.clone());
        for event in &saved.events {
            aggregator.push(event);
        }
        let result = aggregator.finish();
        std::hint::black_box(&result.threads);
        best = best.min(start.elapsed().as_secs_f64());
    }
    let events = saved.events.len();
    println!("{events} events ({hits} probe hits) in {:.1} ms: {:.1} million events per second", best * 1e3, events as f64 / best / 1e6);
}
