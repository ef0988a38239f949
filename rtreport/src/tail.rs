//! How sure the worst case is. The observed maximum says nothing about
//! what the next hour brings; the number of cycles over the budget, and an
//! exact binomial (Clopper–Pearson) upper bound on the per-cycle miss
//! probability, do. Pure arithmetic on counts: every figure here follows
//! from the histogram and the run's parameters.

use serde::{Deserialize, Serialize};

/// The one-sided confidence level of every bound.
pub const CONFIDENCE: f64 = 0.95;

/// The tail of one run, over every measured core.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Tail {
    /// Cycles measured, all cores together.
    pub cycles: u64,
    pub budget_us: u64,
    /// Cycles whose latency was over the budget.
    pub exceedances: u64,
    /// False when the budget lies beyond the histogram's range and some
    /// cycles overflowed it: they are counted as exceedances, so the count
    /// (and every bound after it) is an upper estimate.
    pub exceedances_exact: bool,
    /// At 95 % confidence the per-cycle probability of a latency over the
    /// budget is below this (exact binomial upper bound).
    pub miss_probability_upper: f64,
    /// `1 / miss_probability_upper`: fewer than one miss in this many cycles.
    pub cycles_per_miss_lower: f64,
    /// The same at one core's cycle rate (its interval), in seconds.
    pub seconds_per_miss_lower: f64,
    /// Upper bounds on high quantiles, where there are enough cycles.
    pub quantiles: Vec<QuantileBound>,
}

/// A quantile of the per-cycle latency: observed, and bounded from above.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct QuantileBound {
    /// `p99.99`, `p99.999`.
    pub quantile: String,
    pub observed_us: u64,
    /// At 95 % confidence the true quantile is at most this; `None` when
    /// that order statistic lies beyond the histogram's range.
    pub upper_us: Option<u64>,
}

/// ln P(X ≤ k) for X ~ Binomial(n, p), summed in log space so that large
/// `n` neither underflows nor loses the small terms.
fn ln_binomial_cdf(k: u64, n: u64, p: f64) -> f64 {
    if p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return if k >= n { 0.0 } else { f64::NEG_INFINITY };
    }
    let (ln_p, ln_q) = (p.ln(), (-p).ln_1p());
    let mut ln_term = n as f64 * ln_q;
    let mut ln_sum = ln_term;
    for i in 0..k.min(n) {
        ln_term += ((n - i) as f64).ln() - ((i + 1) as f64).ln() + ln_p - ln_q;
        ln_sum = ln_add(ln_sum, ln_term);
    }
    ln_sum
}

/// The exact one-sided upper bound on a binomial proportion after `k`
/// events in `n` trials (Clopper–Pearson): the `p` at which `k` or fewer
/// events would happen only `1 - confidence` of the time. For `k = 0` it is
/// `1 - (1 - confidence)^(1/n)`, about `3/n` at 95 % (the rule of three).
pub fn upper_bound(k: u64, n: u64, confidence: f64) -> f64 {
    if n == 0 || k >= n {
        return 1.0;
    }
    let target = (1.0 - confidence).ln();
    let (mut low, mut high) = (k as f64 / n as f64, 1.0);
    // 64 halvings of [k/n, 1] leave an error far below any p that matters.
    for _ in 0..64 {
        let mid = (low + high) / 2.0;
        if ln_binomial_cdf(k, n, mid) > target {
            low = mid;
        } else {
            high = mid;
        }
    }
    high
}

/// The latency, in µs, of the `rank`-th smallest sample (1-based) of a
/// merged histogram; `None` when it lies in the overflow beyond it.
fn latency_at_rank(histogram: &[(u64, u64)], rank: u64) -> Option<u64> {
    let mut seen = 0;
    for &(latency, count) in histogram {
        seen += count;
        if seen >= rank {
            return Some(latency);
        }
    }
    None
}

/// The smallest rank whose order statistic bounds quantile `q` from above
/// at `confidence`; `None` when `n` is too small for any rank.
///
/// The `e`-th largest sample falls below the true quantile only when fewer
/// than `e` samples lie at or above it, and that count is Binomial(n, 1 - q):
/// the bound is the `e`-th largest sample for the largest `e` with
/// P(count ≤ e - 1) ≤ 1 - confidence. The CDF is summed once, term by term.
fn upper_rank(n: u64, q: f64, confidence: f64) -> Option<u64> {
    let alpha_ln = (1.0 - confidence).ln();
    let p = 1.0 - q;
    let (ln_p, ln_q) = (p.ln(), (-p).ln_1p());
    let mut ln_term = n as f64 * ln_q;
    let mut ln_cdf = ln_term;
    let mut e = 0;
    while ln_cdf <= alpha_ln && e < n {
        ln_term += ((n - e) as f64).ln() - ((e + 1) as f64).ln() + ln_p - ln_q;
        ln_cdf = ln_add(ln_cdf, ln_term);
        e += 1;
    }
    (e >= 1).then(|| n - e + 1)
}

