//! Rate limiters in the memory store: the reference implementation of
//! [`crate::RateBackend`], a thin shell around the pure decision of `rate/engine.rs` with
//! the log in a `VecDeque`.
//!
//! Each limiter's state exists while it matters (see `RateState::expires_at`); expired ones
//! are dropped when touched, and swept from the whole map every 256 operations, so idle
//! limiters do not accumulate.

use std::collections::HashMap;
use std::hash::Hash;

use async_trait::async_trait;

use super::MemoryBackend;
use tessera_core::error::{Error, Result};
use tessera_core::model::{Name, StoreTime};
use tessera_core::rate::engine::{self, LogView, RateState, VecLog};
use tessera_core::rate::seam::RateStatus;
use tessera_core::seam::{RateBackend, RateConfig, RateReply, RateRequest, Settlement};

/// Every rate limiter of one memory store.
#[derive(Debug, Default)]
pub(crate) struct RateModel {
    limiters: HashMap<Name, Limiter>,
    /// Tenants' own limiters, under window ceilings.
    tenants: HashMap<TenantKey, Limiter>,
    ops: u64,
}

#[derive(Debug)]
struct Limiter {
    state: RateState,
    log: VecLog,
    expires_at: u64,
    /// Admissions given back past their use-by instant since the state began.
    expired: u64,
}

fn stored_config(name: &Name, state: &RateState) -> Result<RateConfig> {
    RateConfig::decode(&state.config).ok_or_else(|| {
        Error::Corrupt(format!(
            "rate limiter {name}: unreadable limits {:?}",
            state.config
        ))
    })
}

/// A tenant's own limiter under a window ceiling (`docs/fair-shares.md`, "A ceiling on a
/// share of the windows"): the name and the tenant.
type TenantKey = (Name, Box<str>);

/// What an admission asks of its tenant's own limiter: `cost` now, the stored
/// configuration moved to the scaled one if the percentage changed.
fn tenant_ask(cost: u32) -> RateRequest {
    RateRequest {
        cost,
        max_wait: None,
        update: true,
    }
}

/// Drops `key`'s limiter if expired, or, with `sweep`, every expired limiter of `map`.
fn expire_in<K: Eq + Hash>(map: &mut HashMap<K, Limiter>, key: &K, now: StoreTime, sweep: bool) {
    if sweep {
        map.retain(|_, l| l.expires_at > now.0);
    } else if map.get(key).is_some_and(|l| l.expires_at <= now.0) {
        map.remove(key);
    }
}

/// Decides `req` on `key`'s limiter and, unless `peek`, saves what it admitted. With `peek`
/// nothing is charged: the answer says whether it would be admitted now (and when, if not);
/// only a configuration moved by `update` and pruned entries are saved, as a limited request
/// saves them.
#[allow(clippy::too_many_arguments)]
fn acquire_in<K: Eq + Hash + Clone>(
    map: &mut HashMap<K, Limiter>,
    key: &K,
    name: &Name,
    config: &RateConfig,
    req: &RateRequest,
    now: StoreTime,
    peek: bool,
) -> Result<RateReply> {
    // Work on the limiter out of the map (no copy of its log), and put it back.
    let (stored, mut log, old_expiry, expired) = match map.remove(key) {
        Some(l) => (Some(l.state), l.log, l.expires_at, l.expired),
        None => (None, VecLog::default(), 0, 0),
    };
    let existed = stored.is_some();
    // A save never lowers the expiry (`RateState::kept_until`), as in the other stores.
    let stored = stored.map(|mut s| {
        s.kept_until = old_expiry;
        s
    });
    let kept = stored.clone();
    let mut state = match engine::check_config(name, stored, config, req.update, now) {
        Ok(state) => state,
        Err(e) => {
            if let Some(state) = kept {
                map.insert(
                    key.clone(),
                    Limiter {
                        state,
                        log,
                        expires_at: old_expiry,
                        expired,
                    },
                );
            }
            return Err(e);
        }
    };
    if let Some(p) = log.prune(engine::prune_cutoff(config, now)) {
        state.base = p;
    }
    let found: Vec<Option<u64>> = engine::thresholds(&state, config, req.cost)
        .into_iter()
        .map(|x| x.and_then(|x| log.first_at_least(x)))
        .collect();
    let before = peek.then(|| state.clone());
    let decided = engine::decide(&mut state, config, req, now, &found);
    let mut admitted = matches!(decided, Ok((RateReply::Admitted { .. }, _)));
    if let Some(before) = before {
        state = before;
        admitted = false;
    } else if let Ok((_, Some(entry))) = decided {
        log.0.push_back(entry);
    }
    // A limited request changes no answer: only entries that no longer matter were
    // pruned (and `base` followed them).
    if admitted || existed {
        let expires_at = state.expires_at(config);
        map.insert(
            key.clone(),
            Limiter {
                state,
                log,
                expires_at,
                expired,
            },
        );
    }
    decided.map(|(reply, _)| reply)
}

