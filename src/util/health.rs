//! The one way a part of the daemon reports its own health on /metrics (node_exporter's
//! Collector): each part's counters implement `Health`, the daemon registers them with the
//! exporter as it wires the parts together, and the exporter writes them in that order at every
//! scrape. The exporter knows no part's type, and no part depends on the exporter.

/// A part's own counters, written as exposition text (with `util::family::Family`).
pub trait Health {
    /// Appends this part's families to `out`, read as they are now.
    fn families(&self, out: &mut String);
}
