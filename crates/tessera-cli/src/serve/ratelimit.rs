//! The `RateLimit-Policy` and `RateLimit` fields of draft-ietf-httpapi-ratelimit-headers on
//! every rate decision (`/v1/rates/{name}/acquire` and `/try`, `/v1/admissions/{name}/acquire`),
//! beside `Retry-After`, so that clients and proxies that know the draft understand tessera's
//! answers without a client library.
//!
//! One named policy per limit, named as the limit is written (`"50/s"`):
//!
//! ```text
//! RateLimit-Policy: "50/s";q=50;w=1, "1000/min";q=1000;w=60
//! RateLimit: "50/s";r=12;t=0, "1000/min";r=0;t=17
//! ```
//!
//! `q` is the limit's count and `w` its period in seconds (left out for a period that is not
//! a whole number of seconds, which `w` cannot say). `r` is what the limit has left right
//! after the decision (its count less what it counts in its window, reservations included)
//! and `t` the seconds, rounded up, until it admits one more (0 while `r` is above 0).
//!
//! An admitted answer carries `RateLimit-Policy` alone: the call it admits is due at once
//! (within the margin), and `RateLimit` would need a snapshot of the limiter, one more store
//! call before the answer leaves. A refusal (`limited`, `not_admitted`, a try not admitted)
//! carries both, `RateLimit` from a snapshot read right after the decision (it may already
//! count requests decided in between); a snapshot that cannot be read leaves it out.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use tessera::{RateLimiter, RateStatus};

static POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static LIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// `RateLimit-Policy` for `limiter`'s limits (no store call): for an admitted answer.
pub fn policy(limiter: &RateLimiter) -> HeaderMap {
    let items: Vec<String> = limiter
        .config()
        .limits()
        .iter()
        .map(|l| {
            let (id, q, period) = (format!("\"{l}\""), l.count(), l.period());
            match period.subsec_nanos() == 0 {
                true => format!("{id};q={q};w={}", period.as_secs()),
                false => format!("{id};q={q}"),
            }
        })
        .collect();
    let mut fields = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&items.join(", ")) {
        fields.insert(POLICY.clone(), v);
    }
    fields
}

/// Both fields for `limiter`, `RateLimit` from a snapshot read now (left out if it cannot
/// be read): for a refusal.
pub async fn fields(limiter: &RateLimiter) -> HeaderMap {
    let mut fields = policy(limiter);
    match limiter.status().await {
        Ok(status) => fields.extend(limit(&status)),
        Err(e) => {
            tracing::debug!(name = %limiter.name(), error = %e, "no RateLimit field: the snapshot failed");
        }
    }
    fields
}

/// `RateLimit` from a snapshot.
pub fn limit(status: &RateStatus) -> HeaderMap {
    let mut limit = Vec::new();
    for l in &status.limits {
        let id = format!("\"{}\"", l.limit);
        let q = l.limit.count();
        let r = u64::from(q).saturating_sub(l.used + l.reserved);
        let wait = l.next_free.since(status.now);
        let t = match r {
            0 => wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
            _ => 0,
        };
        limit.push(format!("{id};r={r};t={t}"));
    }
    let mut fields = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&limit.join(", ")) {
        fields.insert(LIMIT.clone(), v);
    }
    fields
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tessera::{LimitUsage, RateMode, StoreTime};

    use super::*;

    fn usage(spec: &str, used: u64, reserved: u64, next_free: u64) -> LimitUsage {
        LimitUsage {
            limit: spec.parse().unwrap(),
            used,
            reserved,
            next_free: StoreTime(next_free),
        }
    }

    #[test]
    fn one_item_per_limit_with_what_is_left_and_when_one_more_frees() {
        let now = 1_000_000_000;
        let status = RateStatus {
            name: "sms".into(),
            mode: RateMode::Exact,
            limits: vec![
                usage("50/s", 38, 0, now),
                usage("1000/min", 999, 1, now + 16_200_000),
                usage("5/250ms", 2, 1, now),
            ],
            margin: Duration::from_millis(20),
            last_admit: StoreTime(now),
            next_free: StoreTime(now + 16_200_000),
            now: StoreTime(now),
            expired_unused: None,
        };
        let h = limit(&status);
        assert_eq!(
            h["ratelimit"],
            "\"50/s\";r=12;t=0, \"1000/min\";r=0;t=17, \"5/250ms\";r=2;t=0"
        );
    }
}
