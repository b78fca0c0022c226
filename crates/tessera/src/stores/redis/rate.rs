//! Rate limiters in the Redis store: [`crate::RateBackend`] as one `FCALL` (or `EVALSHA`) per
//! step (`scripts/rate_*.lua`, each behind `scripts/rate_prelude.lua`), on the server's `TIME`.
//!
//! Keys, under the same hash tag as a semaphore of the same name (one Cluster slot):
//! `{<prefix>:<name>}:rate` (a hash: limits and counters) and `{<prefix>:<name>}:rate:log`
//! (a sorted set: one member per admission, scored by the running total of cost). Both
//! expire when the state stops mattering (the last admission older than the longest period,
//! or in smooth mode the pacing caught up), plus one second.
//!
//! `rate_delete.lua` drops both keys.
//!
//! The acquire script decides exactly as `rate/engine.rs` does (one `ZRANGEBYSCORE … LIMIT
//! 0 1` per limit); the status script returns the state and the log, and the snapshot is
//! computed here with the shared engine.
//!
//! The commands these scripts call are part of the least-privilege ACL command list in the
//! module docs of the store (`+exists +zremrangebyrank +zremrangebyscore` among them), and
//! `+scan` lists limiters.

use async_trait::async_trait;
use redis::Value;

use super::ops::{corrupt, int, items, text, Op};
use super::RedisBackend;
use tessera_core::error::{Error, Result};
use tessera_core::model::{Name, StoreTime};
use tessera_core::rate::engine::{self, RateState, VecLog};
use tessera_core::rate::seam::RateStatus;
use tessera_core::seam::{RateBackend, RateConfig, RateReply, RateRequest};

/// The keys of one limiter, in the order of `rate_prelude.lua`.
pub(super) fn keys(prefix: &str, name: &Name) -> [String; 2] {
    [
        format!("{{{prefix}:{name}}}:rate"),
        format!("{{{prefix}:{name}}}:rate:log"),
    ]
}

fn nums(s: &str, what: &str) -> Result<Vec<u64>> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|v| {
            v.parse()
                .map_err(|_| Error::Corrupt(format!("rate {what} {s:?}")))
        })
        .collect()
}

