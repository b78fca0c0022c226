//! Rate limiters in the memory store: the reference implementation of
//! [`crate::RateBackend`], a thin shell around the pure decision of `rate/engine.rs` with
//! the log in a `VecDeque`.
//!
//! Each limiter's state exists while it matters (see `RateState::expires_at`); expired ones
//! are dropped when touched, and swept from the whole map every 256 operations, so idle
//! limiters do not accumulate.

use std::collections::HashMap;

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

impl RateModel {
    /// Drops `name` if expired, and every expired limiter now and then.
    fn expire(&mut self, name: &Name, now: StoreTime) {
        self.ops += 1;
        if self.ops.is_multiple_of(256) {
            self.limiters.retain(|_, l| l.expires_at > now.0);
        } else if self
            .limiters
            .get(name)
            .is_some_and(|l| l.expires_at <= now.0)
        {
            self.limiters.remove(name);
        }
    }

    pub(crate) fn acquire(
        &mut self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
        now: StoreTime,
    ) -> Result<RateReply> {
        self.expire(name, now);
        // Work on the limiter out of the map (no copy of its log), and put it back.
        let (stored, mut log, old_expiry, expired) = match self.limiters.remove(name) {
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
                    self.limiters.insert(
                        name.clone(),
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
        let decided = engine::decide(&mut state, config, req, now, &found);
        let admitted = matches!(decided, Ok((RateReply::Admitted { .. }, _)));
        if let Ok((_, Some(entry))) = decided {
            log.0.push_back(entry);
        }
        // A limited request changes no answer: only entries that no longer matter were
        // pruned (and `base` followed them).
        if admitted || existed {
            let expires_at = state.expires_at(config);
            self.limiters.insert(
                name.clone(),
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
        let Some(l) = self.limiters.get_mut(name) else {
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

    /// Settles an admission's cost (see `engine::settle`); `held`: the same step released
    /// its lease.
    pub(crate) fn settle(
        &mut self,
        name: &Name,
        s: &Settlement,
        held: bool,
        now: StoreTime,
    ) -> Result<()> {
        self.expire(name, now);
        let Some(l) = self.limiters.get_mut(name) else {
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
