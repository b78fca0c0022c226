//! The rate-limiter step shared by the SQL stores that run it on the client (SQLite, MySQL),
//! written once over [`RateRows`]. PostgreSQL runs the same step on the server, as one
//! PL/pgSQL function per operation (`stores/postgres/sql/rate_*.sql`), and uses only the
//! value helpers here.
//!
//! The decisions are the pure functions of `rate/engine.rs` (the memory store's too); this
//! module reads and writes their state through one store's statements. A step, inside one
//! transaction that the store opens and commits:
//!
//! 1. **lock and load** ([`RateRows::load`]): lock the limiter's row, read the store's clock
//!    once the lock is held, and read the row;
//! 2. **sweep** up to 16 other limiters whose state expired ([`RateRows::expired`]), and their
//!    logs, so idle limiters leave the database; an expired state of this limiter is dropped
//!    too and reads as "no state";
//! 3. **prune** (exact mode) log entries older than the longest window, moving `base` to the
//!    running total of the last one deleted;
//! 4. look up the binding entry of each limit with one index seek on `(name, p)`, **decide**,
//!    and write the row and at most one log entry. A limited request writes nothing but what
//!    pruning or an `update` of the limits changed.
//!
//! The store's statements stay in its own `rate.rs`; values cross [`RateRows`] as the
//! database's integers and text and are checked here ([`Error::Corrupt`] for a wrong one).

use std::future::Future;

use crate::error::{Error, Result};
use crate::model::{Name, StoreTime};
use crate::rate::engine::{self, RateState, VecLog};
use crate::rate::seam::RateStatus;
use crate::rate::spec::RateMode;
use crate::seam::{RateConfig, RateReply, RateRequest};

/// A limiter's stored row, as [`RateRows::load`] read it.
#[derive(Debug, Clone)]
pub struct RateRow {
    pub state: RateState,
    /// When the state stops mattering (µs, store time).
    pub expires_at: u64,
}

impl RateRow {
    /// A limiter's row from the columns of the stores' load statements, in their order
    /// (config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at), read
    /// through the store's own readers: `text(i)`, and `int(i, column name)` for the
    /// non-negative integers.
    pub fn from_columns(
        text: impl Fn(usize) -> Result<String>,
        int: impl Fn(usize, &str) -> Result<u64>,
    ) -> Result<RateRow> {
        let state = RateState {
            config: text(0)?,
            seq: int(1, "seq")?,
            tail: int(2, "tail")?,
            last: int(3, "last")?,
            prev_last: int(4, "prev_last")?,
            p: int(5, "p")?,
            base: int(6, "base")?,
            tat: decode_tat(&text(7)?)?,
            prev_tat: decode_tat(&text(8)?)?,
            kept_until: int(9, "expires_at")?,
        };
        Ok(RateRow {
            expires_at: state.kept_until,
            state,
        })
    }
}

