//! Wall-clock helpers: RFC 3339 timestamps (kube's `metav1.Time` format, whole seconds, UTC;
//! and `metav1.MicroTime`, microseconds) and kube's `HumanDuration` used for the `Age` column
//! of tables.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A clock that runs ahead of or behind the real one (`--lease-clock-offset`), to simulate an
/// apiserver whose host clock is skewed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offset {
    pub behind: bool,
    pub by: Duration,
}

impl Offset {
    /// `5m` (ahead), `+5m` (ahead), `-5m` (behind); the magnitude as `parse_duration` reads it.
    pub fn parse(
        s: &str,
        parse_duration: impl Fn(&str) -> Result<Duration, String>,
    ) -> Result<Offset, String> {
        let s = s.trim();
        let (behind, magnitude) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s.strip_prefix('+').unwrap_or(s)),
        };
        if magnitude.trim_end_matches(|c: char| c.is_ascii_alphabetic()) == "0" {
            return Ok(Offset::default());
        }
        Ok(Offset {
            behind,
            by: parse_duration(magnitude)?,
        })
    }

    /// What this clock reads when the real one reads `t`.
    pub fn apply(self, t: SystemTime) -> SystemTime {
        if self.behind {
            t.checked_sub(self.by).unwrap_or(UNIX_EPOCH)
        } else {
            t.checked_add(self.by).unwrap_or(t)
        }
    }
}

/// `2024-05-01T12:34:56Z` for `t`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `2024-05-01T12:34:56.123456Z` for `t` (kube's `MicroTime`, e.g. a Lease's `renewTime`).
pub fn rfc3339_micros(t: SystemTime) -> String {
    let micros = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_micros())
        .unwrap_or(0);
    let whole = rfc3339(t);
    format!("{}.{micros:06}Z", whole.trim_end_matches('Z'))
}

/// Parse `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`; `None` if it is not that.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || (b[10] != b'T' && b[10] != b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    if let Some(r) = rest.strip_prefix('.') {
        rest = r.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 => {
            let sign = match &rest[..1] {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            sign * (rest[1..3].parse::<i64>().ok()? * 3600 + rest[4..6].parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - offset;
    u64::try_from(secs)
        .ok()
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

/// kube's `duration.HumanDuration` (e.g. `5s`, `3m20s`, `2d4h`).
pub fn human_duration(d: Duration) -> String {
    let seconds = d.as_secs();
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let (dd, h) = (hours / 24, hours % 24);
        return if h == 0 {
            format!("{dd}d")
        } else {
            format!("{dd}d{h}h")
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    let years = hours / 24 / 365;
    if hours < 24 * 365 * 8 {
        let dy = hours / 24 % 365;
        return if dy == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{dy}d")
        };
    }
    format!("{years}y")
}

// Howard Hinnant's civil calendar algorithms.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        let t = UNIX_EPOCH + Duration::from_secs(1_714_566_896);
        assert_eq!(rfc3339(t), "2024-05-01T12:34:56Z");
        assert_eq!(parse_rfc3339("2024-05-01T12:34:56Z"), Some(t));
        assert_eq!(parse_rfc3339("2024-05-01T14:34:56.123+02:00"), Some(t));
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(parse_rfc3339("yesterday"), None);
        let micro = t + Duration::from_micros(123_456);
        assert_eq!(rfc3339_micros(micro), "2024-05-01T12:34:56.123456Z");
        assert_eq!(rfc3339_micros(t), "2024-05-01T12:34:56.000000Z");
        assert_eq!(
            parse_rfc3339("2024-05-01T12:34:56.123456Z"),
            Some(t),
            "whole seconds only"
        );
    }

    #[test]
    fn offsets() {
        let d = |s: &str| {
            s.trim_end_matches('m')
                .parse::<u64>()
                .map(|m| Duration::from_secs(m * 60))
                .map_err(|e| e.to_string())
        };
        let t = UNIX_EPOCH + Duration::from_secs(1_714_566_896);
        let five = Duration::from_secs(300);
        assert_eq!(Offset::parse("-5m", d).unwrap().apply(t), t - five);
        assert_eq!(Offset::parse("+5m", d).unwrap().apply(t), t + five);
        assert_eq!(Offset::parse("5m", d).unwrap().apply(t), t + five);
        assert_eq!(Offset::parse("0s", d).unwrap(), Offset::default());
        assert!(Offset::parse("-x", d).is_err());
    }

    #[test]
    fn human_durations_like_kube() {
        let s = Duration::from_secs;
        assert_eq!(human_duration(s(5)), "5s");
        assert_eq!(human_duration(s(119)), "119s");
        assert_eq!(human_duration(s(200)), "3m20s");
        assert_eq!(human_duration(s(600)), "10m");
        assert_eq!(human_duration(s(3 * 3600 + 60)), "3h1m");
        assert_eq!(human_duration(s(20 * 3600)), "20h");
        assert_eq!(human_duration(s(52 * 3600)), "2d4h");
        assert_eq!(human_duration(s(30 * 86_400)), "30d");
    }
}
