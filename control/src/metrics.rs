//! The control plane's `/metrics`, through the `prometheus` crate: each component keeps its
//! counters as it needs them and lists them here as metric families when scraped
//! ([`Families`]); [`encode`] writes the Prometheus text format (0.0.4), which Envoy's
//! `/stats/prometheus` also speaks, so the filter's counters can follow in the same scrape
//! (`health`).

use prometheus::proto::MetricFamily;
use prometheus::{Encoder, GaugeVec, IntCounterVec, Opts, TextEncoder};

/// The metric families of one scrape, in the order they are added.
#[derive(Default)]
pub struct Families(Vec<MetricFamily>);

impl Families {
    pub fn new() -> Self {
        Self::default()
    }

    /// A counter without labels.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.counters(name, help, &[], [(Vec::<&str>::new(), value)]);
    }

    /// A counter with one sample per label values (`labels` names them). No sample, no family.
    pub fn counters<'a, L>(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        samples: impl IntoIterator<Item = (L, u64)>,
    ) where
        L: AsRef<[&'a str]>,
    {
        let Ok(vec) = IntCounterVec::new(Opts::new(name, help), labels) else {
            tracing::error!(name, "invalid counter");
            return;
        };
        for (values, value) in samples {
            if let Ok(counter) = vec.get_metric_with_label_values(values.as_ref()) {
                counter.inc_by(value);
            }
        }
        self.push(prometheus::core::Collector::collect(&vec));
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.gauges(name, help, &[], [(Vec::<&str>::new(), value)]);
    }

    /// A gauge with one sample per label values. No sample, no family.
    pub fn gauges<'a, L>(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        samples: impl IntoIterator<Item = (L, f64)>,
    ) where
        L: AsRef<[&'a str]>,
    {
        let Ok(vec) = GaugeVec::new(Opts::new(name, help), labels) else {
            tracing::error!(name, "invalid gauge");
            return;
        };
        for (values, value) in samples {
            if let Ok(gauge) = vec.get_metric_with_label_values(values.as_ref()) {
                gauge.set(value);
            }
        }
        self.push(prometheus::core::Collector::collect(&vec));
    }

    fn push(&mut self, families: Vec<MetricFamily>) {
        self.0.extend(
            families
                .into_iter()
                .filter(|family| !family.get_metric().is_empty()),
        );
    }

    pub fn extend(&mut self, other: Families) {
        self.0.extend(other.0);
    }

    pub fn into_inner(self) -> Vec<MetricFamily> {
        self.0
    }
}

/// The Prometheus text format of `families`.
pub fn encode(families: &Families) -> String {
    let mut out = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&families.0, &mut out) {
        tracing::error!(error = %e, "encoding metrics");
    }
    String::from_utf8(out).unwrap_or_default()
}

/// Seconds since the Unix epoch, with milliseconds.
pub fn unix_seconds(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_and_gauges_with_escaped_labels() {
        let mut f = Families::new();
        f.counter("a_total", "A.", 3);
        f.counters(
            "b_total",
            "B by reason.",
            &["reason"],
            [(["x"], 1), (["y \"q\"\nz"], 2)],
        );
        f.gauges("c", "C.", &["apiserver"], Vec::<([&str; 1], f64)>::new());
        f.gauge("d", "D.", 1.5);
        let text = encode(&f);
        for line in [
            "# TYPE a_total counter",
            "a_total 3",
            "b_total{reason=\"x\"} 1",
            "b_total{reason=\"y \\\"q\\\"\\nz\"} 2",
            "# TYPE d gauge",
            "d 1.5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("# TYPE c "), "no sample, no family:\n{text}");
    }
}