/// The row operations of one rate limiter inside one transaction, in one store's SQL.
///
/// A value is bound to one limiter name and one open transaction; every statement is about
/// that name, except [`RateRows::expired`] and [`RateRows::drop_state`], which sweep others.
/// The transaction holds the limiter's row lock from [`RateRows::load`] until the caller
/// commits, so this limiter's row and log change only through it.
pub trait RateRows: Send {
    /// Locks the limiter's row (creating a placeholder that reads as "no state" where the
    /// store locks with `SELECT … FOR UPDATE`), then reads the store's time — after the
    /// lock, never the client's clock where the store has one of its own — and the row.
    fn load(&mut self) -> impl Future<Output = Result<(StoreTime, Option<RateRow>)>> + Send;
    /// Up to 16 names of limiters whose state expired by `now` and that this transaction
    /// may delete (not locked by another step).
    fn expired(&mut self, now: StoreTime) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// Deletes the log and the row of limiter `name`.
    fn drop_state(&mut self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Writes the limiter's row (insert or update).
    fn save(
        &mut self,
        state: &RateState,
        expires_at: u64,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Deletes the log entries with `t <= cutoff`; returns the largest `p` deleted.
    fn prune(&mut self, cutoff: u64) -> impl Future<Output = Result<Option<i64>>> + Send;
    /// `t` of the entry with the smallest `p >= p`.
    fn first_at_least(&mut self, p: u64) -> impl Future<Output = Result<Option<i64>>> + Send;
    /// Adds the log entry `(p, t)`.
    fn append(&mut self, p: u64, t: u64) -> impl Future<Output = Result<()>> + Send;
    /// Deletes the log entry with running total `p`.
    fn remove_entry(&mut self, p: u64) -> impl Future<Output = Result<()>> + Send;
    /// The largest `p` in the log.
    fn last_total(&mut self) -> impl Future<Output = Result<Option<i64>>> + Send;
    /// The whole log as `(t, p)`, ascending.
    fn whole_log(&mut self) -> impl Future<Output = Result<Vec<(i64, i64)>>> + Send;
    /// Adds one to the row's count of admissions given back past their use-by instant and
    /// keeps the row until at least `until` (nothing without a row).
    fn count_expired(&mut self, until: u64) -> impl Future<Output = Result<()>> + Send;
    /// The row's count of admissions given back past their use-by instant (0 without a row).
    fn expired_unused(&mut self) -> impl Future<Output = Result<u64>> + Send;
    /// Deletes the rows and logs of the tenants' own limiters of limiter `name` (the keys
    /// [`tenant_key`] makes of it: [`TENANT_KEYS`]).
    fn drop_tenant_limiters(&mut self, name: &str) -> impl Future<Output = Result<()>> + Send;
}

/// The rows of an admission's step, which also reach the tenants' own limiters under window
/// ceilings (`docs/fair-shares.md`, "A ceiling on a share of the windows"): the rate
/// statements are pointed at one limiter or the other.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub trait TenantLimiterRows: SettleRows {
    /// Points the rate statements at limiter `key` (a [`tenant_key`]); `None`: back at the
    /// name's own limiter.
    fn point_at(&mut self, key: Option<String>);
}

/// A tenant's own limiter under a window ceiling is a limiter of its own in the same tables
/// (`tessera_rate_limiters`, `tessera_rate_log`), under the key `name`, U+001F, `tenant`.
/// No name holds U+001F (`Name::new`), so the key is no name's and no other pair's, the
/// name's own limiter and its statements stay as they are, and the tenant's state is swept
/// when expired as any limiter's is. Its keys sort between `name` U+001F and `name` U+0020
/// ([`TENANT_KEYS`]), also where trailing spaces are ignored by the comparison (MySQL's
/// `PAD SPACE` collations: U+001F sorts below the pad).
pub const TENANT_KEY_SEPARATOR: char = '\u{1f}';

/// The key of `tenant`'s own limiter on `name` (see [`TENANT_KEY_SEPARATOR`]).
pub fn tenant_key(name: &str, tenant: &str) -> String {
    format!("{name}{TENANT_KEY_SEPARATOR}{tenant}")
}

/// Whether a stored limiter key is a tenant's own limiter (left out of the list of
/// limiters).
pub fn is_tenant_key(key: &str) -> bool {
    key.contains(TENANT_KEY_SEPARATOR)
}

/// The bounds `[lo, hi)` of the keys of `name`'s tenants' own limiters.
pub fn tenant_keys_of(name: &str) -> (String, String) {
    (format!("{name}\u{1f}"), format!("{name}\u{20}"))
}

/// The log reads and writes of a settle (`engine::settle`), on the rows of an admission's
/// step (the semaphore's transaction): only that step settles.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub trait SettleRows: RateRows {
    /// `(t, p)` of the last entry at or before `t`.
    fn last_at_or_before(
        &mut self,
        t: u64,
    ) -> impl Future<Output = Result<Option<(i64, i64)>>> + Send;
    /// The largest `p` of the entries before `t`.
    fn total_before(&mut self, t: u64) -> impl Future<Output = Result<Option<i64>>> + Send;
    /// Runs [`LOWER`]: the entries at `t` become one entry of running total `keep` (none when
    /// `None`) and every later entry's total moves down by `d`.
    fn lower(
        &mut self,
        t: u64,
        d: u64,
        keep: Option<u64>,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// A settle's give-back, in statements every dialect with `?` placeholders writes alike,
/// bound as `(name, t)`, `(d, name, t)`, `(name)`: the block at `t` deleted, the later
/// entries moved down by `d` through negative totals (the primary key `(name, p)` is checked
/// row by row, so a total moved in place could meet one not yet moved; negative totals meet
/// none), then made positive again. The block's one entry is appended afterwards.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub const LOWER: [&str; 3] = [
    "DELETE FROM tessera_rate_log WHERE name = ? AND t = ?",
    "UPDATE tessera_rate_log SET p = ? - p WHERE name = ? AND t > ?",
    "UPDATE tessera_rate_log SET p = -p WHERE name = ? AND p < 0",
];
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub const LAST_AT_OR_BEFORE: &str =
    "SELECT t, p FROM tessera_rate_log WHERE name = ? AND t <= ? ORDER BY t DESC, p DESC LIMIT 1";
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub const TOTAL_BEFORE: &str = "SELECT MAX(p) FROM tessera_rate_log WHERE name = ? AND t < ?";

/// The tenants' own limiters of a name: bound as `(lo, hi)` of [`tenant_keys_of`].
pub const TENANT_KEYS: [&str; 2] = [
    "DELETE FROM tessera_rate_log WHERE name >= ? AND name < ?",
    "DELETE FROM tessera_rate_limiters WHERE name >= ? AND name < ?",
];

/// The log statements every SQL dialect with `?` placeholders (SQLite, MySQL) writes alike;
/// the limiter's name is always the first value bound.
pub const DROP_LIMITER: &str = "DELETE FROM tessera_rate_limiters WHERE name = ?";
pub const DROP_LOG: &str = "DELETE FROM tessera_rate_log WHERE name = ?";
pub const FIRST_AT_LEAST: &str =
    "SELECT t FROM tessera_rate_log WHERE name = ? AND p >= ? ORDER BY p LIMIT 1";
pub const APPEND: &str = "INSERT INTO tessera_rate_log (name, p, t) VALUES (?, ?, ?)";
pub const REMOVE_ENTRY: &str = "DELETE FROM tessera_rate_log WHERE name = ? AND p = ?";
pub const LAST_TOTAL: &str = "SELECT MAX(p) FROM tessera_rate_log WHERE name = ?";
/// Bound as `(until, until, name)`.
pub const COUNT_EXPIRED: &str = "UPDATE tessera_rate_limiters SET expired = expired + 1, \
     expires_at = CASE WHEN expires_at < ? THEN ? ELSE expires_at END WHERE name = ?";
pub const EXPIRED_UNUSED: &str = "SELECT expired FROM tessera_rate_limiters WHERE name = ?";

/// The [`RateRows`] methods whose statements are the same in every dialect (see
/// [`DROP_LIMITER`] and the others), written once and expanded inside a store's
/// `impl RateRows` for its own sqlx connection type (sqlx's executor bounds differ per
/// database, so a generic impl would say more than these). Exported at the crate root as
/// `tessera_core::shared_rate_rows!`, the only place a `macro_export` macro can live. The store's value has fields
/// `conn` (`&mut` its connection) and `name` (`&str`), and the store module has `map_err`.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
#[macro_export]
#[doc(hidden)]
macro_rules! shared_rate_rows {
    () => {
        async fn drop_state(&mut self, name: &str) -> $crate::error::Result<()> {
            use $crate::stores::sql::rate::{DROP_LIMITER, DROP_LOG};
            for q in [DROP_LOG, DROP_LIMITER] {
                sqlx::query(q)
                    .bind(name)
                    .execute(&mut *self.conn)
                    .await
                    .map_err(map_err)?;
            }
            Ok(())
        }

        async fn first_at_least(&mut self, p: u64) -> $crate::error::Result<Option<i64>> {
            sqlx::query_scalar($crate::stores::sql::rate::FIRST_AT_LEAST)
                .bind(self.name)
                .bind($crate::stores::sql::rate::db(p))
                .fetch_optional(&mut *self.conn)
                .await
                .map_err(map_err)
        }

        async fn append(&mut self, p: u64, t: u64) -> $crate::error::Result<()> {
            use $crate::stores::sql::rate::db;
            sqlx::query($crate::stores::sql::rate::APPEND)
                .bind(self.name)
                .bind(db(p))
                .bind(db(t))
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
            Ok(())
        }

        async fn remove_entry(&mut self, p: u64) -> $crate::error::Result<()> {
            sqlx::query($crate::stores::sql::rate::REMOVE_ENTRY)
                .bind(self.name)
                .bind($crate::stores::sql::rate::db(p))
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
            Ok(())
        }

        async fn last_total(&mut self) -> $crate::error::Result<Option<i64>> {
            sqlx::query_scalar($crate::stores::sql::rate::LAST_TOTAL)
                .bind(self.name)
                .fetch_one(&mut *self.conn)
                .await
                .map_err(map_err)
        }

        async fn count_expired(&mut self, until: u64) -> $crate::error::Result<()> {
            let until = $crate::stores::sql::rate::db(until);
            sqlx::query($crate::stores::sql::rate::COUNT_EXPIRED)
                .bind(until)
                .bind(until)
                .bind(self.name)
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
            Ok(())
        }

        async fn drop_tenant_limiters(&mut self, name: &str) -> $crate::error::Result<()> {
            let (lo, hi) = $crate::stores::sql::rate::tenant_keys_of(name);
            for q in $crate::stores::sql::rate::TENANT_KEYS {
                sqlx::query(q)
                    .bind(&lo)
                    .bind(&hi)
                    .execute(&mut *self.conn)
                    .await
                    .map_err(map_err)?;
            }
            Ok(())
        }

        async fn expired_unused(&mut self) -> $crate::error::Result<u64> {
            let n: Option<i64> = sqlx::query_scalar($crate::stores::sql::rate::EXPIRED_UNUSED)
                .bind(self.name)
                .fetch_optional(&mut *self.conn)
                .await
                .map_err(map_err)?;
            $crate::stores::sql::rate::non_negative(n.unwrap_or(0), "expired count")
        }
    };
}

pub fn corrupt(msg: impl Into<String>) -> Error {
    Error::Corrupt(msg.into())
}

/// A stored integer that must not be negative.
pub fn non_negative(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| corrupt(format!("rate {what} = {v} is negative")))
}

