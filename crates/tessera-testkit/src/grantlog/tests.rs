//! The checker's own tests: hand-built logs, one property broken (or not) per test.

use std::collections::HashMap;
use std::io::Write;

use tessera::LeaseId;

use super::*;

const MS: u64 = 1_000_000;

/// Builds logs by hand: one lease per call, with its whole life.
#[derive(Default)]
struct Log {
    events: Vec<Event>,
    next: u64,
}

impl Log {
    fn new(sem: &str, capacity: u32) -> Log {
        let mut log = Log::default();
        log.push(
            0,
            EventKind::Capacity {
                sem: sem.into(),
                capacity,
            },
        );
        log
    }

    fn push(&mut self, t_ms: u64, kind: EventKind) {
        self.events.push(Event {
            t_ns: t_ms * MS,
            kind,
        });
    }

    /// A lease granted at `from`, released at `to` (valid well past it).
    fn lease(&mut self, from: u64, to: u64, fence: u64, seats: &[u32]) -> LeaseId {
        let id = self.grant(from, fence, seats, to + 1000);
        self.push(to, EventKind::ReleaseInvoked { lease_id: id });
        self.push(
            to + 1,
            EventKind::ReleaseReturned {
                lease_id: id,
                was_held: true,
                error: None,
            },
        );
        id
    }

    /// A lease granted at `from` with validity until `valid_until`, never released.
    fn grant(&mut self, from: u64, fence: u64, seats: &[u32], valid_until: u64) -> LeaseId {
        self.next += 1;
        let (op, id) = (self.next, LeaseId::from_u128(self.next as u128));
        let worker = format!("w{op}");
        let weight = seats.len() as u32;
        self.push(
            from.saturating_sub(1),
            EventKind::AcquireInvoked {
                worker: worker.clone(),
                op,
                sem: "s".into(),
                weight,
                mode: AcquireMode::Acquire,
            },
        );
        self.push(
            from,
            EventKind::AcquireReturned {
                worker,
                op,
                outcome: Outcome::Granted {
                    lease_id: id,
                    fence,
                    seats: seats.to_vec(),
                    weight,
                    valid_until_ns: valid_until * MS,
                },
            },
        );
        id
    }

    fn check(&self) -> Report {
        check(&self.events, &HashMap::new())
    }
}

fn kinds(report: &Report) -> Vec<&'static str> {
    report
        .violations
        .iter()
        .map(|v| match v {
            Violation::OverCapacity { .. } => "over_capacity",
            Violation::FenceReused { .. } => "fence_reused",
            Violation::FenceNotIncreasing { .. } => "fence_not_increasing",
            Violation::SeatCollision { .. } => "seat_collision",
            Violation::SeatOutOfRange { .. } => "seat_out_of_range",
            Violation::BadSeatsOrWeight { .. } => "bad_seats_or_weight",
            Violation::NoPermitUnexplained { .. } => "no_permit_unexplained",
            Violation::UnknownCapacity { .. } => "unknown_capacity",
            Violation::Log { .. } => "log",
            Violation::FenceOrder { .. } => "fence_order",
            Violation::DeadlineMissed { .. } => "deadline_missed",
        })
        .collect()
}

/// A correct log: overlapping leases within capacity, hand-offs at the same instant,
/// fences increasing per seat.
fn correct_log() -> Log {
    let mut log = Log::new("s", 3);
    log.lease(10, 50, 100, &[0, 1]);
    log.lease(20, 40, 101, &[2]);
    log.lease(40, 60, 102, &[2]); // starts exactly when the previous holder of seat 2 ended
    log.lease(50, 90, 103, &[0]);
    log.lease(55, 80, 104, &[1]);
    log
}

#[test]
fn a_correct_log_passes() {
    let report = correct_log().check();
    report.assert_ok();
    assert_eq!(report.stats.grants, 5);
    assert_eq!(report.stats.releases, 5);
    assert_eq!(report.stats.max_concurrent_weight["s"], 3);
}