/// `N,L,T` per limit, flat, as the scripts store them. `L` is the enforced window (period
/// plus margin, [`RateConfig::window_us`]): the scripts never see the period alone.
pub(super) fn limits_arg(config: &RateConfig) -> String {
    let intervals = engine::emission_intervals(config);
    config
        .limits()
        .iter()
        .zip(intervals)
        .map(|(l, t)| format!("{},{},{t}", l.count(), config.window_us(l)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The burst as the scripts take it: 0 in exact mode.
pub(super) fn burst_arg(config: &RateConfig) -> u32 {
    config.mode().burst()
}

/// The reply of `rate_acquire.lua`: `{admitted, at, now, reservation}`, `{limited,
/// retry_at, now}` or `{mismatch, stored config}`; anything else is [`Error::Corrupt`].
pub(crate) fn parse_acquire(v: Value, name: &Name, config: &RateConfig) -> Result<RateReply> {
    let shown = v.clone();
    let f = items(v, "rate acquire")?;
    let tag = f.first().map(|t| text(t, "rate acquire tag")).transpose()?;
    let at = |i: usize| -> Result<u64> {
        int(
            f.get(i).ok_or_else(|| corrupt("rate acquire", &shown))?,
            "rate acquire",
        )
    };
    match tag.as_deref() {
        Some("admitted") => Ok(RateReply::Admitted {
            at: StoreTime(at(1)?),
            now: StoreTime(at(2)?),
            reservation: at(3)?,
        }),
        Some("limited") => Ok(RateReply::Limited {
            retry_at: StoreTime(at(1)?),
            now: StoreTime(at(2)?),
        }),
        Some("mismatch") => Err(Error::RateMismatch {
            name: name.to_string(),
            stored: text(
                f.get(1).ok_or_else(|| corrupt("rate acquire", &shown))?,
                "cfg",
            )?,
            declared: config.encode(),
        }),
        _ => Err(corrupt("rate acquire", &shown)),
    }
}

/// The reply of `rate_status.lua`: `{none}`, or `{state, now, config, seq, tail, last,
/// prev_last, p, base, tat, prev_tat, log, expired}`, turned into a snapshot by the shared engine;
/// anything else (an unreadable config, log or counter) is [`Error::Corrupt`].
pub(crate) fn parse_status(v: Value, name: &Name) -> Result<Option<RateStatus>> {
    let shown = v.clone();
    let f = items(v, "rate status")?;
    match f
        .first()
        .map(|t| text(t, "rate status tag"))
        .transpose()?
        .as_deref()
    {
        Some("none") => return Ok(None),
        Some("state") if f.len() == 13 => {}
        _ => return Err(corrupt("rate status", &shown)),
    }
    let n = |i: usize| int(&f[i], "rate status");
    let state = RateState {
        config: text(&f[2], "rate status")?,
        seq: n(3)?,
        tail: n(4)?,
        last: n(5)?,
        prev_last: n(6)?,
        p: n(7)?,
        base: n(8)?,
        tat: nums(&text(&f[9], "tat")?, "tat")?,
        prev_tat: nums(&text(&f[10], "prev_tat")?, "prev_tat")?,
        kept_until: 0,
    };
    let now = StoreTime(n(1)?);
    let config = RateConfig::decode(&state.config).ok_or_else(|| {
        Error::Corrupt(format!(
            "rate limiter {name}: unreadable limits {:?}",
            state.config
        ))
    })?;
    let mut log = VecLog::default();
    for e in items(f[11].clone(), "rate log")? {
        let e = text(&e, "rate log entry")?;
        let parsed = e
            .split_once(':')
            .and_then(|(t, p)| Some((t.parse().ok()?, p.parse().ok()?)));
        log.0.push_back(
            parsed.ok_or_else(|| Error::Corrupt(format!("rate log entry {e:?} of {name}")))?,
        );
    }
    let mut status = engine::status(name, &state, &config, &log, now)?;
    status.expired_unused = Some(n(12)?);
    Ok(Some(status))
}

impl RedisBackend {
    async fn run_rate(&self, op: Op, name: &Name, args: &[String]) -> Result<Value> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.caller
            .call(op, &keys(&self.caller.prefix, name), &args)
            .await
    }
}

#[async_trait]
impl RateBackend for RedisBackend {
    async fn rate_acquire(
        &self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
    ) -> Result<RateReply> {
        let burst = burst_arg(config);
        let max_wait: i64 = match req.max_wait {
            None => -1,
            Some(w) => w.as_micros().min(i64::MAX as u128) as i64,
        };
        let v = self
            .run_rate(
                Op::RateAcquire,
                name,
                &[
                    config.encode(),
                    limits_arg(config),
                    burst.to_string(),
                    req.cost.to_string(),
                    max_wait.to_string(),
                    if req.update { "1" } else { "0" }.to_string(),
                ],
            )
            .await?;
        parse_acquire(v, name, config)
    }

    async fn rate_cancel(&self, name: &Name, reservation: u64, at: StoreTime) -> Result<bool> {
        let v = self
            .run_rate(
                Op::RateCancel,
                name,
                &[reservation.to_string(), at.0.to_string()],
            )
            .await?;
        Ok(int(&v, "rate cancel")? == 1)
    }

    async fn rate_status(&self, name: &Name) -> Result<Option<RateStatus>> {
        let v = self.run_rate(Op::RateStatus, name, &[]).await?;
        parse_status(v, name)
    }

    async fn rate_delete(&self, name: &Name) -> Result<bool> {
        let v = self.run_rate(Op::RateDelete, name, &[]).await?;
        Ok(int(&v, "rate delete")? == 1)
    }

    async fn rate_list(&self) -> Result<Vec<String>> {
        let pattern = format!("{{{}:*}}:rate", self.caller.prefix);
        let strip = format!("{{{}:", self.caller.prefix);
        self.caller
            .scan_names(&pattern, |k| {
                Name::new(k.strip_prefix(&strip)?.strip_suffix("}:rate")?).ok()
            })
            .await
    }
}