/// A time or total as the database's signed integer.
pub fn db(v: u64) -> i64 {
    // Times and totals stay far below 2^63 (µs since the epoch; running totals of costs).
    v.min(i64::MAX as u64) as i64
}

pub fn encode_tat(tat: &[u64]) -> String {
    tat.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

pub fn decode_tat(s: &str) -> Result<Vec<u64>> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|v| v.parse().map_err(|_| corrupt(format!("rate tat {s:?}"))))
        .collect()
}

/// The state's limits, decoded ([`Error::Corrupt`] if unreadable).
pub(crate) fn stored_config(name: &Name, state: &RateState) -> Result<RateConfig> {
    RateConfig::decode(&state.config).ok_or_else(|| {
        corrupt(format!(
            "rate limiter {name}: unreadable limits {:?}",
            state.config
        ))
    })
}

/// Locks the row, sweeps a few expired limiters, and returns the store's time with the
/// state, if it has one that has not expired (an expired one is deleted). `key`: the
/// limiter's key in the tables (the name, or a tenant's key, [`tenant_key`]).
async fn load<R: RateRows>(rows: &mut R, key: &str) -> Result<(StoreTime, Option<RateState>)> {
    let (now, row) = rows.load().await?;
    for n in rows.expired(now).await? {
        rows.drop_state(&n).await?;
    }
    match row {
        Some(row) if row.expires_at > now.0 => Ok((now, Some(row.state))),
        Some(_) => {
            rows.drop_state(key).await?;
            Ok((now, None))
        }
        None => Ok((now, None)),
    }
}

