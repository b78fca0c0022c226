//! Replies read back from Redis: the parser of each script's reply (semaphore and rate
//! limiter), the lease and waiter records, and the wake-up payloads
//! (`tessera::fuzzing::redis_replies`). A reply is whatever the server sent (another
//! version's scripts, a key written by someone else), so it is arbitrary input.
//!
//! Properties, beyond "no panic": an unreadable reply is `Error::Corrupt`; the only other
//! errors are the answers a reply may carry (a capacity or rate-limit mismatch, a full queue,
//! no such semaphore).
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tessera::fuzzing::{redis_replies as parse, RedisValue as Value};
use tessera::backend::{AcquireRequest, Name, RateConfig, WaitSpec};
use tessera::{Error, LeaseId, RateMode, RateSpec};

/// A reply, shaped so the fuzzer reaches past the tag often.
#[derive(Arbitrary, Debug)]
enum V {
    Nil,
    Okay,
    Int(i64),
    Double(f64),
    Bool(bool),
    Bulk(Vec<u8>),
    Simple(String),
    Array(Vec<V>),
    Set(Vec<V>),
    Map(Vec<(V, V)>),
    /// A number as text, as Lua's `tostring` sends it.
    Num(u64),
    /// 32 hex digits.
    LeaseId(u128),
    /// A known tag.
    Tag(Tag),
    /// A lease record: weight, seats, fence, acquired_at, expires_at, client, holder.
    LeaseRecord(u32, Vec<u32>, u64, u64, u64, String, String),
    /// A waiter record: weight, lease ttl, enqueued_at, expires_at, client, holder.
    WaiterRecord(u32, u64, u64, u64, String, String),
    /// A stored rate configuration: `(count, period in µs)` limits, smooth burst.
    RateConfig(Vec<(u32, u64)>, Option<u32>),
    /// A rate log entry `t:P`.
    LogEntry(u64, u64),
    /// Pacing values `a,b,c`.
    Nums(Vec<u64>),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Tag {
    Granted,
    Queued,
    NoPermit,
    Mismatch,
    QueueFull,
    Waiting,
    Gone,
    Dequeued,
    Released,
    NotFound,
    Renewed,
    None,
    Status,
    Resized,
    Admitted,
    Limited,
    State,
}

fn bulk(s: String) -> Value {
    Value::BulkString(s.into_bytes())
}

fn config_text(limits: &[(u32, u64)], smooth: Option<u32>) -> String {
    let specs: Vec<RateSpec> = limits
        .iter()
        .filter_map(|&(n, us)| RateSpec::new(n, Duration::from_micros(us)).ok())
        .collect();
    let mode = match smooth {
        None => RateMode::Exact,
        Some(burst) => RateMode::Smooth { burst },
    };
    match RateConfig::new(&specs, mode) {
        Ok(c) => c.encode(),
        // Not a valid configuration: its text anyway, as a newer version might write.
        Err(_) => format!(
            "{}|{}",
            smooth.map_or("exact".to_string(), |b| format!("smooth:{b}")),
            limits
                .iter()
                .map(|(n, us)| format!("{n}/{us}us"))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

impl V {
    fn value(&self) -> Value {
        match self {
            V::Nil => Value::Nil,
            V::Okay => Value::Okay,
            V::Int(i) => Value::Int(*i),
            V::Double(d) => Value::Double(*d),
            V::Bool(b) => Value::Boolean(*b),
            V::Bulk(b) => Value::BulkString(b.clone()),
            V::Simple(s) => Value::SimpleString(s.clone()),
            V::Array(items) => Value::Array(items.iter().map(V::value).collect()),
            V::Set(items) => Value::Set(items.iter().map(V::value).collect()),
            V::Map(pairs) => {
                Value::Map(pairs.iter().map(|(k, v)| (k.value(), v.value())).collect())
            }
            V::Num(n) => bulk(n.to_string()),
            V::LeaseId(id) => bulk(format!("{id:032x}")),
            V::Tag(t) => bulk(
                match t {
                    Tag::Granted => "granted",
                    Tag::Queued => "queued",
                    Tag::NoPermit => "nopermit",
                    Tag::Mismatch => "mismatch",
                    Tag::QueueFull => "queuefull",
                    Tag::Waiting => "waiting",
                    Tag::Gone => "gone",
                    Tag::Dequeued => "dequeued",
                    Tag::Released => "released",
                    Tag::NotFound => "notfound",
                    Tag::Renewed => "renewed",
                    Tag::None => "none",
                    Tag::Status => "status",
                    Tag::Resized => "resized",
                    Tag::Admitted => "admitted",
                    Tag::Limited => "limited",
                    Tag::State => "state",
                }
                .to_string(),
            ),
            V::LeaseRecord(w, seats, fence, at, exp, client, holder) => bulk(format!(
                "{w}\t{}\t{fence}\t{at}\t{exp}\t{client}\t{holder}",
                join(seats)
            )),
            V::WaiterRecord(w, ttl, at, exp, client, holder) => {
                bulk(format!("{w}\t{ttl}\t{at}\t{exp}\t{client}\t{holder}"))
            }
            V::RateConfig(limits, smooth) => bulk(config_text(limits, *smooth)),
            V::LogEntry(t, p) => bulk(format!("{t}:{p}")),
            V::Nums(v) => bulk(join(v)),
        }
    }
}

/// A whole reply, or the two long ones built field by field so their insides are reached.
#[derive(Arbitrary, Debug)]
enum Reply {
    Any(V),
    /// `{status, capacity, used, now, {id, lease record, …}, {id, waiter record, …}}`.
    Status {
        capacity: V,
        used: V,
        now: V,
        leases: Vec<(V, V)>,
        waiters: Vec<(V, V)>,
    },
    /// `{state, now, config, seq, tail, last, prev_last, p, base, tat, prev_tat, log}`.
    RateState {
        now: u64,
        limits: Vec<(u32, u64)>,
        smooth: Option<u32>,
        counters: [u64; 6],
        tat: Vec<u64>,
        prev_tat: Vec<u64>,
        log: Vec<(u64, u64)>,
    },
}

impl Reply {
    fn value(&self) -> Value {
        let pairs = |v: &[(V, V)]| {
            Value::Array(v.iter().flat_map(|(a, b)| [a.value(), b.value()]).collect())
        };
        match self {
            Reply::Any(v) => v.value(),
            Reply::Status {
                capacity,
                used,
                now,
                leases,
                waiters,
            } => Value::Array(vec![
                V::Tag(Tag::Status).value(),
                capacity.value(),
                used.value(),
                now.value(),
                pairs(leases),
                pairs(waiters),
            ]),
            Reply::RateState {
                now,
                limits,
                smooth,
                counters,
                tat,
                prev_tat,
                log,
            } => {
                let mut f = vec![
                    V::Tag(Tag::State).value(),
                    V::Num(*now).value(),
                    V::RateConfig(limits.clone(), *smooth).value(),
                ];
                f.extend(counters.iter().map(|&c| V::Num(c).value()));
                f.push(V::Nums(tat.clone()).value());
                f.push(V::Nums(prev_tat.clone()).value());
                f.push(Value::Array(
                    log.iter()
                        .map(|&(t, p)| V::LogEntry(t, p).value())
                        .collect(),
                ));
                Value::Array(f)
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    reply: Reply,
    /// A wake-up payload or a record, as text.
    text: String,
    lease: u128,
    capacity: u32,
    waits: bool,
}

/// An unreadable reply must be `Corrupt`; `answers` says which other errors are answers.
fn check<T>(what: &str, r: Result<T, Error>, answer: impl Fn(&Error) -> bool) {
    if let Err(e) = r {
        assert!(e.is_corrupt() || answer(&e), "{what}: {e:?}");
        // Messages are bounded and printable (they quote what they could not read).
        let _ = e.to_string();
    }
}

fn none(_: &Error) -> bool {
    false
}

fuzz_target!(|input: Input| {
    let v = input.reply.value();
    let name = Name::new("fuzz").unwrap();
    let lease = LeaseId::from_u128(input.lease);
    let capacity = input.capacity.clamp(1, tessera::MAX_CAPACITY);
    let req = AcquireRequest {
        lease_id: lease,
        weight: 1,
        ttl: Duration::from_secs(30),
        holder: "fuzz".into(),
        wait: input.waits.then_some(WaitSpec {
            waiter_ttl: Duration::from_secs(3),
            queue_cap: 10,
        }),
    };
    let config = RateConfig::new(&[RateSpec::per_second(5).unwrap()], RateMode::Exact).unwrap();

    check(
        "acquire",
        parse::acquire(v.clone(), &name, capacity, &req),
        |e| e.is_capacity_mismatch() || e.is_queue_full(),
    );
    check("heartbeat", parse::heartbeat(v.clone(), lease), none);
    check("cancel", parse::cancel(v.clone()), none);
    check("release", parse::boolean(v.clone()), none);
    check("renew", parse::renew(v.clone()), none);
    let status = parse::status(v.clone(), &name);
    if let Ok(Some(s)) = &status {
        assert_eq!(s.available, s.capacity.saturating_sub(s.used));
    }
    check("status", status, none);
    check(
        "resize",
        parse::resize(v.clone(), &name),
        Error::is_not_found,
    );
    check(
        "rate acquire",
        parse::rate_acquire(v.clone(), &name, &config),
        Error::is_rate_mismatch,
    );
    let rate = parse::rate_status(v, &name);
    check("rate status", rate, none);

    let _ = parse::wake(&input.text);
    check(
        "lease record",
        parse::lease_record(lease, &input.text),
        none,
    );
    check(
        "waiter record",
        parse::waiter_record(lease, &input.text),
        none,
    );
});
