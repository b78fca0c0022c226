//! The checker: rebuilds every lease's certainly-held interval from a merged log and checks
//! the properties listed in the [module docs](super) per semaphore.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};

use tessera::LeaseId;

use super::format::{AcquireMode, Event, EventKind, Outcome};
use super::violation::{LeaseInfo, Report, Violation};

/// A granted lease being reconstructed from the log.
struct LeaseRec {
    info: LeaseInfo,
    requested: Option<u32>,
    valid_until_ns: u64,
    released_ns: Option<u64>,
    lost_ns: Option<u64>,
}

impl LeaseRec {
    fn finish(mut self) -> LeaseInfo {
        let end = [Some(self.valid_until_ns), self.released_ns, self.lost_ns]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.valid_until_ns);
        self.info.end_ns = end;
        self.info
    }
}

/// Checks a merged grant log (see the module docs for the properties). `capacities` gives
/// capacities by semaphore name; `Capacity` events in the log add to them.
pub fn check(events: &[Event], capacities: &HashMap<String, u32>) -> Report {
    check_with_grace(events, capacities, CANCEL_GRACE_NS)
}

/// [`check`], with how long a timed-out or failed acquire may still wait or hold after it
/// returned (instead of [`CANCEL_GRACE_NS`]): under network faults its cancellation can fail,
/// and its queue entry then lives until its waiter TTL, and a grant that raced with it until
/// the lease TTL.
pub fn check_with_grace(
    events: &[Event],
    capacities: &HashMap<String, u32>,
    grace_ns: u64,
) -> Report {
    let mut events: Vec<&Event> = events.iter().collect();
    events.sort_by_key(|e| e.t_ns);

    let mut report = Report::default();
    let mut caps: HashMap<String, u32> = capacities.clone();
    let mut invoked: HashMap<(String, u64), (String, u32, u64, AcquireMode)> = HashMap::new();
    let mut leases: HashMap<LeaseId, LeaseRec> = HashMap::new();
    let mut order: Vec<LeaseId> = Vec::new();
    let mut tenant_of: HashMap<String, String> = HashMap::new();
    let stats = &mut report.stats;
    let violations = &mut report.violations;

    for e in &events {
        match &e.kind {
            EventKind::Capacity { sem, capacity } => {
                caps.insert(sem.clone(), *capacity);
            }
            EventKind::AcquireInvoked {
                worker,
                op,
                sem,
                weight,
                mode,
            } => {
                stats.acquires += 1;
                invoked.insert((worker.clone(), *op), (sem.clone(), *weight, e.t_ns, *mode));
            }
            EventKind::AcquireReturned {
                worker,
                op,
                outcome,
            } => {
                let asked = invoked.remove(&(worker.clone(), *op));
                match &asked {
                    None => violations.push(Violation::Log {
                        problem: format!("worker {worker} op {op} returned but was never invoked"),
                    }),
                    Some((sem, _, t0, AcquireMode::Timeout { timeout_ms })) => {
                        let took = e.t_ns.saturating_sub(*t0);
                        let over = took.saturating_sub(timeout_ms * 1_000_000);
                        report.max_deadline_overrun_ns = report.max_deadline_overrun_ns.max(over);
                        if over > DEADLINE_GRACE_NS {
                            violations.push(Violation::DeadlineMissed {
                                sem: sem.clone(),
                                worker: worker.clone(),
                                op: *op,
                                timeout_ms: *timeout_ms,
                                took_ms: took / 1_000_000,
                            });
                        }
                    }
                    Some(_) => {}
                }
                match outcome {
                    Outcome::Granted {
                        lease_id,
                        fence,
                        seats,
                        weight,
                        valid_until_ns,
                    } => {
                        stats.grants += 1;
                        if leases.contains_key(lease_id) {
                            violations.push(Violation::Log {
                                problem: format!(
                                    "lease {lease_id} granted twice (worker {worker} op {op})"
                                ),
                            });
                            continue;
                        }
                        let (sem, requested, invoked_ns) = match asked {
                            Some((sem, w, t0, _)) => (sem, Some(w), t0),
                            None => ("?".to_string(), None, e.t_ns),
                        };
                        order.push(*lease_id);
                        leases.insert(
                            *lease_id,
                            LeaseRec {
                                info: LeaseInfo {
                                    sem,
                                    worker: worker.clone(),
                                    lease_id: *lease_id,
                                    fence: *fence,
                                    seats: seats.clone(),
                                    weight: *weight,
                                    invoked_ns,
                                    start_ns: e.t_ns,
                                    end_ns: 0,
                                },
                                requested,
                                valid_until_ns: *valid_until_ns,
                                released_ns: None,
                                lost_ns: None,
                            },
                        );
                    }
                    Outcome::NoPermit => stats.no_permit += 1,
                    Outcome::TimedOut => stats.timed_out += 1,
                    Outcome::Error { .. } => stats.errors += 1,
                }
            }
            EventKind::Renewed {
                lease_id,
                valid_until_ns,
            } => {
                stats.renewals += 1;
                match leases.get_mut(lease_id) {
                    Some(l) => l.valid_until_ns = *valid_until_ns,
                    None => violations.push(Violation::Log {
                        problem: format!("renewal of unknown lease {lease_id}"),
                    }),
                }
            }
            EventKind::ReleaseInvoked { lease_id } => match leases.get_mut(lease_id) {
                Some(l) => {
                    l.released_ns.get_or_insert(e.t_ns);
                }
                None => violations.push(Violation::Log {
                    problem: format!("release of unknown lease {lease_id}"),
                }),
            },
            EventKind::ReleaseReturned { .. } => stats.releases += 1,
            EventKind::Lost { lease_id, .. } => {
                stats.losses += 1;
                match leases.get_mut(lease_id) {
                    Some(l) => {
                        l.lost_ns.get_or_insert(e.t_ns);
                    }
                    None => violations.push(Violation::Log {
                        problem: format!("loss of unknown lease {lease_id}"),
                    }),
                }
            }
            EventKind::Tenant { worker, tenant } => {
                tenant_of.insert(worker.clone(), tenant.clone());
            }
            EventKind::Fault { .. } | EventKind::ResourceWrite { .. } => {}
        }
    }

    // Per semaphore, in grant order.
    let mut by_sem: BTreeMap<String, Vec<LeaseInfo>> = BTreeMap::new();
    for id in order {
        let rec = leases.remove(&id).expect("every ordered lease is recorded");
        let requested = rec.requested;
        let info = rec.finish();
        if let Some(w) = requested {
            if w != info.weight {
                violations.push(Violation::BadSeatsOrWeight {
                    problem: format!("asked for weight {w}, granted weight {}", info.weight),
                    lease: info.clone(),
                });
            }
        }
        let mut distinct = info.seats.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != info.seats.len() || info.seats.len() != info.weight as usize {
            violations.push(Violation::BadSeatsOrWeight {
                problem: format!(
                    "weight {} but {} seats, {} distinct",
                    info.weight,
                    info.seats.len(),
                    distinct.len()
                ),
                lease: info.clone(),
            });
        }
        by_sem.entry(info.sem.clone()).or_default().push(info);
    }
    // A tenant's ceiling: its leases against it, as a capacity (fences and seats are the
    // semaphore's, checked there).
    let mut by_tenant: BTreeMap<String, Vec<LeaseInfo>> = BTreeMap::new();
    for (sem, leases) in &by_sem {
        for l in leases {
            if let Some(t) = tenant_of.get(&l.worker) {
                let key = super::format::tenant_sem(sem, t);
                if caps.contains_key(&key) {
                    by_tenant.entry(key).or_default().push(l.clone());
                }
            }
        }
    }
    for (key, leases) in &by_tenant {
        let held: Vec<&LeaseInfo> = leases.iter().filter(|l| l.end_ns > l.start_ns).collect();
        let max = check_capacity(key, caps[key], &held, violations);
        stats.max_concurrent_weight.insert(key.clone(), max);
    }

    check_no_permits(&events, &caps, grace_ns, violations);
    for (sem, leases) in &by_sem {
        check_fences_unique(sem, leases, violations);
        check_fence_order(sem, leases, violations);
        let Some(&capacity) = caps.get(sem) else {
            violations.push(Violation::UnknownCapacity { sem: sem.clone() });
            continue;
        };
        let held: Vec<&LeaseInfo> = leases.iter().filter(|l| l.end_ns > l.start_ns).collect();
        let max = check_capacity(sem, capacity, &held, violations);
        stats.max_concurrent_weight.insert(sem.clone(), max);
        check_seats(sem, capacity, &held, violations);
    }
    report.leases = by_sem.into_values().flatten().collect();
    report.leases.sort_by_key(|l| l.start_ns);
    report
}