async fn save<R: RateRows>(rows: &mut R, state: &RateState, config: &RateConfig) -> Result<()> {
    rows.save(state, state.expires_at(config)).await
}

/// Deletes entries at or before the cutoff; moves `base` to the last one deleted.
async fn prune<R: RateRows>(
    rows: &mut R,
    state: &mut RateState,
    config: &RateConfig,
    now: StoreTime,
) -> Result<bool> {
    match rows.prune(engine::prune_cutoff(config, now)).await? {
        Some(p) => {
            state.base = u64::try_from(p).map_err(|_| corrupt("negative rate total"))?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// One admission decision ([`crate::rate::seam::RateBackend::rate_acquire`]).
pub async fn acquire<R: RateRows>(
    rows: &mut R,
    name: &Name,
    config: &RateConfig,
    req: &RateRequest,
) -> Result<RateReply> {
    decide(rows, name, name.as_str(), config, req, Charge::Yes).await
}

/// Whether [`acquire`] would admit `req` now, charging nothing: only what a limited request
/// writes is written (pruned entries, limits replaced by `update`).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub async fn peek<R: RateRows>(
    rows: &mut R,
    name: &Name,
    config: &RateConfig,
    req: &RateRequest,
) -> Result<RateReply> {
    decide(rows, name, name.as_str(), config, req, Charge::No).await
}

/// What [`decide`] charges when it admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Charge {
    /// The request, under the limiter's next id.
    Yes,
    /// Nothing (a question only).
    No,
    /// The request, under another limiter's id: a tenant's charge under the shared
    /// charge's id (its `seq` and `tail` set to it).
    As(u64),
}

/// The decision of [`acquire`] on limiter `key` (the name's own or a tenant's).
async fn decide<R: RateRows>(
    rows: &mut R,
    name: &Name,
    key: &str,
    config: &RateConfig,
    req: &RateRequest,
    charge: Charge,
) -> Result<RateReply> {
    let (now, existing) = load(rows, key).await?;
    // With `update`, differing stored limits are replaced even if the request is limited.
    let replaced = existing
        .as_ref()
        .is_some_and(|s| s.config != config.encode());
    let mut state = engine::check_config(name, existing, config, req.update, now)?;
    let pruned = match config.mode() {
        RateMode::Exact => prune(rows, &mut state, config, now).await?,
        RateMode::Smooth { .. } => false,
    };
    let mut found = Vec::new();
    for x in engine::thresholds(&state, config, req.cost) {
        found.push(match x {
            None => None,
            Some(x) => rows.first_at_least(x).await?.map(|t| t.max(0) as u64),
        });
    }
    let before = (charge == Charge::No).then(|| state.clone());
    let (reply, entry) = engine::decide(&mut state, config, req, now, &found)?;
    if let Some(before) = before {
        // A question: the state as a limited request leaves it.
        if pruned || replaced {
            save(rows, &before, config).await?;
        }
    } else if let RateReply::Admitted { .. } = reply {
        if let Some((t, p)) = entry {
            rows.append(p, t).await?;
        }
        if let Charge::As(id) = charge {
            state.seq = id;
            state.tail = id;
        }
        save(rows, &state, config).await?;
    } else if pruned || replaced {
        // Limited: nothing is charged. Entries that no longer change any answer were
        // pruned, so `base` must follow them (a stale base would let a later lookup land on
        // a kept entry instead of a pruned one and delay requests for nothing); and limits
        // replaced by `update` stay replaced, as in the memory store. `decide` left `state`
        // unchanged on Limited.
        save(rows, &state, config).await?;
    }
    Ok(reply)
}

/// Hands a reservation back ([`crate::rate::seam::RateBackend::rate_cancel`]). The reservation is named
/// by its number; `at` only confirms it, and a stored admission time within `slack` µs of
/// `at` counts as `at` (a store that converts times on the way out may not get them back
/// exactly; 0 elsewhere).
pub async fn cancel<R: RateRows>(
    rows: &mut R,
    name: &Name,
    reservation: u64,
    at: StoreTime,
    slack: u64,
) -> Result<bool> {
    undo(rows, name, reservation, at, slack, false).await
}

/// [`cancel`], and with `due_too` also an admission whose time has come: an admission
/// given back unused (`engine::undo_latest`).
pub async fn undo<R: RateRows>(
    rows: &mut R,
    name: &Name,
    reservation: u64,
    at: StoreTime,
    slack: u64,
    due_too: bool,
) -> Result<bool> {
    Ok(
        undo_state(rows, name, name.as_str(), reservation, at, slack, due_too)
            .await?
            .is_some_and(|u| u.undone),
    )
}

/// What [`undo_state`] found and did.
struct Undo {
    /// The charge was returned.
    undone: bool,
    /// The step's time.
    now: StoreTime,
    /// The limiter's horizon (longest window plus margin), µs.
    horizon: u64,
}

/// [`undo`] on limiter `key`; `None` if the limiter had no state (none, or expired: then
/// dropped).
async fn undo_state<R: RateRows>(
    rows: &mut R,
    name: &Name,
    key: &str,
    reservation: u64,
    at: StoreTime,
    slack: u64,
    due_too: bool,
) -> Result<Option<Undo>> {
    let (now, state) = load(rows, key).await?;
    let Some(mut state) = state else {
        return Ok(None);
    };
    let at = match state.last.abs_diff(at.0) <= slack {
        true => StoreTime(state.last),
        false => at,
    };
    let config = stored_config(name, &state)?;
    let old_p = state.p;
    let undone = match due_too {
        true => engine::undo_latest(&mut state, &config, reservation, at),
        false => engine::cancel(&mut state, &config, reservation, at, now),
    };
    if undone {
        if let RateMode::Exact = config.mode() {
            rows.remove_entry(old_p).await?;
            let last = rows.last_total().await?;
            state.p = last.map_or(state.base, |p| p.max(0) as u64);
        }
        save(rows, &state, &config).await?;
    }
    Ok(Some(Undo {
        undone,
        now,
        horizon: config.horizon_us(),
    }))
}

/// An admission given back unused, inside the step that released its lease: its charge
/// returned while it is the latest ([`undo`] with `due_too`), and, if it was past its
/// use-by instant and `count` (the step released the lease, and the row has the column),
/// counted in the limiter's row, which is then kept at least one horizon (longest window
/// plus margin) from now, so the count outlives a give-back of the only admission (whose
/// undo leaves a state that would expire at once). A state already forgotten counts
/// nothing.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub async fn give_back<R: RateRows>(
    rows: &mut R,
    name: &Name,
    g: &crate::seam::GiveBack,
    slack: u64,
    count: bool,
) -> Result<()> {
    let undo = undo_state(rows, name, name.as_str(), g.reservation, g.at, slack, true).await?;
    if let Some(u) = undo.filter(|_| g.expired && count) {
        rows.count_expired(u.now.0.saturating_add(u.horizon))
            .await?;
    }
    Ok(())
}