#[test]
fn over_grant_beyond_capacity_is_caught_with_a_witness() {
    let mut log = Log::new("s", 2);
    log.lease(10, 50, 1, &[0]);
    log.lease(20, 60, 2, &[1]);
    log.lease(30, 40, 3, &[0]); // also collides on seat 0
    let report = log.check();
    assert!(kinds(&report).contains(&"over_capacity"), "{report}");
    let Some(Violation::OverCapacity {
        at_ns,
        held,
        leases,
        ..
    }) = report.violations.first()
    else {
        panic!("{report}")
    };
    assert_eq!((*at_ns, *held, leases.len()), (30 * MS, 3, 3));
    let text = report.violations[0].to_string();
    assert!(text.contains("C1") && text.contains("fence 3"), "{text}");
    assert_eq!(report.stats.max_concurrent_weight["s"], 3);
}

#[test]
fn weighted_over_grant_is_caught_even_with_distinct_seats() {
    let mut log = Log::new("s", 3);
    log.lease(10, 50, 1, &[0, 1]);
    log.lease(20, 60, 2, &[2, 3]); // seat 3 is also out of range
    let k = kinds(&log.check());
    assert!(
        k.contains(&"over_capacity") && k.contains(&"seat_out_of_range"),
        "{k:?}"
    );
}

#[test]
fn lease_ends_at_its_last_valid_until_when_never_released() {
    // A holder killed at once: its lease is certainly held only until its valid_until,
    // so a successor after that point is no over-grant.
    let mut log = Log::new("s", 1);
    log.grant(10, 1, &[0], 30);
    log.lease(35, 50, 2, &[0]);
    log.check().assert_ok();

    // But a renewal it logged extends the interval, and then the successor overlaps.
    let mut log = Log::new("s", 1);
    let id = log.grant(10, 1, &[0], 30);
    log.push(
        20,
        EventKind::Renewed {
            lease_id: id,
            valid_until_ns: 40 * MS,
        },
    );
    log.lease(35, 50, 2, &[0]);
    let k = kinds(&log.check());
    assert!(
        k.contains(&"over_capacity") && k.contains(&"seat_collision"),
        "{k:?}"
    );
}

#[test]
fn lease_ends_at_its_lost_notice() {
    let mut log = Log::new("s", 1);
    let id = log.grant(10, 1, &[0], 100);
    log.push(
        20,
        EventKind::Lost {
            lease_id: id,
            reason: "gone".into(),
        },
    );
    log.lease(25, 50, 2, &[0]);
    let report = log.check();
    report.assert_ok();
    assert_eq!(report.stats.losses, 1);
}

#[test]
fn reused_fence_is_caught() {
    let mut log = Log::new("s", 2);
    log.lease(10, 20, 7, &[0]);
    log.lease(30, 40, 7, &[1]);
    let report = log.check();
    // Granted one after the other, so real-time order (C3) is broken too.
    assert_eq!(kinds(&report), ["fence_reused", "fence_order"], "{report}");
    assert!(report.violations[0]
        .to_string()
        .contains("fence 7 granted twice"));
}

#[test]
fn fence_going_backwards_on_a_seat_is_caught() {
    let mut log = Log::new("s", 2);
    log.lease(10, 20, 9, &[1]);
    log.lease(30, 40, 5, &[1]);
    let report = log.check();
    assert_eq!(
        kinds(&report),
        ["fence_order", "fence_not_increasing"],
        "{report}"
    );
    let Violation::FenceNotIncreasing {
        seat,
        earlier,
        later,
        ..
    } = &report.violations[1]
    else {
        unreachable!()
    };
    assert_eq!((*seat, earlier.fence, later.fence), (1, 9, 5));
}

#[test]
fn fences_may_go_backwards_across_different_seats() {
    // Fences increase per seat, not across seats: grant order is not end order.
    let mut log = Log::new("s", 2);
    log.lease(10, 20, 9, &[1]);
    log.lease(5, 40, 5, &[0]);
    log.check().assert_ok();
}

#[test]
fn colliding_seats_are_caught() {
    let mut log = Log::new("s", 3);
    log.lease(10, 50, 1, &[0, 1]);
    log.lease(20, 30, 2, &[1]);
    let report = log.check();
    assert_eq!(kinds(&report), ["seat_collision"], "{report}");
}

