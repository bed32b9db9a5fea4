//! Small line charts as inline SVG, drawn on the server (maud): one `polyline` per series
//! with one point per bucket, all scaled to the largest value, which labels the top of the
//! axis. Nothing runs in the browser and nothing is styled inline (the CSP allows neither):
//! colours come from `/console.css`, by the series' name (`data-series`) or, for names it
//! does not know, by place (`s0` to `s7`). Each series also carries its values
//! (`data-values`) and their number (`data-points`), for tests and for people reading the
//! source; the `<title>` says what the chart shows, for screen readers and on hover.

use maud::{Markup, html};

/// Colours by place in `console.css` (`.s0` to `.s7`).
const PALETTE: usize = 8;
/// Room on the left for the labels, and around the plot.
const LEFT: f64 = 30.0;
const RIGHT: f64 = 3.0;
const TOP: f64 = 5.0;
const BOTTOM: f64 = 5.0;

/// Where the values of a chart are drawn.
struct Plot {
    width: f64,
    height: f64,
    /// Points per series, at most.
    points: usize,
    /// The largest value, never below 1 (all zeros draw on the axis).
    scale: f64,
}

impl Plot {
    fn x(&self, i: usize) -> f64 {
        let steps = self.points.saturating_sub(1).max(1) as f64;
        LEFT + (self.width - LEFT - RIGHT) * i as f64 / steps
    }

    fn y(&self, value: u64) -> f64 {
        self.bottom() - (self.height - TOP - BOTTOM) * value as f64 / self.scale
    }

    fn bottom(&self) -> f64 {
        self.height - BOTTOM
    }

    /// A `polyline`'s `points`: `x,y` per value, one decimal.
    fn points(&self, values: &[u64]) -> String {
        let pairs: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", self.x(i), self.y(*v)))
            .collect();
        pairs.join(" ")
    }
}

/// A line chart, `width` × `height` pixels, of `series`: each a name and one count per
/// bucket, oldest first. `title` says what it shows; the `<title>` adds each series' total.
pub fn sparkline(title: &str, series: &[(&str, &[u64])], width: u32, height: u32) -> Markup {
    let points = series.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .max()
        .unwrap_or(0);
    let plot = Plot {
        width: f64::from(width),
        height: f64::from(height),
        points,
        scale: max.max(1) as f64,
    };
    let totals: Vec<String> = series
        .iter()
        .map(|(name, v)| format!("{name} {}", v.iter().sum::<u64>()))
        .collect();
    let label_x = format!("{:.1}", LEFT - 4.0);
    html! {
        svg.chart role="img" width=(width) height=(height) viewBox=(format!("0 0 {width} {height}"))
            data-points=(points) data-max=(max) {
            title {
                (title)
                @if !totals.is_empty() { ": " (totals.join(", ")) }
                " (peak " (max) ")"
            }
            line.axis x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(plot.bottom()) {}
            line.axis x1=(LEFT) y1=(plot.bottom()) x2=(plot.width - RIGHT) y2=(plot.bottom()) {}
            text.label.max x=(label_x) y=(TOP + 8.0) text-anchor="end" { (max) }
            text.label x=(label_x) y=(plot.bottom()) text-anchor="end" { "0" }
            @for (i, (name, values)) in series.iter().enumerate() {
                polyline class=(format!("series s{}", i % PALETTE)) data-series=(name)
                    data-points=(values.len()) data-values=(csv(values)) points=(plot.points(values)) {
                    title { (name) ": " (values.iter().sum::<u64>()) ", latest " (values.last().copied().unwrap_or(0)) }
                }
            }
        }
    }
}

/// A legend for the series of a [`sparkline`]: a swatch of each colour, the name and the
/// series' total.
pub fn legend(series: &[(&str, &[u64])]) -> Markup {
    html! {
        ul.legend {
            @for (i, (name, values)) in series.iter().enumerate() {
                li data-series=(name) {
                    span class=(format!("swatch s{}", i % PALETTE)) data-series=(name) {}
                    (name) " " span.muted { (values.iter().sum::<u64>()) }
                }
            }
        }
    }
}

