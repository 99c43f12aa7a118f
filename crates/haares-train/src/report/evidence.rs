//! The statistics of a paired comparison with the paper: per-seed reductions g = ℓ_baseline − ℓ_M
//! (eq:endpoint), how many favour the method, a two-sided sign test and a 95% paired t interval
//! of their mean, and whether the paper's mean lies inside it. The words built from them are in
//! [`crate::report::verdict`].

/// The two-sided 97.5% quantiles of Student's t with 1 to 30 degrees of freedom (the textbook
/// table; `tests/train/paper_report.rs` checks each against the t density, integrated).
const T_975: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// t_{0.975, df}: the table up to 30 degrees of freedom, then the Cornish–Fisher expansion
/// around the normal quantile (within 2e-4 of the exact value there).
pub fn t_quantile_975(df: usize) -> f64 {
    assert!(df >= 1, "Student's t needs at least one degree of freedom");
    if df <= T_975.len() {
        return T_975[df - 1];
    }
    let (z, n) = (1.959_964_f64, df as f64);
    z + (z.powi(3) + z) / (4.0 * n)
        + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * n * n)
}

/// Paired reductions of one setting, method and baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Evidence {
    /// (seed, reduction), in seed order.
    pub reductions: Vec<(u64, f64)>,
}

impl Evidence {
    /// The mean reduction (`None` without pairs).
    pub fn mean(&self) -> Option<f64> {
        let n = self.reductions.len();
        (n > 0).then(|| self.reductions.iter().map(|(_, g)| g).sum::<f64>() / n as f64)
    }

    /// Pairs whose reduction is positive (the method's loss lower).
    pub fn favouring(&self) -> usize {
        self.reductions.iter().filter(|(_, g)| *g > 0.0).count()
    }

    /// The two-sided sign test's p-value for "no systematic difference": ties (g = 0) are
    /// dropped, as the test prescribes; `None` when every pair is tied.
    pub fn sign_test_p(&self) -> Option<f64> {
        let positive = self.favouring();
        let negative = self.reductions.iter().filter(|(_, g)| *g < 0.0).count();
        let n = positive + negative;
        if n == 0 {
            return None;
        }
        let k = positive.max(negative);
        // P(X ≥ k) for X ~ Binomial(n, ½), doubled.
        let tail: f64 = (k..=n).map(|i| binomial(n, i)).sum::<f64>() / 2f64.powi(n as i32);
        Some((2.0 * tail).min(1.0))
    }

    /// The 95% paired t interval of the mean reduction, from three pairs on (two give an
    /// interval, but one spanning twelve standard errors says nothing).
    pub fn t_interval(&self) -> Option<(f64, f64)> {
        let n = self.reductions.len();
        if n < 3 {
            return None;
        }
        let mean = self.mean()?;
        let variance = self
            .reductions
            .iter()
            .map(|(_, g)| (g - mean).powi(2))
            .sum::<f64>()
            / (n - 1) as f64;
        let half = t_quantile_975(n - 1) * (variance / n as f64).sqrt();
        Some((mean - half, mean + half))
    }
}

/// The binomial coefficient C(n, k), as a float (n is a seed count).
fn binomial(n: usize, k: usize) -> f64 {
    (0..k).fold(1.0, |c, i| c * (n - i) as f64 / (i + 1) as f64)
}

/// Which way a reduction points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The method's loss is lower (g > 0).
    Favours,
    /// The baseline's loss is lower (g < 0).
    Against,
    /// Equal losses.
    Tie,
}

impl Direction {
    /// The direction of reduction `g`.
    pub fn of(g: f64) -> Self {
        if g > 0.0 {
            Self::Favours
        } else if g < 0.0 {
            Self::Against
        } else {
            Self::Tie
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(values: &[f64]) -> Evidence {
        Evidence {
            reductions: values
                .iter()
                .enumerate()
                .map(|(i, g)| (i as u64, *g))
                .collect(),
        }
    }

    #[test]
    fn the_sign_test_counts_the_binomial_tail_both_ways() {
        // 3 of 3: 2 · (1/8); 5 of 6: 2 · 7/64; ties dropped; an even split is 1.
        assert!((evidence(&[0.1, 0.2, 0.3]).sign_test_p().unwrap() - 0.25).abs() < 1e-12);
        assert!(
            (evidence(&[0.1, 0.2, 0.3, 0.4, 0.5, -0.1])
                .sign_test_p()
                .unwrap()
                - 14.0 / 64.0)
                .abs()
                < 1e-12
        );
        assert!((evidence(&[-0.1, -0.2, 0.0]).sign_test_p().unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(evidence(&[0.1, -0.1]).sign_test_p(), Some(1.0));
        assert_eq!(evidence(&[0.0]).sign_test_p(), None);
    }

    #[test]
    fn the_t_interval_of_three_pairs_uses_two_degrees_of_freedom() {
        // Mean 2, sample SD 1: half-width 4.303 / √3.
        let (low, high) = evidence(&[1.0, 2.0, 3.0]).t_interval().unwrap();
        let half = 4.303 / 3f64.sqrt();
        assert!((low - (2.0 - half)).abs() < 1e-12 && (high - (2.0 + half)).abs() < 1e-12);
        assert_eq!(evidence(&[1.0, 2.0]).t_interval(), None);
    }
}
