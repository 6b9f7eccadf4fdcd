//! Rust: a panic that leaves two instrumented frames, caught by
//! `catch_unwind` in the caller.
//!
//! Usage: panics [N]   default 100. Every tenth of N rounds, check()
//! panics inside validate(); run() catches it.
use std::hint::black_box;
use std::panic;

#[inline(never)]
fn check(round: u64) {
    if round % 10 == 9 {
        panic!("round {} rejected", round);
    }
}

#[inline(never)]
fn validate(round: u64) -> u64 {
    check(black_box(round));
    round
}

#[inline(never)]
fn run(round: u64) -> Option<u64> {
    panic::catch_unwind(|| validate(round)).ok()
}

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    // The panics are expected: no message for each.
    panic::set_hook(Box::new(|_| {}));
    let mut total = 0;
    let mut rejected = 0;
    for round in 0..n {
        match run(round) {
            Some(v) => total += v,
            None => rejected += 1,
        }
    }
    println!("total={total} rejected={rejected}");
}