/// ln(e^a + e^b).
fn ln_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    hi + (lo - hi).exp().ln_1p()
}

/// One histogram of several (`(latency_us, count)`, ascending).
pub fn merge<'a>(histograms: impl Iterator<Item = &'a [(u64, u64)]>) -> Vec<(u64, u64)> {
    let mut merged = std::collections::BTreeMap::new();
    for histogram in histograms {
        for &(latency, count) in histogram {
            *merged.entry(latency).or_insert(0) += count;
        }
    }
    merged.into_iter().collect()
}

/// A run's merged histogram.
#[derive(Clone, Copy, Debug)]
pub struct Histogram<'a> {
    /// `(latency_us, count)`, ascending.
    pub buckets: &'a [(u64, u64)],
    /// Cycles beyond the histogram's range.
    pub overflows: u64,
    /// The largest latency the buckets hold.
    pub range_us: u64,
    /// The largest latency measured.
    pub max_us: u64,
}

impl Histogram<'_> {
    /// Cycles over `budget_us`, and whether that count is exact.
    fn over(&self, budget_us: u64) -> (u64, bool) {
        let in_range: u64 = self
            .buckets
            .iter()
            .filter(|(latency, _)| *latency > budget_us)
            .map(|(_, count)| count)
            .sum();
        if budget_us < self.range_us || self.max_us <= budget_us {
            // Overflows are all over the budget, or all within it.
            let overflows = if self.max_us <= budget_us {
                0
            } else {
                self.overflows
            };
            (in_range + overflows, true)
        } else {
            (in_range + self.overflows, self.overflows == 0)
        }
    }
}

/// The tail of a run from its merged histogram.
pub fn assess(histogram: Histogram, budget_us: u64, interval_us: u32) -> Tail {
    let cycles = histogram.buckets.iter().map(|(_, count)| count).sum::<u64>() + histogram.overflows;
    let (exceedances, exceedances_exact) = histogram.over(budget_us);
    let histogram = histogram.buckets;
    let miss_probability_upper = upper_bound(exceedances, cycles, CONFIDENCE);
    let cycles_per_miss_lower = 1.0 / miss_probability_upper;
    let quantiles = [("p99.99", 0.9999), ("p99.999", 0.99999)]
        .into_iter()
        .filter_map(|(name, q)| {
            let rank = upper_rank(cycles, q, CONFIDENCE)?;
            let observed = latency_at_rank(histogram, ((q * cycles as f64).ceil() as u64).max(1))?;
            Some(QuantileBound {
                quantile: name.to_string(),
                observed_us: observed,
                upper_us: latency_at_rank(histogram, rank),
            })
        })
        .collect();
    Tail {
        cycles,
        budget_us,
        exceedances,
        exceedances_exact,
        miss_probability_upper,
        cycles_per_miss_lower,
        seconds_per_miss_lower: cycles_per_miss_lower * f64::from(interval_us) / 1e6,
        quantiles,
    }
}

/// `1,500,000`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Tail {
    /// The sentence the table prints, e.g. `0 of 1,500,000 cycles over 100
    /// us: at 95 % confidence fewer than 1 miss in 500,712 cycles (100 s at
    /// 5 kHz)`.
    pub fn sentence(&self, interval_us: u32) -> String {
        if self.cycles == 0 {
            return "no cycle measured: no confidence to state".into();
        }
        let rate_khz = 1e3 / f64::from(interval_us.max(1));
        format!(
            "{}{} of {} cycles over {} us: at 95 % confidence fewer than 1 miss in {} cycles ({} at {rate_khz:.3} kHz)",
            if self.exceedances_exact { "" } else { "at most " },
            grouped(self.exceedances),
            grouped(self.cycles),
            self.budget_us,
            grouped(self.cycles_per_miss_lower.floor() as u64),
            human_seconds(self.seconds_per_miss_lower),
        )
    }
}