/// How far past its timeout a timed acquire may return: the 250 ms it may spend giving its
/// queue place back (documented on `Semaphore::acquire_many_timeout`) plus 250 ms for a busy
/// 2-core machine to schedule the caller.
pub const DEADLINE_GRACE_NS: u64 = 500_000_000;

/// C3: walks the leases by invocation; each must have a fence above every lease whose
/// acquire returned before it was invoked.
fn check_fence_order(sem: &str, leases: &[LeaseInfo], violations: &mut Vec<Violation>) {
    let mut by_start: Vec<&LeaseInfo> = leases.iter().collect();
    by_start.sort_by_key(|l| l.start_ns);
    let mut by_invoked: Vec<&LeaseInfo> = leases.iter().collect();
    by_invoked.sort_by_key(|l| l.invoked_ns);
    let mut granted = by_start.iter().peekable();
    let mut top: Option<&LeaseInfo> = None;
    for l in by_invoked {
        while let Some(&&a) = granted.peek() {
            if a.start_ns >= l.invoked_ns {
                break;
            }
            if top.is_none_or(|t| a.fence > t.fence) {
                top = Some(a);
            }
            granted.next();
        }
        if let Some(a) = top {
            if l.fence <= a.fence && a.lease_id != l.lease_id {
                violations.push(Violation::FenceOrder {
                    sem: sem.to_string(),
                    earlier: a.clone(),
                    later: l.clone(),
                });
            }
        }
    }
}