/// Settles an admission's cost on its limiter, inside the step that released its lease
/// (`held`: it was still held). `engine::settle` decides; a limiter without state (expired,
/// or never charged) settles nothing. For a store whose times come back converted, `slack`
/// µs: the give-back's block is the entries exactly at `at`, or else at or before
/// `at - slack` (never a later one, which would be unsafe; an earlier one is safe, see
/// `engine::settle_block`); in smooth mode the latest admission's time within the slack of
/// `at` counts as `at`.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub async fn settle<R: SettleRows>(
    rows: &mut R,
    name: &Name,
    s: &crate::seam::Settlement,
    held: bool,
    slack: u64,
) -> Result<()> {
    settle_in(rows, name, name.as_str(), s, held, slack).await
}

/// [`settle`] on limiter `key` (the name's own or a tenant's).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
async fn settle_in<R: SettleRows>(
    rows: &mut R,
    name: &Name,
    key: &str,
    s: &crate::seam::Settlement,
    held: bool,
    slack: u64,
) -> Result<()> {
    let (now, state) = load(rows, key).await?;
    let Some(mut state) = state else {
        return Ok(());
    };
    let config = stored_config(name, &state)?;
    let block = match config.mode() {
        RateMode::Exact if held && s.actual < s.charged => {
            // The admission's own instant when an entry stands exactly there (times
            // converted back by the process that converted them are exact), else at or
            // before `at - slack`.
            let at = s.at.0;
            let found = match rows.last_at_or_before(at).await? {
                Some((t, p)) if t == db(at) => Some((t, p)),
                _ if slack > 0 => rows.last_at_or_before(at.saturating_sub(slack)).await?,
                other => other,
            };
            match found {
                None => None,
                Some((t, last)) => {
                    let t = non_negative(t, "t")?;
                    let last = non_negative(last, "p")?;
                    let before = match rows.total_before(t).await? {
                        Some(p) => non_negative(p, "p")?,
                        None => state.base,
                    };
                    (last > before).then_some((t, before, last))
                }
            }
        }
        _ => None,
    };
    // Smooth mode gives back only to the latest admission, named by its reservation: its
    // time within the slack is its time.
    let at = match state.last.abs_diff(s.at.0) <= slack {
        true => StoreTime(state.last),
        false => s.at,
    };
    let old = state.clone();
    let change = engine::settle(
        &mut state,
        &config,
        s.reservation,
        at,
        s.charged,
        s.actual,
        held,
        now,
        block,
    );
    match change {
        engine::LogChange::None => {}
        engine::LogChange::Append { t, p } => rows.append(p, t).await?,
        engine::LogChange::Lower { t, before, last, d } => {
            rows.lower(t, d, (last - d > before).then_some(last - d))
                .await?
        }
    }
    if state != old {
        save(rows, &state, &config).await?;
    }
    Ok(())
}