#[test]
fn seat_out_of_range_is_caught() {
    let mut log = Log::new("s", 2);
    log.lease(10, 20, 1, &[2]);
    let report = log.check();
    assert_eq!(kinds(&report), ["seat_out_of_range"], "{report}");
    assert!(report.violations[0]
        .to_string()
        .contains("seat 2 not in 0..2"));
}

#[test]
fn a_lease_must_hold_weight_distinct_seats() {
    let mut log = Log::new("s", 3);
    log.lease(10, 20, 1, &[1, 1]);
    let report = log.check();
    assert_eq!(kinds(&report), ["bad_seats_or_weight"], "{report}");
}

#[test]
fn capacity_may_be_passed_instead_of_logged() {
    let mut log = Log::default();
    log.lease(10, 20, 1, &[0]);
    assert_eq!(kinds(&log.check()), ["unknown_capacity"]);
    let caps = HashMap::from([("s".to_string(), 1)]);
    check(&log.events, &caps).assert_ok();
}

#[test]
fn outcomes_are_counted() {
    let mut log = correct_log();
    let timeout = AcquireMode::Timeout { timeout_ms: 1 };
    for (op, outcome, mode) in [
        // Explained by the timed-out waiter next to it.
        (90, Outcome::NoPermit, AcquireMode::TryAcquire),
        (91, Outcome::TimedOut, timeout),
        (
            92,
            Outcome::Error {
                message: "boom".into(),
            },
            AcquireMode::Acquire,
        ),
    ] {
        log.push(
            100,
            EventKind::AcquireInvoked {
                worker: "x".into(),
                op,
                sem: "s".into(),
                weight: 1,
                mode,
            },
        );
        log.push(
            101,
            EventKind::AcquireReturned {
                worker: "x".into(),
                op,
                outcome,
            },
        );
    }
    let report = log.check();
    report.assert_ok();
    let s = &report.stats;
    assert_eq!(
        (s.acquires, s.grants, s.no_permit, s.timed_out, s.errors),
        (8, 5, 1, 1, 1)
    );
}

/// A try-acquire of `weight` in flight over `[from, to]` that found no permit.
fn no_permit(log: &mut Log, from: u64, to: u64, weight: u32) {
    log.next += 1;
    let op = log.next;
    log.push(
        from,
        EventKind::AcquireInvoked {
            worker: "t".into(),
            op,
            sem: "s".into(),
            weight,
            mode: AcquireMode::TryAcquire,
        },
    );
    log.push(
        to,
        EventKind::AcquireReturned {
            worker: "t".into(),
            op,
            outcome: Outcome::NoPermit,
        },
    );
}

#[test]
fn no_permit_while_permits_are_held_is_explained() {
    let mut log = Log::new("s", 3);
    log.lease(10, 50, 1, &[0, 1]);
    no_permit(&mut log, 20, 21, 2);
    // The release was invoked at 50 but returns at 51: until then it is possibly held.
    no_permit(&mut log, 49, 50, 2);
    log.check().assert_ok();
}

#[test]
fn no_permit_while_someone_waits_is_explained() {
    // Free permits, but an acquire is in flight: it may be queued, and a try-acquire
    // never jumps the queue.
    let mut log = Log::new("s", 3);
    log.push(
        10,
        EventKind::AcquireInvoked {
            worker: "waiter".into(),
            op: 0,
            sem: "s".into(),
            weight: 3,
            mode: AcquireMode::Acquire,
        },
    );
    no_permit(&mut log, 20, 21, 1);
    log.check().assert_ok();
}

#[test]
fn no_permit_with_free_permits_and_no_waiter_is_caught() {
    let mut log = Log::new("s", 3);
    log.lease(10, 50, 1, &[0, 1]);
    no_permit(&mut log, 20, 21, 1);
    no_permit(&mut log, 60, 61, 3);
    let report = log.check();
    assert_eq!(
        kinds(&report),
        ["no_permit_unexplained", "no_permit_unexplained"],
        "{report}"
    );
    assert!(
        report.violations[0].to_string().contains("at most 2 of 3"),
        "{report}"
    );
}

