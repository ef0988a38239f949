//! The SVG plot of a jitter report: the per-core latency histograms against
//! the budget and, for a soak, the worst case of each minute measured.

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use rtreport::report::{CoreStats, MinuteMax, Report, Tool};

/// Image size without the soak timeline; the histogram panel keeps this size.
const HISTOGRAM_SIZE: (u32, u32) = (1000, 600);
/// Height of the soak timeline panel, added below the histograms.
const TIMELINE_HEIGHT: u32 = 300;
/// Above this span the timeline counts hours instead of minutes.
const HOURS_ABOVE_S: u64 = 3 * 3600;

/// Draws `report` as an SVG image: the per-core latency histograms (with the
/// timer IRQ's histogram when timerlat measured it) and the budget; below
/// them, when the report is a soak with per-minute worst cases, their
/// timeline against the budget.
pub fn svg(report: &Report) -> anyhow::Result<String> {
    let timeline = report
        .soak
        .as_ref()
        .map(|soak| soak.per_minute_max.as_slice())
        .filter(|minutes| !minutes.is_empty());
    let (width, height) = HISTOGRAM_SIZE;
    let height = height + timeline.map_or(0, |_| TIMELINE_HEIGHT);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        match timeline {
            Some(minutes) => {
                let (top, bottom) = root.split_vertically(HISTOGRAM_SIZE.1);
                histogram_panel(&top, report)?;
                timeline_panel(&bottom, report.run.budget_us, minutes)?;
            }
            None => histogram_panel(&root, report)?,
        }
        root.present().map_err(plot_error)?;
    }
    Ok(out)
}

/// Turns a plotters error into an [`anyhow::Error`] carrying its message.
fn plot_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the SVG plot: {error}")
}

/// The text of a budget line, in both panels.
fn budget_label(budget_us: u64) -> String {
    format!("budget {budget_us} us")
}

/// The legend names of a core's main histogram and of its IRQ histogram:
/// under timerlat the main one is the thread latency.
fn core_labels(core: &CoreStats, tool: Tool) -> (String, String) {
    let cpu = core.cpu.map_or("?".into(), |cpu| cpu.to_string());
    let main = match tool {
        Tool::Timerlat => format!("cpu {cpu} thread"),
        Tool::Cyclictest => format!("cpu {cpu}"),
    };
    (main, format!("cpu {cpu} irq"))
}

/// Every histogram of the report: each core's own and its IRQ latency's.
fn histograms(report: &Report) -> impl Iterator<Item = &[(u64, u64)]> {
    report.cores.iter().flat_map(|core| {
        std::iter::once(core.histogram.as_slice())
            .chain(core.irq.as_ref().map(|irq| irq.histogram.as_slice()))
    })
}

/// A histogram's points for the log-scale axis, which has no zero: an empty
/// bucket is drawn at 1 so a lone spike stays visible.
fn log_points(histogram: &[(u64, u64)]) -> Vec<(u64, u64)> {
    histogram
        .iter()
        .map(|&(latency, count)| (latency, count.max(1)))
        .collect()
}

/// Panel 1: the latency histogram of each core (x latency, y log count),
/// each IRQ histogram dashed in its core's colour, and the budget as a
/// vertical red line.
fn histogram_panel(area: &DrawingArea<SVGBackend, Shift>, report: &Report) -> anyhow::Result<()> {
    let budget = report.run.budget_us;
    let max_latency = histograms(report)
        .filter_map(|histogram| histogram.last().map(|bucket| bucket.0))
        .max()
        .unwrap_or(0)
        .max(budget)
        + 5;
    let max_count = histograms(report)
        .flat_map(|histogram| histogram.iter().map(|bucket| bucket.1))
        .max()
        .unwrap_or(1)
        .max(10);
    let title = format!(
        "Latency histogram: {} ({} s, {})",
        report.kernel.release, report.run.duration_s, report.assessment.verdict
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..max_latency, (1u64..max_count * 2).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("latency (us)")
        .y_desc("samples (log)")
        .draw()
        .map_err(plot_error)?;
    for (index, core) in report.cores.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let (main, irq_label) = core_labels(core, report.run.tool);
        chart
            .draw_series(LineSeries::new(
                log_points(&core.histogram),
                color.stroke_width(2),
            ))
            .map_err(plot_error)?
            .label(main)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        let Some(irq) = &core.irq else { continue };
        chart
            .draw_series(DashedLineSeries::new(
                log_points(&irq.histogram),
                6,
                4,
                color.stroke_width(1),
            ))
            .map_err(plot_error)?
            .label(irq_label)
            .legend(move |(x, y)| {
                DashedPathElement::new(vec![(x, y), (x + 20, y)], 6, 4, color.stroke_width(1))
            });
    }
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(budget, 1), (budget, max_count * 2)],
            RED.stroke_width(1),
        )))
        .map_err(plot_error)?
        .label(budget_label(budget))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    draw_legend(&mut chart)
}

/// The x unit of a timeline spanning `span_s` seconds: seconds per unit and
/// its name, minutes up to [`HOURS_ABOVE_S`], hours beyond.
fn time_unit(span_s: u64) -> (f64, &'static str) {
    if span_s > HOURS_ABOVE_S {
        (3600.0, "h")
    } else {
        (60.0, "min")
    }
}

