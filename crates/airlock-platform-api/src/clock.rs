//! The one clock every process of a run stamps its records with (the
//! sidecar's egress records and events, the runtime's reports, the
//! platform's and the store's rows): Unix milliseconds.

/// Unix milliseconds now (0 before the epoch, `i64::MAX` past its range).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Unix microseconds now, as [`now_ms`]: the start of a traced step.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
