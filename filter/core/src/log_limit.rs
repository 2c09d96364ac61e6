//! At most one log line per window, with a count of the lines left out.
//!
//! During a long peer outage every peer-bound request becomes a mapped 503; one info line each
//! would flood Envoy's log. Each worker VM keeps one [`LogLimit`] per kind of line; the clock
//! comes from the host, so this stays pure.

use std::time::Duration;

/// One line per this many seconds, per worker.
pub const WINDOW: Duration = Duration::from_secs(10);

/// The state of one rate-limited log line. `Copy`, so the shell can keep it in a `Cell`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogLimit {
    /// When the last line was written (time since the Unix epoch).
    last: Option<Duration>,
    /// Lines left out since then.
    suppressed: u64,
}

impl LogLimit {
    /// A line is due at `now` (time since the Unix epoch): `Some(n)` to write it, `n` being the
    /// number of lines left out before it; `None` to leave it out (it is counted).
    pub fn admit(&mut self, now: Duration) -> Option<u64> {
        let due = match self.last {
            None => true,
            // A clock that went backwards must not silence the line until it catches up.
            Some(last) => now
                .checked_sub(last)
                .is_none_or(|elapsed| elapsed >= WINDOW),
        };
        if due {
            self.last = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed = self.suppressed.saturating_add(1);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn one_line_per_window_with_the_count_left_out() {
        let s = Duration::from_secs;
        let mut limit = LogLimit::default();
        // (now, expected)
        let cases = [
            (s(1000), Some(0)),
            (s(1000), None),
            (s(1005), None),
            (s(1009), None),
            (s(1010), Some(3)),
            (s(1011), None),
            (s(1100), Some(1)),
            (s(1100), None),
            // The clock went backwards: write, and start over from there.
            (s(50), Some(1)),
            (s(55), None),
            (s(60), Some(1)),
        ];
        for (i, (now, want)) in cases.into_iter().enumerate() {
            assert_eq!(limit.admit(now), want, "case {i} at {now:?}");
        }
    }
}
