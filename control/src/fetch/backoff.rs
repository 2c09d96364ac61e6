//! When to fetch again (pure, given a random unit from [`jitter_unit`]).
//!
//! After a failure: exponential backoff with "equal jitter" — the n-th consecutive failure waits
//! a random time in `[c/2, c]` where `c = min(max, initial * 2^(n-1))`, so a flapping apiserver is
//! not hammered and many control planes do not retry in lock-step. After a success: the refresh
//! interval, ±10 %, for the same reason.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Exponential backoff bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling after the first failure.
    pub initial: Duration,
    /// The ceiling never grows past this.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The upper bound of the wait after `failures` consecutive failures (`0` is treated as 1).
    pub fn ceiling(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(30);
        self.initial
            .checked_mul(1u32 << exponent)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// The wait after `failures` consecutive failures; `unit` is a random number in `[0, 1]`.
    pub fn delay(&self, failures: u32, unit: f64) -> Duration {
        let ceiling = self.ceiling(failures);
        ceiling.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }
}

/// The wait before the next periodic refresh; `unit` is a random number in `[0, 1]`.
pub fn refresh_delay(interval: Duration, unit: f64) -> Duration {
    interval.mul_f64(0.9 + 0.2 * unit.clamp(0.0, 1.0))
}

/// A random number in `[0, 1)`, good enough for jitter (std's per-process random hash keys,
/// fresh for every call; no extra dependency).
pub fn jitter_unit() -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(0x5ce9_9a7e);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let b = Backoff::default();
        let secs: Vec<u64> = (0..=9).map(|n| b.ceiling(n).as_secs()).collect();
        assert_eq!(secs, vec![1, 1, 2, 4, 8, 16, 30, 30, 30, 30]);
        // No overflow however long an apiserver stays down.
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(30));
        let odd = Backoff {
            initial: Duration::from_millis(300),
            max: Duration::from_secs(5),
        };
        assert_eq!(odd.ceiling(3), Duration::from_millis(1200));
        assert_eq!(odd.ceiling(6), Duration::from_secs(5));
        let huge = Backoff {
            initial: Duration::from_secs(u64::MAX / 4),
            max: Duration::from_secs(60),
        };
        assert_eq!(huge.ceiling(40), Duration::from_secs(60));
    }

    #[test]
    fn delays_stay_within_half_ceiling_and_ceiling() {
        let b = Backoff::default();
        for failures in 1..40 {
            let ceiling = b.ceiling(failures);
            for unit in [0.0, 0.25, 0.5, 0.999, 1.0, -3.0, 7.0, jitter_unit()] {
                let d = b.delay(failures, unit);
                assert!(d >= ceiling / 2 && d <= ceiling, "{failures} {unit}: {d:?}");
                assert!(d >= Duration::from_millis(500) && d <= Duration::from_secs(30));
            }
        }
        assert_eq!(b.delay(1, 0.0), Duration::from_millis(500));
        assert_eq!(b.delay(10, 1.0), Duration::from_secs(30));
    }

    #[test]
    fn refresh_delay_is_the_interval_give_or_take_ten_percent() {
        let i = Duration::from_secs(30);
        assert_eq!(refresh_delay(i, 0.0), Duration::from_secs(27));
        assert_eq!(refresh_delay(i, 1.0), Duration::from_secs(33));
        assert_eq!(refresh_delay(i, 0.5), i);
    }

    #[test]
    fn jitter_is_a_unit_and_varies() {
        let draws: Vec<f64> = (0..64).map(|_| jitter_unit()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let first = draws[0];
        assert!(draws.iter().any(|u| *u != first), "{draws:?}");
    }
}
