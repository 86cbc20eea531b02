//! The sidecar's clock: the time every record it writes carries.

/// Unix milliseconds now (0 before the epoch, `i64::MAX` past its range).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
