//! A Unix time broken down in UTC, for the timestamps imgbuild and jitter
//! write (no time zone database: UTC only).

/// A Unix time broken down in UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UtcTime {
    pub year: i64,
    /// 1-12
    pub month: u32,
    pub day: u32,
    pub hour: u64,
    pub minute: u64,
    pub second: u64,
    /// 0 = Thursday (1970-01-01), as days since the epoch modulo 7.
    pub weekday_from_thursday: u32,
}

impl UtcTime {
    pub fn from_epoch(epoch: u64) -> UtcTime {
        let days = (epoch / 86_400) as i64;
        let secs = epoch % 86_400;
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        UtcTime {
            year: yoe + era * 400 + i64::from(month <= 2),
            month: month as u32,
            day: day as u32,
            hour: secs / 3600,
            minute: secs / 60 % 60,
            second: secs % 60,
            weekday_from_thursday: days.rem_euclid(7) as u32,
        }
    }
}

/// `2026-12-01T16:15:00Z` (RFC 3339, UTC) for a Unix time.
pub fn rfc3339(epoch: u64) -> String {
    let t = UtcTime::from_epoch(epoch);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_764_605_700), "2025-12-01T16:15:00Z");
        assert_eq!(UtcTime::from_epoch(1_764_460_800).weekday_from_thursday, 3);
    }
}