/// Undoes the latest admission of `key`'s limiter (see `engine::cancel` and
/// `engine::undo_latest`): only before its time unless `due_too`.
fn undo_in<K: Eq + Hash>(
    map: &mut HashMap<K, Limiter>,
    key: &K,
    name: &Name,
    reservation: u64,
    at: StoreTime,
    now: StoreTime,
    due_too: bool,
) -> Result<bool> {
    let Some(l) = map.get_mut(key) else {
        return Ok(false);
    };
    let config = stored_config(name, &l.state)?;
    let undone = if due_too {
        engine::undo_latest(&mut l.state, &config, reservation, at)
    } else {
        engine::cancel(&mut l.state, &config, reservation, at, now)
    };
    if !undone {
        return Ok(false);
    }
    if let tessera_core::rate::spec::RateMode::Exact = config.mode() {
        l.log.0.pop_back();
        l.state.p = l.log.0.back().map_or(l.state.base, |&(_, p)| p);
    }
    l.state.kept_until = l.expires_at;
    l.expires_at = l.state.expires_at(&config);
    Ok(true)
}

/// Settles an admission's cost on `key`'s limiter (see `engine::settle`).
fn settle_in<K: Eq + Hash>(
    map: &mut HashMap<K, Limiter>,
    key: &K,
    name: &Name,
    s: &Settlement,
    held: bool,
    now: StoreTime,
) -> Result<()> {
    let Some(l) = map.get_mut(key) else {
        return Ok(());
    };
    let config = stored_config(name, &l.state)?;
    let block = engine::settle_block(&l.log, l.state.base, s.at.0);
    let change = engine::settle(
        &mut l.state,
        &config,
        s.reservation,
        s.at,
        s.charged,
        s.actual,
        held,
        now,
        block,
    );
    l.log.apply(change);
    l.state.kept_until = l.expires_at;
    l.expires_at = l.state.expires_at(&config);
    Ok(())
}

impl RateModel {
    /// Drops `name` if expired, and every expired limiter now and then.
    fn expire(&mut self, name: &Name, now: StoreTime) {
        self.ops += 1;
        let sweep = self.ops.is_multiple_of(256);
        expire_in(&mut self.limiters, name, now, sweep);
        if sweep {
            self.tenants.retain(|_, l| l.expires_at > now.0);
        }
    }

    fn expire_tenant(&mut self, key: &TenantKey, now: StoreTime) {
        expire_in(&mut self.tenants, key, now, false);
    }

    pub(crate) fn acquire(
        &mut self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
        now: StoreTime,
    ) -> Result<RateReply> {
        self.expire(name, now);
        acquire_in(&mut self.limiters, name, name, config, req, now, false)
    }

    /// Whether `req` would be admitted now, charging nothing (see [`acquire_in`]).
    pub(crate) fn peek(
        &mut self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
        now: StoreTime,
    ) -> Result<RateReply> {
        self.expire(name, now);
        acquire_in(&mut self.limiters, name, name, config, req, now, true)
    }

    /// Asks `tenant`'s own limiter on `name` (its configuration `config`, the shared one
    /// scaled) whether it admits `cost` now, charging nothing: `None` if it does, else the
    /// instant it would.
    pub(crate) fn tenant_refuses(
        &mut self,
        name: &Name,
        tenant: &str,
        config: &RateConfig,
        cost: u32,
        now: StoreTime,
    ) -> Result<Option<StoreTime>> {
        let key = (name.clone(), Box::from(tenant));
        self.expire_tenant(&key, now);
        match acquire_in(
            &mut self.tenants,
            &key,
            name,
            config,
            &tenant_ask(cost),
            now,
            true,
        )? {
            RateReply::Admitted { .. } => Ok(None),
            RateReply::Limited { retry_at, .. } => Ok(Some(retry_at)),
        }
    }

    /// Charges `cost` to `tenant`'s own limiter at `now`, under the shared charge's id
    /// `reservation` (after [`RateModel::tenant_refuses`] said it admits it, in the same
    /// step). `false` if it did not admit it after all (nothing charged).
    pub(crate) fn charge_tenant(
        &mut self,
        name: &Name,
        tenant: &str,
        config: &RateConfig,
        cost: u32,
        reservation: u64,
        now: StoreTime,
    ) -> Result<bool> {
        let key = (name.clone(), Box::from(tenant));
        let ask = tenant_ask(cost);
        let reply = acquire_in(&mut self.tenants, &key, name, config, &ask, now, false)?;
        if !matches!(reply, RateReply::Admitted { .. }) {
            return Ok(false);
        }
        let l = self.tenants.get_mut(&key).expect("charged above");
        l.state.seq = reservation;
        l.state.tail = reservation;
        Ok(true)
    }