/// `1,0,3`: the values of a series as one attribute.
fn csv(values: &[u64]) -> String {
    let values: Vec<String> = values.iter().map(u64::to_string).collect();
    values.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of attribute `name` in the first tag of `html` that has one after `from`.
    fn attr<'h>(html: &'h str, from: &str, name: &str) -> &'h str {
        let start = html
            .find(from)
            .unwrap_or_else(|| panic!("no {from} in {html}"));
        let rest = &html[start..];
        let key = format!(" {name}=\"");
        let at = rest
            .find(&key)
            .unwrap_or_else(|| panic!("no {name} after {from}"))
            + key.len();
        let end = rest[at..].find('"').expect("closing quote");
        &rest[at..at + end]
    }

    /// The (x, y) points of the series `name`.
    fn points(html: &str, name: &str) -> Vec<(f64, f64)> {
        attr(html, &format!("data-series=\"{name}\""), "points")
            .split(' ')
            .map(|pair| {
                let (x, y) = pair.split_once(',').expect("x,y");
                (x.parse().expect("x"), y.parse().expect("y"))
            })
            .collect()
    }

    #[test]
    fn one_point_per_bucket_per_series() {
        let acked: Vec<u64> = (0..60).collect();
        let retried = [0u64; 60];
        let html = sparkline(
            "Deliveries",
            &[("acked", &acked[..]), ("retried", &retried[..])],
            300,
            80,
        )
        .into_string();
        assert_eq!(html.matches("<polyline").count(), 2);
        assert_eq!(points(&html, "acked").len(), 60);
        assert_eq!(points(&html, "retried").len(), 60);
        assert_eq!(attr(&html, "<svg", "data-points"), "60");
        assert_eq!(attr(&html, "data-series=\"acked\"", "data-points"), "60");
        assert_eq!(
            attr(&html, "data-series=\"retried\"", "data-values"),
            vec!["0"; 60].join(",")
        );
        assert!(html.contains("class=\"series s0\""), "{html}");
        assert!(html.contains("class=\"series s1\""), "{html}");
        assert!(
            html.contains("<title>Deliveries: acked 1770, retried 0 (peak 59)</title>"),
            "{html}"
        );
    }

    #[test]
    fn values_scale_to_the_largest_and_it_labels_the_axis() {
        let html = sparkline(
            "Dead letters",
            &[("a", &[0, 5, 10][..]), ("b", &[2][..])],
            130,
            50,
        )
        .into_string();
        let a = points(&html, "a");
        // x from LEFT to width - RIGHT; y from the bottom (0) to the top (the max).
        assert_eq!(a, vec![(30.0, 45.0), (78.5, 25.0), (127.0, 5.0)]);
        assert_eq!(points(&html, "b"), vec![(30.0, 37.0)]);
        assert_eq!(attr(&html, "<svg", "data-max"), "10");
        assert!(
            html.contains(">10</text>"),
            "the max labels the axis: {html}"
        );
        assert!(html.contains(">0</text>"), "{html}");
        assert_eq!(attr(&html, "<svg", "viewBox"), "0 0 130 50");
    }

    #[test]
    fn all_zero_series_sit_on_the_axis() {
        let zeros = [0u64; 24];
        let html = sparkline("Nothing", &[("dead-letters", &zeros[..])], 150, 32).into_string();
        assert!(!html.contains("NaN") && !html.contains("inf"), "{html}");
        let ys: Vec<f64> = points(&html, "dead-letters").iter().map(|p| p.1).collect();
        assert_eq!(ys, vec![27.0; 24]);
        assert_eq!(attr(&html, "<svg", "data-max"), "0");
        assert!(html.contains("(peak 0)"), "{html}");
    }

    #[test]
    fn no_series_and_single_points_draw_without_panics() {
        let html = sparkline("Empty", &[], 100, 30).into_string();
        assert_eq!(attr(&html, "<svg", "data-points"), "0");
        assert!(!html.contains("<polyline"));
        let html = sparkline("One", &[("x", &[7][..])], 100, 30).into_string();
        assert_eq!(points(&html, "x"), vec![(30.0, 5.0)]);
    }

    #[test]
    fn names_are_escaped_and_the_legend_totals_each_series() {
        let html = sparkline("<b>t</b>", &[("<i>", &[1, 2][..])], 100, 30).into_string();
        assert!(!html.contains("<b>") && !html.contains("<i>"), "{html}");
        let legend = legend(&[("acked", &[1, 2, 3][..]), ("retried", &[4][..])]).into_string();
        assert!(legend.contains("<li data-series=\"acked\">"), "{legend}");
        assert!(
            legend.contains("<span class=\"muted\">6</span>"),
            "{legend}"
        );
        assert!(legend.contains("class=\"swatch s1\""), "{legend}");
    }
}
