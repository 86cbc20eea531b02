//! Requests per API key: a token bucket per key (`API_RATE_PER_SECOND`,
//! `API_RATE_BURST`). Hand-written: a map of two numbers per key under one
//! lock is all it takes, and it answers how long to wait (`Retry-After`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: f64,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            per_second: 100.0,
            burst: 200.0,
        }
    }
}

/// Failed authentications allowed per client address: 20 at once, then one
/// every two seconds. A key is 256 random bits, so this is not what stops a
/// guess; it stops a flood of failing requests each costing a key lookup.
pub const AUTH_FAILURES: RateLimit = RateLimit {
    per_second: 0.5,
    burst: 20.0,
};

pub struct Limiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

/// Keys kept before idle buckets (full again) are dropped.
const MAX_BUCKETS: usize = 100_000;

impl Limiter {
    pub fn new(limit: RateLimit) -> Self {
        Limiter {
            limit,
            buckets: Mutex::default(),
        }
    }

    /// Takes a token for `key`, or says how long until one is there.
    pub fn check(&self, key: &str) -> Result<(), Duration> {
        let now = Instant::now();
        let Ok(mut b) = self.buckets.lock() else {
            return Ok(());
        };
        if b.len() >= MAX_BUCKETS {
            let full = self.limit.burst / self.limit.per_second;
            b.retain(|_, (_, at)| now.duration_since(*at).as_secs_f64() < full);
        }
        let (tokens, at) = b.entry(key.to_owned()).or_insert((self.limit.burst, now));
        let refill = now.duration_since(*at).as_secs_f64() * self.limit.per_second;
        *tokens = (*tokens + refill).min(self.limit.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - *tokens) / self.limit.per_second,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let l = Limiter::new(RateLimit {
            per_second: 1.0,
            burst: 3.0,
        });
        for _ in 0..3 {
            assert!(l.check("k").is_ok());
        }
        let wait = l.check("k").unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
        // Another key has its own bucket.
        assert!(l.check("other").is_ok());
    }
}