/// How long after a timed-out or failed acquire returned the checker still counts it as
/// possibly waiting or holding: its cancellation runs in the background.
pub const CANCEL_GRACE_NS: u64 = 1_000_000_000;

/// One acquire, from the log, for C3.
struct Op<'a> {
    sem: &'a str,
    worker: &'a str,
    op: u64,
    weight: u32,
    mode: AcquireMode,
    invoked_ns: u64,
    returned: Option<(u64, &'a Outcome)>,
}

/// C4: every "no permit" answer is explained by possible holders or waiters.
fn check_no_permits(
    events: &[&Event],
    caps: &HashMap<String, u32>,
    grace_ns: u64,
    violations: &mut Vec<Violation>,
) {
    let mut ops: Vec<Op> = Vec::new();
    let mut index: HashMap<(&str, u64), usize> = HashMap::new();
    let mut tenant_of: HashMap<&str, &str> = HashMap::new();
    // Possible end of each lease: its release's return.
    let mut released: HashMap<LeaseId, u64> = HashMap::new();
    for e in events {
        match &e.kind {
            EventKind::AcquireInvoked {
                worker,
                op,
                sem,
                weight,
                mode,
            } => {
                index.insert((worker, *op), ops.len());
                ops.push(Op {
                    sem,
                    worker,
                    op: *op,
                    weight: *weight,
                    mode: *mode,
                    invoked_ns: e.t_ns,
                    returned: None,
                });
            }
            EventKind::AcquireReturned {
                worker,
                op,
                outcome,
            } => {
                if let Some(&i) = index.get(&(worker.as_str(), *op)) {
                    ops[i].returned = Some((e.t_ns, outcome));
                }
            }
            EventKind::ReleaseReturned {
                lease_id,
                error: None,
                ..
            } => {
                released.entry(*lease_id).or_insert(e.t_ns);
            }
            EventKind::Tenant { worker, tenant } => {
                tenant_of.insert(worker, tenant);
            }
            _ => {}
        }
    }
    // Per semaphore: intervals of possible waiting, and of possible holding with a weight.
    // A tenant with a ceiling is a semaphore of its own too (its pseudo-semaphore, whose
    // capacity is the ceiling): its refusals may be explained by its own leases.
    let keys = |o: &Op| -> Vec<String> {
        let mut k = vec![o.sem.to_string()];
        if let Some(t) = tenant_of.get(o.worker) {
            let key = super::format::tenant_sem(o.sem, t);
            if caps.contains_key(&key) {
                k.push(key);
            }
        }
        k
    };
    let mut waiting: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    let mut holding: HashMap<String, Vec<(u64, u64, u32)>> = HashMap::new();
    for o in &ops {
        let try_mode = o.mode == AcquireMode::TryAcquire;
        let (wait, hold) = match o.returned {
            None if !try_mode => (
                Some((o.invoked_ns, u64::MAX)),
                Some((o.invoked_ns, u64::MAX, o.weight)),
            ),
            None => (None, None),
            Some((
                t,
                Outcome::Granted {
                    lease_id, weight, ..
                },
            )) => {
                let end = released.get(lease_id).copied().unwrap_or(u64::MAX);
                (
                    (!try_mode).then_some((o.invoked_ns, t)),
                    Some((o.invoked_ns, end, *weight)),
                )
            }
            Some((t, Outcome::TimedOut | Outcome::Error { .. })) if !try_mode => {
                let end = t.saturating_add(grace_ns);
                (
                    Some((o.invoked_ns, end)),
                    Some((o.invoked_ns, end, o.weight)),
                )
            }
            Some(_) => (None, None),
        };
        for key in keys(o) {
            if let Some(w) = wait {
                waiting.entry(key.clone()).or_default().push(w);
            }
            if let Some(h) = hold {
                holding.entry(key).or_default().push(h);
            }
        }
    }
    for o in &ops {
        let Some((returned_ns, Outcome::NoPermit)) = o.returned else {
            continue;
        };
        let (from, to) = (o.invoked_ns, returned_ns);
        let overlaps = |a: u64, b: u64| a <= to && b >= from;
        // The most weight possibly held at one instant of [from, to] on `key`, or `None`
        // if a waiter there explains the refusal.
        let possibly_held = |key: &str| -> Option<u64> {
            if waiting
                .get(key)
                .is_some_and(|w| w.iter().any(|&(a, b)| overlaps(a, b)))
            {
                return None;
            }
            let mut points: Vec<(u64, bool, u32)> = Vec::new();
            for &(a, b, w) in holding.get(key).map(Vec::as_slice).unwrap_or(&[]) {
                if overlaps(a, b) {
                    points.push((a.max(from), false, w));
                    points.push((b.min(to), true, w));
                }
            }
            // Closed intervals: at equal times, starts (false) before ends (true).
            points.sort_unstable();
            let (mut sum, mut max) = (0u64, 0u64);
            for (_, is_end, w) in points {
                if is_end {
                    sum -= w as u64;
                } else {
                    sum += w as u64;
                    max = max.max(sum);
                }
            }
            Some(max)
        };
        let Some(&capacity) = caps.get(o.sem) else {
            continue; // reported as UnknownCapacity if the semaphore had grants
        };
        let Some(max) = possibly_held(o.sem) else {
            continue;
        };
        if max + o.weight as u64 > capacity as u64 {
            continue;
        }
        // Refused with permits free: its tenant's ceiling may explain it.
        let by_ceiling = keys(o).iter().skip(1).any(|key| match possibly_held(key) {
            None => true,
            Some(held) => held + o.weight as u64 > caps[key] as u64,
        });
        if !by_ceiling {
            violations.push(Violation::NoPermitUnexplained {
                sem: o.sem.to_string(),
                worker: o.worker.to_string(),
                op: o.op,
                weight: o.weight,
                capacity,
                possibly_held: max.min(u32::MAX as u64) as u32,
                invoked_ns: from,
                returned_ns: to,
            });
        }
    }
}

