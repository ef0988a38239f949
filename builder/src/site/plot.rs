//! A record's latency histogram as inline SVG, drawn here from its numbers
//! alone: no text from the record reaches the drawing, and the SVG a
//! target wrote (`plot.svg`) is never copied into the site.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Deserialize;

/// The buckets of every core of a jitter report, summed: latency in µs →
/// samples. Empty when the report has none it can read.
pub fn histogram(report: &serde_json::Value) -> BTreeMap<u64, u64> {
    #[derive(Deserialize)]
    struct Cores {
        #[serde(default)]
        cores: Vec<Core>,
    }
    #[derive(Deserialize)]
    struct Core {
        #[serde(default)]
        histogram: Vec<(u64, u64)>,
    }
    let mut sum = BTreeMap::new();
    if let Ok(cores) = Cores::deserialize(report) {
        for (us, count) in cores.cores.iter().flat_map(|core| core.histogram.iter()) {
            let bucket: &mut u64 = sum.entry(*us).or_default();
            *bucket = bucket.saturating_add(*count);
        }
    }
    sum
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 240.0;
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 32.0;
const TOP: f64 = 12.0;

/// The histogram as SVG, counts on a log scale, with the budget as a red
/// line; `label` is what screen readers say of it.
pub fn svg(histogram: &BTreeMap<u64, u64>, budget_us: u64, label: &str) -> String {
    let x_max = histogram
        .keys()
        .next_back()
        .copied()
        .unwrap_or(0)
        .max(budget_us)
        .max(1) as f64;
    let (histogram, bin_us) = binned(histogram, x_max as u64);
    let y_max = histogram.values().copied().max().unwrap_or(1).max(1) as f64;
    let (plot_w, plot_h) = (WIDTH - LEFT - 8.0, HEIGHT - BOTTOM - TOP);
    let x = |us: f64| LEFT + us / x_max * plot_w;
    let y = |count: f64| TOP + plot_h - (count.max(1.0).log10() + 1.0) / (y_max.log10() + 1.0) * plot_h;
    let bar = (plot_w * bin_us as f64 / (x_max + 1.0)).max(1.0);
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{label}\">",
        label = super::html::esc(label)
    );
    for (us, count) in histogram.iter().filter(|(_, count)| **count > 0) {
        let (left, top) = (x(*us as f64), y(*count as f64));
        let width = bar.min(LEFT + plot_w - left).max(1.0);
        let _ = write!(
            out,
            "<rect class=\"bar\" x=\"{left:.1}\" y=\"{top:.1}\" width=\"{width:.1}\" height=\"{:.1}\"/>",
            TOP + plot_h - top
        );
    }
    let (bx, base) = (x(budget_us as f64), TOP + plot_h);
    let _ = write!(
        out,
        "<line class=\"budget\" x1=\"{bx:.1}\" y1=\"{TOP}\" x2=\"{bx:.1}\" y2=\"{base:.1}\"/>\
         <line class=\"axis\" x1=\"{LEFT}\" y1=\"{base:.1}\" x2=\"{:.1}\" y2=\"{base:.1}\"/>\
         <line class=\"axis\" x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{base:.1}\"/>\
         <text x=\"{LEFT}\" y=\"{:.1}\">0 µs</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{} µs</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
         <text x=\"{:.1}\" y=\"{base:.1}\" text-anchor=\"end\">1</text></svg>",
        LEFT + plot_w,
        base + 18.0,
        LEFT + plot_w,
        base + 18.0,
        x_max as u64,
        LEFT - 6.0,
        TOP + 10.0,
        y_max as u64,
        LEFT - 6.0,
    );
    out
}

/// The most bars drawn: buckets beyond are summed into as many bins.
const MAX_BARS: u64 = 576;

/// The histogram in at most [`MAX_BARS`] bins over `0..=x_max`, each keyed
/// by its first microsecond, and the bins' width in microseconds.
fn binned(histogram: &BTreeMap<u64, u64>, x_max: u64) -> (BTreeMap<u64, u64>, u64) {
    let width = x_max / MAX_BARS + 1;
    let mut bins = BTreeMap::new();
    for (us, count) in histogram {
        let bin: &mut u64 = bins.entry(us / width * width).or_default();
        *bin = bin.saturating_add(*count);
    }
    (bins, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_are_summed_and_a_bad_report_draws_nothing() {
        let report = serde_json::json!({"cores": [
            {"histogram": [[3, 10], [5, 1]]}, {"histogram": [[3, 5]]}]});
        let sum = histogram(&report);
        assert_eq!(sum, BTreeMap::from([(3, 15), (5, 1)]));
        assert!(histogram(&serde_json::json!({"cores": "<script>"})).is_empty());
    }

    #[test]
    fn many_buckets_become_at_most_so_many_bars() {
        let wide: BTreeMap<u64, u64> = (0..100_000).map(|us| (us, 1)).collect();
        let drawing = svg(&wide, 100, "wide");
        let bars = drawing.matches("<rect class=\"bar\"").count() as u64;
        assert!(bars <= MAX_BARS && bars > MAX_BARS / 2, "{bars} bars");
        assert!(svg(&BTreeMap::from([(1, 0)]), 0, "zero").matches("<rect").count() == 0);
        // Summed bins set the scale: no bar rises above the plot.
        let tops = drawing_tops(&svg(&wide, 100, "wide"));
        assert!(tops.iter().all(|top| *top >= TOP - 0.05), "{tops:?}");
    }

    fn drawing_tops(drawing: &str) -> Vec<f64> {
        drawing
            .split("<rect class=\"bar\"")
            .skip(1)
            .map(|rect| {
                let at = rect.find(" y=\"").unwrap() + 4;
                rect[at..rect[at..].find('"').unwrap() + at].parse().unwrap()
            })
            .collect()
    }

    #[test]
    fn the_drawing_has_a_bar_per_bucket_and_the_budget() {
        let drawing = svg(&BTreeMap::from([(3, 15), (5, 1)]), 40, "a <plot>");
        assert_eq!(drawing.matches("<rect class=\"bar\"").count(), 2);
        assert!(drawing.contains("class=\"budget\""));
        assert!(drawing.contains("aria-label=\"a &lt;plot&gt;\""));
        assert!(
            drawing.contains(">40 µs</text>"),
            "the axis reaches the budget: {drawing}"
        );
    }
}