/// Asks `tenant`'s own limiter on `name` (its configuration `scaled`, the shared one scaled
/// by the tenant's window ceiling, taken as an `update`) whether it admits `cost` now,
/// charging nothing: `None` if it does, else the instant it would.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub async fn tenant_refuses<R: TenantLimiterRows>(
    rows: &mut R,
    name: &Name,
    tenant: &str,
    scaled: &RateConfig,
    cost: u32,
) -> Result<Option<StoreTime>> {
    let key = tenant_key(name.as_str(), tenant);
    rows.point_at(Some(key.clone()));
    let reply = decide(rows, name, &key, scaled, &tenant_ask(cost), Charge::No).await;
    rows.point_at(None);
    Ok(match reply? {
        RateReply::Admitted { .. } => None,
        RateReply::Limited { retry_at, .. } => Some(retry_at),
    })
}

/// Charges `cost` to `tenant`'s own limiter now under the shared charge's id
/// `reservation`, after [`tenant_refuses`] said it admits it in the same step; `false` if
/// it did not admit it after all (nothing charged).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub async fn charge_tenant<R: TenantLimiterRows>(
    rows: &mut R,
    name: &Name,
    tenant: &str,
    scaled: &RateConfig,
    cost: u32,
    reservation: u64,
) -> Result<bool> {
    let key = tenant_key(name.as_str(), tenant);
    rows.point_at(Some(key.clone()));
    let charge = Charge::As(reservation);
    let reply = decide(rows, name, &key, scaled, &tenant_ask(cost), charge).await;
    rows.point_at(None);
    Ok(matches!(reply?, RateReply::Admitted { .. }))
}