fn check_fences_unique(sem: &str, leases: &[LeaseInfo], violations: &mut Vec<Violation>) {
    let mut seen: HashMap<u64, &LeaseInfo> = HashMap::new();
    for l in leases {
        if let Some(first) = seen.insert(l.fence, l) {
            violations.push(Violation::FenceReused {
                sem: sem.to_string(),
                first: first.clone(),
                second: l.clone(),
            });
        }
    }
}

/// C1: a sweep over the interval ends. Returns the largest weight held at one instant.
/// Reports one witness per stretch of time spent over capacity.
fn check_capacity(
    sem: &str,
    capacity: u32,
    held: &[&LeaseInfo],
    violations: &mut Vec<Violation>,
) -> u32 {
    // (time, is_start, index): at equal times ends sort before starts, because intervals are
    // half-open and a lease that ends at t does not overlap one that starts at t.
    let mut points: Vec<(u64, bool, usize)> = Vec::with_capacity(held.len() * 2);
    for (i, l) in held.iter().enumerate() {
        points.push((l.start_ns, true, i));
        points.push((l.end_ns, false, i));
    }
    points.sort_unstable();
    let mut active: BTreeMap<usize, ()> = BTreeMap::new();
    let (mut sum, mut max, mut over) = (0u64, 0u64, false);
    for (t, is_start, i) in points {
        if is_start {
            active.insert(i, ());
            sum += held[i].weight as u64;
            max = max.max(sum);
            if sum > capacity as u64 && !over {
                over = true;
                violations.push(Violation::OverCapacity {
                    sem: sem.to_string(),
                    at_ns: t,
                    capacity,
                    held: sum.min(u32::MAX as u64) as u32,
                    leases: active.keys().map(|&j| held[j].clone()).collect(),
                });
            }
        } else {
            active.remove(&i);
            sum -= held[i].weight as u64;
            if sum <= capacity as u64 {
                over = false;
            }
        }
    }
    max.min(u32::MAX as u64) as u32
}

