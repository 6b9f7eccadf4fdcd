//! How far apart two small sets of runs are, without assuming their noise
//! is normal: the Hodges-Lehmann estimate of the shift between them and its
//! confidence interval from the Mann-Whitney U distribution.
//!
//! Values are compared on a log scale, so the shift is a ratio: 1.10 means
//! the second set is 10% above the first. The interval excludes 1 exactly
//! when a two-sided Mann-Whitney test rejects "no change" at that
//! confidence; with 5 runs a side the widest confidence that can is 99.2%.

/// A ratio between two sets of runs, and the interval it lies in.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Ratio {
    /// Lower end of the interval.
    pub low: f64,
    /// The estimate: the median of the ratios of every pair of runs.
    pub estimate: f64,
    /// Upper end.
    pub high: f64,
}

/// Exact U distributions are computed up to this many pairs; past it, the
/// normal approximation is within a rank of them.
const EXACT_PAIRS: usize = 400;

/// The ratio of `after` to `before` (positive values, one per run) with its
/// interval at `confidence` (0.95: 95%); `None` when there are too few runs
/// for any interval at that confidence, or a value is not positive.
pub fn ratio(before: &[f64], after: &[f64], confidence: f64) -> Option<Ratio> {
    if before.iter().chain(after).any(|v| !(v.is_finite() && *v > 0.0)) || !(confidence > 0.0 && confidence < 1.0) {
        return None;
    }
    let rank = critical_rank(before.len(), after.len(), 1.0 - confidence)?;
    let mut shifts: Vec<f64> = before.iter().flat_map(|b| after.iter().map(move |a| a.ln() - b.ln())).collect();
    shifts.sort_by(f64::total_cmp);
    let pairs = shifts.len();
    let middle = if pairs % 2 == 1 { shifts[pairs / 2] } else { (shifts[pairs / 2 - 1] + shifts[pairs / 2]) / 2.0 };
    Some(Ratio { low: shifts[rank - 1].exp(), estimate: middle.exp(), high: shifts[pairs - rank].exp() })
}

/// The largest c with P(U < c) <= alpha / 2 for samples of `n` and `m`
/// under no change: the c-th smallest and c-th largest pairwise shifts bound
/// the interval. `None` when even c = 1 is too likely (too few runs).
fn critical_rank(n: usize, m: usize, alpha: f64) -> Option<usize> {
    let pairs = n.checked_mul(m).filter(|&p| p > 0)?;
    let c = if pairs <= EXACT_PAIRS {
        let counts = u_counts(n, m);
        let total: f64 = counts.iter().sum();
        let mut below = 0.0;
        let mut c = 0;
        for count in &counts {
            if (below + count) / total > alpha / 2.0 {
                break;
            }
            below += count;
            c += 1;
        }
        c
    } else {
        let (n, m) = (n as f64, m as f64);
        let spread = (n * m * (n + m + 1.0) / 12.0).sqrt();
        (n * m / 2.0 - normal_quantile(1.0 - alpha / 2.0) * spread).floor().max(0.0) as usize
    };
    (c >= 1 && c <= pairs.div_ceil(2)).then_some(c)
}

/// How many orderings of `n` and `m` values give each U from 0 to n*m.
fn u_counts(n: usize, m: usize) -> Vec<f64> {
    // counts[j][u] for i values of the first set against j of the second,
    // built up one i at a time: f(i, j, u) = f(i-1, j, u-j) + f(i, j-1, u).
    let mut previous: Vec<Vec<f64>> = (0..=m).map(|_| vec![1.0]).collect();
    for _i in 1..=n {
        let mut current: Vec<Vec<f64>> = Vec::with_capacity(m + 1);
        current.push(vec![1.0]);
        for j in 1..=m {
            let size = previous[j].len() + j;
            let mut row = vec![0.0; size];
            for (u, count) in previous[j].iter().enumerate() {
                row[u + j] += count;
            }
            for (u, count) in current[j - 1].iter().enumerate() {
                row[u] += count;
            }
            current.push(row);
        }
        previous = current;
    }
    previous.swap_remove(m)
}

/// The standard normal distribution's quantile (Acklam's approximation,
/// relative error below 1.2e-9).
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -39.696_830_286_653_76,
        220.946_098_424_520_5,
        -275.928_510_446_968_7,
        138.357_751_867_269,
        -30.664_798_066_147_16,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] =
        [-54.476_098_798_224_06, 161.585_836_858_040_9, -155.698_979_859_886_6, 66.801_311_887_719_72, -13.280_681_552_885_72];
    const C: [f64; 6] = [
        -0.007_784_894_002_430_293,
        -0.322_396_458_041_136_5,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [0.007_784_695_709_041_462, 0.322_467_129_070_039_8, 2.445_134_137_142_996, 3.754_408_661_907_416];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5]) / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_u_distributions_match_the_tables() {
        // n = m = 5: 252 orderings; P(U <= 2) = 4/252, P(U <= 3) = 7/252.
        let counts = u_counts(5, 5);
        assert_eq!(counts.len(), 26);
        assert_eq!(counts.iter().sum::<f64>(), 252.0);
        assert_eq!(&counts[..4], &[1.0, 1.0, 2.0, 3.0]);
        // Published critical values of the two-sided test at 5%: U <= 2 for
        // 5 and 5, U <= 0 for 3 and 5 (so c = 3 and c = 1), none for 3 and 3.
        assert_eq!(critical_rank(5, 5, 0.05), Some(3));
        assert_eq!(critical_rank(3, 5, 0.05), Some(1));
        assert_eq!(critical_rank(3, 3, 0.05), None);
        assert_eq!(critical_rank(10, 10, 0.05), Some(24));
        // The normal approximation is close to the exact value where they meet.
        let exact = critical_rank(20, 20, 0.05).unwrap();
        let (n, m) = (20.0f64, 20.0f64);
        let approx = (n * m / 2.0 - normal_quantile(0.975) * (n * m * (n + m + 1.0) / 12.0).sqrt()).floor() as usize;
        assert!(exact.abs_diff(approx) <= 1, "{exact} {approx}");
        assert!((normal_quantile(0.975) - 1.959_964).abs() < 1e-5);
    }

    #[test]
    fn separated_runs_give_an_interval_past_one_and_mixed_runs_do_not() {
        let before = [100.0, 102.0, 99.0, 101.0, 100.5];
        let slower = [110.0, 111.5, 109.0, 112.0, 110.5];
        let r = ratio(&before, &slower, 0.95).unwrap();
        assert!(r.low > 1.0 && r.low < r.estimate && r.estimate < r.high, "{r:?}");
        assert!((r.estimate - 1.10).abs() < 0.01, "{r:?}");
        let same = [101.0, 99.5, 100.2, 102.5, 98.0];
        let r = ratio(&before, &same, 0.95).unwrap();
        assert!(r.low < 1.0 && r.high > 1.0, "{r:?}");
        // Too few runs for 95%, and values that cannot be compared.
        assert_eq!(ratio(&before[..2], &slower[..2], 0.95), None);
        assert_eq!(ratio(&[0.0, 1.0, 1.0, 1.0, 1.0], &slower, 0.95), None);
        assert_eq!(ratio(&before, &slower, 1.0), None);
    }
}