/// A tenant's limiter is asked as an `update`: a changed window ceiling moves its limits
/// (exact history kept), as a changed configuration moves any limiter's.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
fn tenant_ask(cost: u32) -> RateRequest {
    RateRequest {
        cost,
        max_wait: None,
        update: true,
    }
}

/// An admission given back unused, returned to `tenant`'s own limiter too while it is that
/// limiter's latest (`engine::undo_latest`); nothing counted there.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub async fn give_back_tenant<R: TenantLimiterRows>(
    rows: &mut R,
    name: &Name,
    tenant: &str,
    g: &crate::seam::GiveBack,
    slack: u64,
) -> Result<()> {
    let key = tenant_key(name.as_str(), tenant);
    rows.point_at(Some(key.clone()));
    let undone = undo_state(rows, name, &key, g.reservation, g.at, slack, true).await;
    rows.point_at(None);
    undone.map(drop)
}

/// A settle on `tenant`'s own limiter too ([`settle`]).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub async fn settle_tenant<R: TenantLimiterRows>(
    rows: &mut R,
    name: &Name,
    tenant: &str,
    s: &crate::seam::Settlement,
    held: bool,
    slack: u64,
) -> Result<()> {
    let key = tenant_key(name.as_str(), tenant);
    rows.point_at(Some(key.clone()));
    let settled = settle_in(rows, name, &key, s, held, slack).await;
    rows.point_at(None);
    settled
}

/// Deletes the limiter's row and log; `true` if it had state that had not expired.
pub async fn delete<R: RateRows>(rows: &mut R, name: &Name) -> Result<bool> {
    // `load` drops an expired state (or a placeholder) itself.
    let existed = load(rows, name.as_str()).await?.1.is_some();
    if existed {
        rows.drop_state(name.as_str()).await?;
    }
    // And the tenants' own limiters of the name (window ceilings), which only its
    // admissions read.
    rows.drop_tenant_limiters(name.as_str()).await?;
    Ok(existed)
}

/// The limiter's state and usage ([`crate::rate::seam::RateBackend::rate_status`]) as a locking step; with
/// `counted` (the row has the column), its count of admissions given back past their use-by
/// instant. The stores answer a status from one snapshot without a lock instead
/// (`rate_snapshot.rs`, which lists what this step changes), and run this only when that
/// snapshot reads wrong or could not be read without waiting.
pub async fn status<R: RateRows>(
    rows: &mut R,
    name: &Name,
    counted: bool,
) -> Result<Option<RateStatus>> {
    let (now, state) = load(rows, name.as_str()).await?;
    let Some(mut state) = state else {
        return Ok(None);
    };
    let config = stored_config(name, &state)?;
    let mut log = VecLog::default();
    if let RateMode::Exact = config.mode() {
        if prune(rows, &mut state, &config, now).await? {
            save(rows, &state, &config).await?;
        }
        for (t, p) in rows.whole_log().await? {
            log.0
                .push_back((non_negative(t, "t")?, non_negative(p, "p")?));
        }
    }
    let mut status = engine::status(name, &state, &config, &log, now)?;
    if counted {
        status.expired_unused = Some(rows.expired_unused().await?);
    }
    Ok(Some(status))
}