#[test]
fn logs_round_trip_and_a_torn_last_line_is_tolerated() {
    let dir = tempfile::tempdir().unwrap();
    let log = correct_log();
    let (a, b) = log.events.split_at(log.events.len() / 2);
    let w = EventLog::create(dir.path().join("a.jsonl")).unwrap();
    a.iter().for_each(|e| w.write(e).unwrap());
    let w = EventLog::create(dir.path().join("b.jsonl")).unwrap();
    b.iter().for_each(|e| w.write(e).unwrap());
    drop(w);
    // A worker killed in the middle of a line.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("b.jsonl"))
        .unwrap();
    f.write_all(br#"{"t_ns":5,"event":"acqu"#).unwrap();
    std::fs::write(dir.path().join("ignored.txt"), "not a log").unwrap();

    let mut expected = log.events.clone();
    expected.sort_by_key(|e| e.t_ns);
    assert_eq!(read_logs(dir.path()).unwrap(), expected);

    // A broken line that is not the last one is an error.
    std::fs::write(dir.path().join("c.jsonl"), "garbage\n{}\n").unwrap();
    assert!(read_logs(dir.path()).is_err());
}

#[test]
fn instants_convert_to_the_monotonic_clock() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let now = monotonic_ns();
        let later = instant_to_ns(tokio::time::Instant::now() + std::time::Duration::from_secs(1));
        let d = later as i64 - now as i64 - 1_000_000_000;
        assert!(d.abs() < 50 * MS as i64, "off by {d} ns");
    });
}

#[test]
fn a_fence_below_one_granted_earlier_in_real_time_is_caught() {
    // Seats differ, so C2 cannot see it; C3 does.
    let mut log = Log::new("s", 2);
    log.lease(10, 20, 7, &[0]);
    log.lease(30, 40, 6, &[1]);
    let report = log.check();
    assert_eq!(kinds(&report), ["fence_order"], "{report}");
    assert!(report.violations[0].to_string().contains("C3 fence order"));
}

#[test]
fn a_timed_acquire_returning_late_is_caught() {
    let mut log = Log::new("s", 1);
    for (op, took) in [(1, 100), (2, 2000)] {
        log.push(
            10,
            EventKind::AcquireInvoked {
                worker: "x".into(),
                op,
                sem: "s".into(),
                weight: 1,
                mode: AcquireMode::Timeout { timeout_ms: 100 },
            },
        );
        log.push(
            10 + took,
            EventKind::AcquireReturned {
                worker: "x".into(),
                op,
                outcome: Outcome::TimedOut,
            },
        );
    }
    let report = log.check();
    assert_eq!(kinds(&report), ["deadline_missed"], "{report}");
    assert_eq!(report.max_deadline_overrun_ns, 1900 * MS);
}

/// A tenant's ceiling ([`tenant_sem`]) is checked like a capacity over that tenant's leases,
/// and explains that tenant's refusals while the semaphore has permits free (only then).
#[test]
fn a_tenants_ceiling_is_checked_and_explains_its_refusals() {
    let tenants = |log: &mut Log| {
        log.push(
            0,
            EventKind::Capacity {
                sem: tenant_sem("s", "a"),
                capacity: 1,
            },
        );
        for (worker, tenant) in [("w1", "a"), ("w2", "a"), ("w3", "b"), ("t", "a")] {
            let (worker, tenant) = (worker.into(), tenant.into());
            log.push(0, EventKind::Tenant { worker, tenant });
        }
    };
    let mut log = Log::new("s", 3);
    tenants(&mut log);
    log.lease(10, 30, 1, &[0]); // w1, tenant a
    log.lease(40, 60, 2, &[1]); // w2, tenant a, after w1
    log.lease(45, 70, 3, &[2]); // w3, tenant b
                                // Tenant a refused while w2 holds its one permit, with a permit of 3 free.
    no_permit(&mut log, 50, 52, 1);
    log.check().assert_ok();
    // Refused with nothing of tenant a held: not explained by its ceiling.
    no_permit(&mut log, 80, 82, 1);
    assert_eq!(kinds(&log.check()), ["no_permit_unexplained"]);

    // Two leases of tenant a at once: over its ceiling, within the capacity.
    let mut log = Log::new("s", 3);
    tenants(&mut log);
    log.lease(10, 50, 1, &[0]); // w1, tenant a
    log.lease(20, 40, 2, &[1]); // w2, tenant a
    let report = log.check();
    assert_eq!(kinds(&report), ["over_capacity"], "{report}");
}
