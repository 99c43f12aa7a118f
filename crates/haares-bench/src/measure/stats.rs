//! The statistics of the cost protocol: the median, and the median's distribution-free 95%
//! interval (the sign test's) that `paired` reports.

use serde::{Deserialize, Serialize};

/// The median of `values` (the mean of the middle two for an even count); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// A median with its distribution-free 95% confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MedianInterval {
    /// The sample median.
    pub median: f64,
    /// Lower end: the k-th smallest value.
    pub low: f64,
    /// Upper end: the k-th largest value.
    pub high: f64,
}

/// The median of `values` and the interval between their k-th smallest and k-th largest, with
/// the largest `k` for which `P(Binomial(n, ½) ≤ k − 1) ≤ 2.5%`: the interval covers the true
/// median with at least 95% probability whatever the distribution, when the values are
/// independent (the sign test's interval). `None` where no k exists: fewer than 6 values.
pub fn median_interval(values: &[f64]) -> Option<MedianInterval> {
    let n = values.len();
    let k = median_rank(n);
    if k == 0 {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(MedianInterval {
        median: median(&sorted),
        low: sorted[k - 1],
        high: sorted[n - k],
    })
}

/// The largest `k` with `P(Binomial(n, ½) ≤ k − 1) ≤ 0.025`, 0 where there is none. The
/// probabilities are summed from `ln C(n, j) − n ln 2`, which stays finite for any `n`.
fn median_rank(n: usize) -> usize {
    let ln_all = n as f64 * std::f64::consts::LN_2;
    let (mut ln_choose, mut below, mut rank) = (0.0f64, 0.0f64, 0);
    for j in 0..n {
        below += (ln_choose - ln_all).exp();
        if below > 0.025 {
            break;
        }
        rank = j + 1;
        ln_choose += ((n - j) as f64 / (j + 1) as f64).ln();
    }
    rank
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    /// The sign test's 95% ranks of textbook tables: n = 6: (1, 6); 10: (2, 9); 20: (6, 15);
    /// 100: (40, 61); none below 6.
    #[test]
    fn the_median_interval_takes_the_sign_tests_ranks() {
        for (n, low, high) in [(6, 1, 6), (10, 2, 9), (20, 6, 15), (100, 40, 61)] {
            // Values equal to their rank, shuffled, so the interval's ends are its ranks.
            let values: Vec<f64> = (1..=n).map(|r| ((r * 7) % n + 1) as f64).collect();
            let interval = median_interval(&values).unwrap();
            assert_eq!(
                (interval.low, interval.high),
                (low as f64, high as f64),
                "n = {n}"
            );
            assert_eq!(interval.median, (n as f64 + 1.0) / 2.0);
        }
        assert_eq!(median_interval(&[1.0, 2.0, 3.0, 4.0, 5.0]), None);
    }
}