/// Panel 2: the worst latency of each minute of a soak over the time
/// measured, as a line with points, and the budget as a horizontal red line.
fn timeline_panel(
    area: &DrawingArea<SVGBackend, Shift>,
    budget: u64,
    minutes: &[MinuteMax],
) -> anyhow::Result<()> {
    let span_s = minutes.iter().map(|minute| minute.end_s).max().unwrap_or(0);
    let (seconds_per_unit, unit) = time_unit(span_s);
    let x_max = (span_s as f64 / seconds_per_unit).max(1.0 / seconds_per_unit);
    let worst = minutes.iter().map(|minute| minute.max_us).max().unwrap_or(0);
    let y_max = worst.max(budget) as f64 * 1.1 + 1.0;
    let mut chart = ChartBuilder::on(area)
        .caption("Worst case per minute", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc(format!("measured time ({unit})"))
        .y_desc("worst case (us)")
        .x_label_formatter(&|x| tick_label(*x))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(plot_error)?;
    let points = minutes
        .iter()
        .map(|minute| (minute.end_s as f64 / seconds_per_unit, minute.max_us as f64));
    chart
        .draw_series(LineSeries::new(points, BLUE.stroke_width(2)).point_size(3))
        .map_err(plot_error)?
        .label("worst case of the minute")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    let budget_y = budget as f64;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(0.0, budget_y), (x_max, budget_y)],
            RED.stroke_width(1),
        )))
        .map_err(plot_error)?
        .label(budget_label(budget))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    draw_legend(&mut chart)
}

/// A time tick without float noise: `20`, `1.5`, not `20.0` or `0.30000000000000004`.
fn tick_label(value: f64) -> String {
    ((value * 100.0).round() / 100.0).to_string()
}

/// Draws a chart's legend, boxed over a translucent white background.
fn draw_legend<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
) -> anyhow::Result<()>
where
    X: Ranged,
    Y: Ranged,
{
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtreport::report::{Latency, Soak};

    fn fixture() -> Report {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jitter-report-2.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// The `height` attribute of the `<svg>` element.
    fn height(svg: &str) -> &str {
        let start = svg.find("height=\"").expect("an svg height") + "height=\"".len();
        let end = start + svg[start..].find('"').unwrap();
        &svg[start..end]
    }

    /// Whether the SVG has a text element reading exactly `text` (plotters
    /// writes each text on a line of its own).
    fn has_text(svg: &str, text: &str) -> bool {
        svg.contains(&format!(">\n{text}\n</text>"))
    }

    fn soak(report: &mut Report) {
        report.soak = Some(Soak {
            per_minute_max: vec![
                MinuteMax {
                    end_s: 60,
                    max_us: 40,
                },
                MinuteMax {
                    end_s: 120,
                    max_us: 55,
                },
                MinuteMax {
                    end_s: 180,
                    max_us: 120,
                },
            ],
            ..Default::default()
        });
    }

    #[test]
    fn without_a_soak_only_the_histograms_are_drawn() {
        let report = fixture();
        assert_eq!(report.run.budget_us, 100);
        let svg = svg(&report).unwrap();
        assert_eq!(svg.matches("budget 100 us").count(), 1, "{svg}");
        assert!(has_text(&svg, "cpu 0") && has_text(&svg, "cpu 1"), "{svg}");
        assert!(!svg.contains("Worst case per minute"), "{svg}");
        assert!(!svg.contains(" irq\n") && !svg.contains(" thread\n"), "{svg}");
        assert_eq!(height(&svg), "600");
    }

    #[test]
    fn a_soak_adds_the_per_minute_timeline() {
        let mut report = fixture();
        soak(&mut report);
        let svg = svg(&report).unwrap();
        assert!(svg.contains("Worst case per minute"), "{svg}");
        assert!(svg.contains("measured time (min)"), "{svg}");
        assert_eq!(svg.matches("budget 100 us").count(), 2, "{svg}");
        assert_eq!(height(&svg), "900");
    }

    #[test]
    fn an_empty_per_minute_series_draws_no_timeline() {
        let mut report = fixture();
        report.soak = Some(Soak::default());
        let svg = svg(&report).unwrap();
        assert!(!svg.contains("Worst case per minute"), "{svg}");
        assert_eq!(height(&svg), "600");
    }

    #[test]
    fn a_long_soak_counts_hours() {
        assert_eq!(time_unit(3 * 3600), (60.0, "min"));
        assert_eq!(time_unit(3 * 3600 + 60), (3600.0, "h"));
        let mut report = fixture();
        soak(&mut report);
        report.soak.as_mut().unwrap().per_minute_max[2].end_s = 5 * 3600;
        let svg = svg(&report).unwrap();
        assert!(svg.contains("measured time (h)"), "{svg}");
    }

    #[test]
    fn timerlat_draws_thread_and_irq_histograms() {
        let mut report = fixture();
        report.run.tool = Tool::Timerlat;
        let core = report.cores.iter_mut().find(|core| core.cpu == Some(1)).unwrap();
        core.irq = Some(Latency {
            samples: 9999,
            min_us: 2,
            avg_us: 4.0,
            max_us: 30,
            overflows: 0,
            histogram: vec![(2, 100), (4, 9000), (30, 1)],
        });
        let svg = svg(&report).unwrap();
        assert!(has_text(&svg, "cpu 1 irq"), "{svg}");
        assert!(has_text(&svg, "cpu 1 thread"), "{svg}");
        assert!(has_text(&svg, "cpu 0 thread"), "{svg}");
        assert!(!has_text(&svg, "cpu 0 irq"), "{svg}");
        assert_eq!(svg.matches("budget 100 us").count(), 1, "{svg}");
    }
}
