//! Known call counts in Rust: `leaf` is called from two callers, `depth`
//! recurses. Usage: calls_rs [N]   default 1000.

use std::hint::black_box;

#[inline(never)]
fn leaf(x: u64) -> u64 {
    black_box(x).wrapping_mul(2)
}

#[inline(never)]
fn left(i: u64) -> u64 {
    leaf(i) + 1
}

#[inline(never)]
fn right(i: u64) -> u64 {
    leaf(i) + leaf(i + 1)
}

#[inline(never)]
fn depth(k: u32) -> u32 {
    if black_box(k) == 0 { 0 } else { 1 + depth(k - 1) }
}

mod shapes {
    pub struct Circle(pub f64);

    impl Circle {
        #[inline(never)]
        pub fn area(&self) -> f64 {
            std::hint::black_box(3.14159 * self.0 * self.0)
        }
    }
}

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let mut total = 0u64;
    for i in 0..n {
        total = total.wrapping_add(left(i));
    }
    for i in 0..n / 2 {
        total = total.wrapping_add(right(i));
    }
    let area = shapes::Circle(2.0).area();
    println!("total={total} depth={} area={area:.2}", depth(10));
}