    pub(crate) fn cancel(
        &mut self,
        name: &Name,
        reservation: u64,
        at: StoreTime,
        now: StoreTime,
    ) -> Result<bool> {
        self.undo(name, reservation, at, now, false)
    }

    /// Undoes the latest admission (see `engine::cancel` and `engine::undo_latest`): only
    /// before its time unless `due_too`.
    pub(crate) fn undo(
        &mut self,
        name: &Name,
        reservation: u64,
        at: StoreTime,
        now: StoreTime,
        due_too: bool,
    ) -> Result<bool> {
        self.expire(name, now);
        undo_in(
            &mut self.limiters,
            name,
            name,
            reservation,
            at,
            now,
            due_too,
        )
    }

    /// Returns an admission given back unused to `tenant`'s own limiter, if it is still that
    /// limiter's latest.
    pub(crate) fn undo_tenant(
        &mut self,
        name: &Name,
        tenant: &str,
        reservation: u64,
        at: StoreTime,
        now: StoreTime,
    ) -> Result<bool> {
        let key = (name.clone(), Box::from(tenant));
        self.expire_tenant(&key, now);
        undo_in(&mut self.tenants, &key, name, reservation, at, now, true)
    }

    /// Settles an admission's cost (see `engine::settle`); `held`: the same step released
    /// its lease; `tenant`: the lease's tenant, whose own limiter (if it has one) is
    /// settled too.
    pub(crate) fn settle(
        &mut self,
        name: &Name,
        tenant: Option<&str>,
        s: &Settlement,
        held: bool,
        now: StoreTime,
    ) -> Result<()> {
        self.expire(name, now);
        settle_in(&mut self.limiters, name, name, s, held, now)?;
        if let Some(t) = tenant {
            let key = (name.clone(), Box::from(t));
            self.expire_tenant(&key, now);
            settle_in(&mut self.tenants, &key, name, s, held, now)?;
        }
        Ok(())
    }

    pub(crate) fn status(&mut self, name: &Name, now: StoreTime) -> Result<Option<RateStatus>> {
        self.expire(name, now);
        let Some(l) = self.limiters.get(name) else {
            return Ok(None);
        };
        let config = stored_config(name, &l.state)?;
        let mut state = l.state.clone();
        let mut log = l.log.clone();
        if let Some(p) = log.prune(engine::prune_cutoff(&config, now)) {
            state.base = p;
        }
        let mut status = engine::status(name, &state, &config, &log, now)?;
        status.expired_unused = Some(l.expired);
        Ok(Some(status))
    }

    /// Counts an admission given back past its use-by instant, in the state (if any) that
    /// [`RateModel::undo`] just looked at, whether or not its charge came back; the state
    /// (and so the count) is kept at least one horizon (longest window plus margin) from
    /// `now` (`docs/admission.md`, "Use-by").
    pub(crate) fn count_expired(&mut self, name: &Name, now: StoreTime) -> Result<()> {
        if let Some(l) = self.limiters.get_mut(name) {
            let config = stored_config(name, &l.state)?;
            l.expired += 1;
            l.state.kept_until = l.expires_at.max(now.0.saturating_add(config.horizon_us()));
            l.expires_at = l.state.expires_at(&config);
        }
        Ok(())
    }

    /// Drops the limiter; `true` if it had state that had not expired.
    pub(crate) fn delete(&mut self, name: &Name, now: StoreTime) -> bool {
        self.expire(name, now);
        self.tenants.retain(|(n, _), _| n != name);
        self.limiters.remove(name).is_some()
    }

    pub(crate) fn list(&self, now: StoreTime) -> Vec<String> {
        let mut names: Vec<String> = self
            .limiters
            .iter()
            .filter(|(_, l)| l.expires_at > now.0)
            .map(|(n, _)| n.to_string())
            .collect();
        names.sort();
        names
    }
}

#[async_trait]
impl RateBackend for MemoryBackend {
    async fn rate_acquire(
        &self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
    ) -> Result<RateReply> {
        let now = self.clock.now();
        self.rate.lock().unwrap().acquire(name, config, req, now)
    }
    async fn rate_cancel(&self, name: &Name, reservation: u64, at: StoreTime) -> Result<bool> {
        let now = self.clock.now();
        self.rate.lock().unwrap().cancel(name, reservation, at, now)
    }
    async fn rate_status(&self, name: &Name) -> Result<Option<RateStatus>> {
        let now = self.clock.now();
        self.rate.lock().unwrap().status(name, now)
    }
    async fn rate_list(&self) -> Result<Vec<String>> {
        let now = self.clock.now();
        Ok(self.rate.lock().unwrap().list(now))
    }
    async fn rate_delete(&self, name: &Name) -> Result<bool> {
        let now = self.clock.now();
        Ok(self.rate.lock().unwrap().delete(name, now))
    }
}
