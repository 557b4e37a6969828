//! One metric family, written straight as exposition text. The families here are rebuilt from
//! the store at every encode (the node_exporter "const metrics" pattern), so nothing of them
//! needs to outlive the text: building `prometheus::proto` messages first cost two heap strings
//! and a message per label pair (about 2 KiB per process series at 1,024 processes), which left
//! the poller's and the aggregator's allocator arenas holding that peak for good. The text is
//! byte for byte what `prometheus::TextEncoder` writes for the same family
//! (outputs/prometheus/tests.rs checks it against the library on every family kind and escape).
//! It lives here, below every part that reports its health (`util::health`), so none of them
//! depends on the exporter.

use std::fmt::Write;

/// The family kinds gpumon writes (the text format's TYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// Labels added with Kubernetes support, left out of a series where they are empty (outside
/// Kubernetes): Prometheus reads an empty label as no label, and so the exposition outside
/// Kubernetes is what it was before they existed.
/// `container_name` (the kubelet's name for the container) is on `gpumon_process_info` only.
const OMITTED_WHEN_EMPTY: &[&str] = &["namespace", "pod", "container_name"];

/// Builds one metric family; label names are given once, values per series.
pub(crate) struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    omitted: &'static [&'static str],
    /// The series written so far, one line each.
    body: String,
}

impl Family {
    pub(crate) fn new(
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            help,
            kind,
            labels,
            omitted: OMITTED_WHEN_EMPTY,
            body: String::new(),
        }
    }

    /// Appends a family of one unlabelled series: most health counters are one number.
    pub fn single(
        name: &'static str,
        help: &'static str,
        kind: Kind,
        value: f64,
        out: &mut String,
    ) {
        let mut f = Self::new(name, help, kind, &[]);
        f.add(&[], value);
        f.finish(out);
    }

    /// Leaves out these labels, instead of the Kubernetes ones, where they are empty: for a
    /// family whose label was added later, so its series outside a container stay as they were.
    pub(crate) fn omitting_empty(mut self, labels: &'static [&'static str]) -> Self {
        self.omitted = labels;
        self
    }

    pub(crate) fn gauge(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Self::new(name, help, Kind::Gauge, labels)
    }

    pub(crate) fn add(&mut self, values: &[&str], value: f64) {
        let b = &mut self.body;
        b.push_str(self.name);
        let mut sep = '{';
        for (n, v) in self.labels.iter().zip(values) {
            if v.is_empty() && self.omitted.contains(n) {
                continue;
            }
            b.push(sep);
            b.push_str(n);
            b.push_str("=\"");
            escape_into(b, v, true);
            b.push('"');
            sep = ',';
        }
        if sep == ',' {
            b.push('}');
        }
        // f64's Display, as the library writes it: 1 for 1.0, NaN, inf.
        let _ = write!(b, " {value}");
        b.push('\n');
    }

    /// Appends the family to `out`: HELP, TYPE and its series. A family without series is left
    /// out (HELP and TYPE with no samples would say nothing).
    pub(crate) fn finish(self, out: &mut String) {
        if self.body.is_empty() {
            return;
        }
        if !self.help.is_empty() {
            out.push_str("# HELP ");
            out.push_str(self.name);
            out.push(' ');
            escape_into(out, self.help, false);
            out.push('\n');
        }
        out.push_str("# TYPE ");
        out.push_str(self.name);
        out.push_str(match self.kind {
            Kind::Counter => " counter\n",
            Kind::Gauge => " gauge\n",
        });
        out.push_str(&self.body);
    }
}

/// The text format's escapes: backslash and newline always, the double quote in label values.
fn escape_into(out: &mut String, v: &str, quote: bool) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}