fn human_seconds(seconds: f64) -> String {
    match seconds {
        s if s < 1.0 => format!("{:.0} ms", s * 1e3),
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} days", s / 86_400.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A histogram over 0-1000 us whose max is its last bucket (or beyond).
    fn hist(buckets: &[(u64, u64)], overflows: u64) -> Histogram<'_> {
        let last = buckets.last().map_or(0, |b| b.0);
        Histogram {
            buckets,
            overflows,
            range_us: 1000,
            max_us: if overflows > 0 { 1001 } else { last },
        }
    }

    fn close(a: f64, b: f64, relative: f64) -> bool {
        ((a - b) / b).abs() < relative
    }

    /// Hand-computed: for large n the binomial bound is the Poisson one,
    /// λ_U = χ²(0.95; 2(k+1)) / 2: 2.9957 (k = 0), 4.7439 (k = 1),
    /// 16.962 (k = 10); divided by n.
    #[test]
    fn bounds_match_hand_computed_values() {
        let n = 1_500_000;
        let zero = upper_bound(0, n, 0.95);
        // Exactly 1 - 0.05^(1/n).
        assert!(close(zero, -(0.05f64.ln() / n as f64).exp_m1(), 1e-9), "{zero}");
        assert!(close(zero, 2.995_732 / n as f64, 1e-5), "{zero}");
        assert!(close(upper_bound(1, n, 0.95), 4.743_865 / n as f64, 1e-4));
        assert!(close(upper_bound(10, n, 0.95), 16.962_1 / n as f64, 1e-4));
        // Small n, exact: 1 of 10 at 95 % -> 0.3942 (tables).
        assert!(close(upper_bound(1, 10, 0.95), 0.394_2, 1e-3));
        assert_eq!(upper_bound(0, 0, 0.95), 1.0);
        assert_eq!(upper_bound(5, 5, 0.95), 1.0);
    }

    #[test]
    fn the_issue_s_example_reads_as_stated() {
        // 1,500,000 cycles at 200 us, none over 100 us.
        let tail = assess(hist(&[(5, 1_000_000), (40, 500_000)], 0), 100, 200);
        assert_eq!((tail.cycles, tail.exceedances), (1_500_000, 0));
        // 1 / (1 - 0.05^(1/1,500,000)) = 500,712.8
        assert_eq!(tail.cycles_per_miss_lower.floor() as u64, 500_712);
        assert!(close(tail.seconds_per_miss_lower, 100.14, 1e-3));
        assert_eq!(
            tail.sentence(200),
            "0 of 1,500,000 cycles over 100 us: at 95 % confidence fewer than 1 miss in 500,712 cycles (100 s at 5.000 kHz)"
        );
    }

    #[test]
    fn exceedances_count_the_histogram_over_the_budget_and_the_overflow() {
        let tail = assess(hist(&[(50, 90), (100, 5), (101, 3), (900, 1)], 1), 100, 1000);
        assert_eq!(tail.cycles, 100);
        assert_eq!((tail.exceedances, tail.exceedances_exact), (5, true));
        assert!(tail.miss_probability_upper > 0.05);
        // A budget beyond a 60 us histogram: overflows under a 90 us max
        // are within it; over it, they are counted, and said to be an
        // upper estimate.
        let narrow = |max_us| Histogram {
            buckets: &[(10, 95)],
            overflows: 5,
            range_us: 60,
            max_us,
        };
        assert_eq!(assess(narrow(90), 100, 200).exceedances, 0);
        let unsure = assess(narrow(150), 100, 200);
        assert_eq!((unsure.exceedances, unsure.exceedances_exact), (5, false));
        assert!(unsure.sentence(200).starts_with("at most 5 of 100 cycles"));
        let nothing = assess(hist(&[], 0), 100, 200);
        assert_eq!(nothing.sentence(200), "no cycle measured: no confidence to state");
    }

    #[test]
    fn quantile_bounds_need_enough_cycles() {
        // 10,000 cycles: too few for p99.99 at 95 % (needs ~30,000).
        assert!(assess(hist(&[(10, 10_000)], 0), 100, 200).quantiles.is_empty());
        // 1,000,000 cycles, 100 of them at 60 us, 10 at 80 us.
        let tail = assess(hist(&[(10, 999_890), (60, 100), (80, 10)], 0), 100, 200);
        let p9999 = &tail.quantiles[0];
        assert_eq!(p9999.quantile, "p99.99");
        // Rank 999,900 is the last 60 us sample; the upper bound is a
        // higher order statistic, still within the 60 us samples.
        assert_eq!(p9999.observed_us, 60);
        assert_eq!(p9999.upper_us, Some(60));
        // p99.999: the 11th largest sample is observed (60 us), the 5th
        // largest bounds it at 95 % (80 us): the bound is not the estimate.
        let p99999 = &tail.quantiles[1];
        assert_eq!(p99999.observed_us, 60);
        assert_eq!(p99999.upper_us, Some(80));
        // A bound in the overflow is unknown, not invented.
        let over = assess(hist(&[(10, 999_995)], 5), 100, 200);
        assert_eq!(over.quantiles[1].upper_us, None);
    }

    #[test]
    fn merged_histograms_add_counts_per_latency() {
        let a = [(1, 2), (5, 1)];
        let b = [(1, 1), (3, 4)];
        assert_eq!(merge([&a[..], &b[..]].into_iter()), vec![(1, 3), (3, 4), (5, 1)]);
    }

    #[test]
    fn numbers_are_grouped() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(1_500_000), "1,500,000");
    }
}
