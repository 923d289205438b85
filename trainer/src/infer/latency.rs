//! Latency histograms of the engine's requests: time to the first token (from submission) and
//! between tokens, in Prometheus' cumulative-bucket form.

/// Upper bounds (seconds) of both histograms: decode steps take milliseconds, a queued prompt
/// seconds.
pub const BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// Counts of observations at or under each bound of [`BUCKETS`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub buckets: [u64; BUCKETS.len()],
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    pub fn observe(&mut self, seconds: f64) {
        for (b, le) in self.buckets.iter_mut().zip(BUCKETS) {
            if seconds <= le {
                *b += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }
}

/// Both histograms of one engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Latencies {
    /// Submission to first token (queueing and prefill included).
    pub first_token: Histogram,
    /// Between consecutive tokens of a request.
    pub inter_token: Histogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let mut h = Histogram::default();
        for s in [0.0005, 0.02, 0.02, 30.0, 100.0] {
            h.observe(s);
        }
        assert_eq!((h.buckets[0], h.buckets[4], h.buckets[13], h.count), (1, 3, 4, 5));
        assert!((h.sum - 130.0405).abs() < 1e-9);
    }
}