/// Seat range, seat collisions and C2 (fences increase per seat).
fn check_seats(sem: &str, capacity: u32, held: &[&LeaseInfo], violations: &mut Vec<Violation>) {
    let mut by_seat: BTreeMap<u32, Vec<&LeaseInfo>> = BTreeMap::new();
    for l in held {
        // A seat listed twice in one lease is reported once, as a bad lease, not as a
        // collision with itself.
        let mut seats = l.seats.clone();
        seats.sort_unstable();
        seats.dedup();
        for seat in seats {
            if seat >= capacity {
                violations.push(Violation::SeatOutOfRange {
                    sem: sem.to_string(),
                    seat,
                    capacity,
                    lease: (*l).clone(),
                });
            }
            by_seat.entry(seat).or_default().push(l);
        }
    }
    for (seat, mut on_seat) in by_seat {
        on_seat.sort_by_key(|l| (l.start_ns, l.end_ns));
        // Collisions: each lease against the one reaching furthest among those before it.
        let mut furthest: Option<&LeaseInfo> = None;
        for &l in &on_seat {
            if let Some(prev) = furthest {
                if prev.end_ns > l.start_ns {
                    violations.push(Violation::SeatCollision {
                        sem: sem.to_string(),
                        seat,
                        first: prev.clone(),
                        second: l.clone(),
                    });
                }
            }
            if furthest.is_none_or(|p| l.end_ns > p.end_ns) {
                furthest = Some(l);
            }
        }
        // C2: each lease against the largest fence among the leases that ended before it
        // started (walking both orders at once).
        let mut by_end = on_seat.clone();
        by_end.sort_by_key(|l| (l.end_ns, Reverse(l.fence)));
        let mut ended = by_end.iter().peekable();
        let mut top: Option<&LeaseInfo> = None;
        for &l in &on_seat {
            while let Some(&&a) = ended.peek() {
                if a.end_ns > l.start_ns {
                    break;
                }
                if top.is_none_or(|t| a.fence > t.fence) {
                    top = Some(a);
                }
                ended.next();
            }
            if let Some(a) = top {
                if l.fence <= a.fence && a.lease_id != l.lease_id {
                    violations.push(Violation::FenceNotIncreasing {
                        sem: sem.to_string(),
                        seat,
                        earlier: a.clone(),
                        later: l.clone(),
                    });
                }
            }
        }
    }
}
