//! The atomic operations of the Redis store: one Lua script per operation (`scripts/*.lua`,
//! each behind the shared `prelude.lua`), their keys and arguments, and the parsing of their
//! replies into the model types.
//!
//! Every script follows the reference model ([`crate::stores::memory`]) step for step:
//! purge → hand off → decide → hand off → store/expire or delete the state → publish the
//! wake-ups, all inside one `FCALL` (or `EVALSHA`, see [`Library`]), on the clock of `TIME`. Unexpected replies are
//! [`Error::Corrupt`], never a panic.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Value;

use tessera_core::error::{Error, InvalidInput, Result};
use tessera_core::model::*;

const COMMON: &str = include_str!("scripts/common.lua");
const PRELUDE: &str = include_str!("scripts/prelude.lua");
const RATE_PRELUDE: &str = include_str!("scripts/rate_prelude.lua");
/// The admission prelude (after the semaphore's), with the rate prelude in its place.
static ADMISSION: LazyLock<String> =
    LazyLock::new(|| include_str!("scripts/admission.lua").replace("@RATE_PRELUDE@", RATE_PRELUDE));

/// One atomic step of the store: a script file run behind its prelude.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Heartbeat,
    Cancel,
    Release,
    Renew,
    Status,
    Resize,
    Revoke,
    Delete,
    RateAcquire,
    RateCancel,
    RateStatus,
    RateDelete,
    Admit,
    GiveBack,
    Settle,
    SetLimits,
    Limits,
}

/// The text in front of an operation's script, after common.lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prelude {
    Semaphore,
    Rate,
    /// The semaphore's prelude and `admission.lua` (the rate prelude inside it).
    Admission,
}

impl Prelude {
    /// The library's blocks: the admission's sits in the semaphore's block, after it.
    const BLOCKS: [&[Prelude]; 2] = [&[Prelude::Semaphore, Prelude::Admission], &[Prelude::Rate]];

    fn text(self) -> &'static str {
        match self {
            Prelude::Semaphore => PRELUDE,
            Prelude::Rate => RATE_PRELUDE,
            Prelude::Admission => &ADMISSION,
        }
    }

    /// How a script of this prelude starts.
    fn begin(self) -> &'static str {
        match self {
            Prelude::Admission => "begin_admission(KEYS, ARGV)",
            _ => "begin(KEYS, ARGV)",
        }
    }
}

impl Op {
    const ALL: [Op; 18] = [
        Op::Acquire,
        Op::Heartbeat,
        Op::Cancel,
        Op::Release,
        Op::Renew,
        Op::Status,
        Op::Resize,
        Op::Revoke,
        Op::Delete,
        Op::RateAcquire,
        Op::RateCancel,
        Op::RateStatus,
        Op::RateDelete,
        Op::Admit,
        Op::GiveBack,
        Op::Settle,
        Op::SetLimits,
        Op::Limits,
    ];

    /// The function's name suffix, and the script's body.
    fn source(self) -> (&'static str, &'static str) {
        match self {
            Op::Acquire => ("acquire", include_str!("scripts/acquire.lua")),
            Op::Heartbeat => ("heartbeat", include_str!("scripts/heartbeat.lua")),
            Op::Cancel => ("cancel", include_str!("scripts/cancel.lua")),
            Op::Release => ("release", include_str!("scripts/release.lua")),
            Op::Renew => ("renew", include_str!("scripts/renew.lua")),
            Op::Status => ("status", include_str!("scripts/status.lua")),
            Op::Resize => ("resize", include_str!("scripts/resize.lua")),
            Op::Revoke => ("revoke", include_str!("scripts/revoke.lua")),
            Op::Delete => ("delete", include_str!("scripts/delete.lua")),
            Op::RateAcquire => ("rate_acquire", include_str!("scripts/rate_acquire.lua")),
            Op::RateCancel => ("rate_cancel", include_str!("scripts/rate_cancel.lua")),
            Op::RateStatus => ("rate_status", include_str!("scripts/rate_status.lua")),
            Op::RateDelete => ("rate_delete", include_str!("scripts/rate_delete.lua")),
            Op::Admit => ("admit", include_str!("scripts/admit.lua")),
            Op::GiveBack => ("give_back", include_str!("scripts/give_back.lua")),
            Op::Settle => ("settle", include_str!("scripts/settle.lua")),
            Op::SetLimits => ("set_limits", include_str!("scripts/set_limits.lua")),
            Op::Limits => ("limits", include_str!("scripts/limits.lua")),
        }
    }

    /// Whether the operation runs when Redis is out of memory (`maxmemory` reached under
    /// `noeviction`): the ones that free memory or only keep what exists (release, cancel,
    /// revoke, delete, renewals, waiter heartbeats, status) do, so holders keep their leases
    /// and can give them back; the ones that add state (acquire, resize, a rate charge) are
    /// refused by Redis with its `OOM` error. (A function without the flag is refused whole
    /// under OOM, even when it would only delete; the `EVALSHA` fallback is refused only at a
    /// command that may grow memory.) A settle runs too: it releases a lease, and the excess
    /// it may charge (one log entry) is a call already made, which the windows must count.
    fn allow_oom(self) -> bool {
        !matches!(
            self,
            Op::Acquire | Op::Resize | Op::RateAcquire | Op::Admit | Op::SetLimits
        )
    }

    /// Whether the operation may change the state (everything but the status reads), so a
    /// `?wait=N` client waits for replicas after it.
    pub(crate) fn may_write(self) -> bool {
        !matches!(self, Op::Status | Op::RateStatus | Op::Limits)
    }

    fn prelude(self) -> Prelude {
        match self {
            Op::RateAcquire | Op::RateCancel | Op::RateStatus | Op::RateDelete => Prelude::Rate,
            Op::Admit | Op::GiveBack | Op::Settle => Prelude::Admission,
            _ => Prelude::Semaphore,
        }
    }
}

/// The operations in their two runnable forms.
///
/// - A Redis Functions library (Redis 7+), loaded once with `FUNCTION LOAD` and called with
///   `FCALL`: the helpers of common.lua and the preludes are defined once, at load, so a call
///   costs Redis little more than the commands it runs. Its name carries a hash of its code
///   (`tessera_<hash>`), so clients of different versions never call each other's code, and
///   a newer library never replaces an older one under a running client.
/// - One script per operation for `EVALSHA` (common.lua + prelude + body): the fallback where
///   functions are missing (Redis 6) or may not be loaded (an ACL without `FUNCTION LOAD` and
///   no library loaded by an administrator).
///
/// Both run the same text: each body starts after `begin(KEYS, ARGV)`, which reads the clock
/// and resets the per-call values that a library keeps between calls.
pub(crate) struct Library {
    /// The library's name, `tessera_<hash>`.
    pub(crate) name: String,
    /// The `FUNCTION LOAD` payload.
    pub(crate) code: String,
    functions: Vec<String>,
    scripts: Vec<redis::Script>,
}

impl Library {
    fn build() -> Library {
        let mut body = String::from(COMMON);
        for block in Prelude::BLOCKS {
            // One block per prelude: the semaphore and rate helpers share names. The
            // admission's prelude extends the semaphore's, in its block.
            body.push_str("\ndo\n");
            for &prelude in block {
                body.push_str(prelude.text());
                for op in Op::ALL.into_iter().filter(|op| op.prelude() == prelude) {
                    let (suffix, script) = op.source();
                    let flags = if op.allow_oom() { "'allow-oom'" } else { "" };
                    let begin = prelude.begin();
                    body.push_str(&format!(
                        "\nredis.register_function{{function_name = '@LIB@_{suffix}', \
                         flags = {{{flags}}}, callback = function(KEYS, ARGV)\n\
                         {begin}\n{script}\nend}}\n"
                    ));
                }
            }
            body.push_str("end\n");
        }
        let hash = redis::Script::new(&body).get_hash().to_string();
        let name = format!("tessera_{}", &hash[..16]);
        let code = format!("#!lua name={name}\n{}", body.replace("@LIB@", &name));
        Library {
            functions: Op::ALL
                .iter()
                .map(|op| format!("{name}_{}", op.source().0))
                .collect(),
            scripts: Op::ALL
                .iter()
                .map(|op| {
                    let prelude = op.prelude();
                    let text = match prelude {
                        Prelude::Admission => format!("{PRELUDE}\n{}", prelude.text()),
                        other => other.text().to_string(),
                    };
                    redis::Script::new(&format!(
                        "{COMMON}\n{text}\n{}\n{}",
                        prelude.begin(),
                        op.source().1
                    ))
                })
                .collect(),
            name,
            code,
        }
    }

    /// The library, built once per process.
    pub(crate) fn get() -> &'static Library {
        static LIBRARY: LazyLock<Library> = LazyLock::new(Library::build);
        &LIBRARY
    }

    /// The function that runs `op`.
    pub(crate) fn function(&self, op: Op) -> &str {
        &self.functions[op as usize]
    }

    /// The `EVALSHA` script that runs `op`.
    pub(crate) fn script(&self, op: Op) -> &redis::Script {
        &self.scripts[op as usize]
    }
}

/// The key suffixes of one semaphore's state, in the order a script receives them on a
/// cluster (see `prelude.lua`).
const KEY_SUFFIXES: [&str; 10] = [
    "meta", "holders", "leases", "queue", "waiters", "wexp", "seats", "fence", "tags", "limits",
];

/// An acquire's or admission's arguments followed by its tenant and share (`acquire.lua`,
/// `admit.lua`; `docs/fair-shares.md`), `''` and `''` for none, and with `first_send` the
/// acquire's mark of a first send (`acquire.lua`).
pub(crate) fn with_tenant_and_mark(
    args: &[String],
    tenant: Option<&Tenant>,
    first_send: bool,
) -> Vec<String> {
    let mut all = Vec::with_capacity(args.len() + 3);
    all.extend_from_slice(args);
    match tenant {
        Some(t) => {
            all.push(t.name().to_string());
            all.push(t.share().to_string());
        }
        None => all.extend([String::new(), String::new()]),
    }
    if first_send {
        all.push("1".to_string());
    }
    all
}

/// The keys a semaphore script is called with, all under the hash tag `{<prefix>:<name>}`:
/// the meta key alone, from which the script derives the others (each key an `FCALL` names
/// costs Redis about 1,000 instructions per call), or, with `all` (a cluster), every key
/// of the state, so that Redis refuses the call whole while the slot migrates.
pub(crate) fn keys(prefix: &str, name: &Name, all: bool) -> Vec<String> {
    // Built by hand: this runs twice per acquire+release pair, and `format!` (which grows
    // its buffer step by step) was a fifth of the client's instructions in `bench w1`.
    let tag_len = prefix.len() + name.as_str().len() + 4;
    let suffixes = if all {
        &KEY_SUFFIXES[..]
    } else {
        &KEY_SUFFIXES[..1]
    };
    suffixes
        .iter()
        .map(|s| {
            let mut key = String::with_capacity(tag_len + s.len());
            key.push('{');
            key.push_str(prefix);
            key.push(':');
            key.push_str(name.as_str());
            key.push_str("}:");
            key.push_str(s);
            key
        })
        .collect()
}

/// The wake channel base on a cluster: `{<prefix>:<name>}:wake:`, in the semaphore's slot,
/// so the scripts publish with `SPUBLISH` on the shard that runs them (see `prelude.lua`)
/// and a client listens with `SSUBSCRIBE` on `<base><client id>`.
pub(crate) fn cluster_wake_base(prefix: &str, name: &Name) -> String {
    format!("{{{prefix}:{name}}}:wake:")
}

/// The `SCAN` pattern matching the meta key of every semaphore under `prefix`, and the name
/// inside such a key. Prefixes and names never contain glob characters or braces.
pub(crate) fn meta_pattern(prefix: &str) -> String {
    format!("{{{prefix}:*}}:meta")
}

pub(crate) fn name_of_meta_key(prefix: &str, key: &str) -> Option<Name> {
    let inner = key
        .strip_prefix(&format!("{{{prefix}:"))?
        .strip_suffix("}:meta")?;
    Name::new(inner).ok()
}

/// The client-id suffix that asks the scripts to push grants with wake-ups (`GRANT_PUSH` in
/// `prelude.lua`).
pub(crate) const GRANT_PUSH: &str = ".g";

/// The client-id suffix, followed by the replicas of `?wait=N`, that asks the scripts to
/// leave hand-off grants to the caller, who publishes them once its `WAIT` counted N
/// replicas (`GRANT_RELAY` in `prelude.lua`).
pub(crate) const GRANT_RELAY: &str = ".r";

/// A wake-up payload: `<lease id>` or `<lease id>\t<now>\t<lease record>` (a grant); `None`
/// if unreadable. A grant whose record cannot be read degrades to a plain wake-up, after
/// which the waiter asks the store.
pub(crate) fn parse_wake(payload: &str) -> Option<(LeaseId, Option<Grant>)> {
    let (id, rest) = match payload.split_once('\t') {
        Some((id, rest)) => (id, Some(rest)),
        None => (payload, None),
    };
    let lease: LeaseId = id.parse().ok()?;
    let grant = rest.and_then(|rest| {
        let (now, record) = rest.split_once('\t')?;
        Some(Grant {
            now: StoreTime(now.parse().ok()?),
            lease: decode_lease(lease, record).ok()?,
        })
    });
    Some((lease, grant))
}

pub(crate) fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

// ---- reply parsing -------------------------------------------------------------------------

pub(super) fn corrupt(what: &str, v: &Value) -> Error {
    let mut shown = format!("{v:?}");
    if shown.len() > 200 {
        let mut end = 200;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        shown.push('…');
    }
    Error::Corrupt(format!(
        "unexpected reply from a tessera script ({what}): {shown}"
    ))
}

pub(super) fn items(v: Value, what: &str) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        other => Err(corrupt(what, &other)),
    }
}

pub(super) fn text(v: &Value, what: &str) -> Result<String> {
    text_ref(v, what).map(str::to_string)
}

/// The text of a string reply, borrowed.
fn text_ref<'a>(v: &'a Value, what: &str) -> Result<&'a str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).map_err(|_| corrupt(what, v)),
        Value::SimpleString(s) => Ok(s),
        Value::VerbatimString { text, .. } => Ok(text),
        other => Err(corrupt(what, other)),
    }
}

/// The items of an array reply, borrowed.
fn items_ref<'a>(v: &'a Value, what: &str) -> Result<&'a [Value]> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        other => Err(corrupt(what, other)),
    }
}

pub(super) fn int(v: &Value, what: &str) -> Result<u64> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as u64),
        Value::BulkString(_) | Value::SimpleString(_) => {
            text_ref(v, what)?.parse().map_err(|_| corrupt(what, v))
        }
        other => Err(corrupt(what, other)),
    }
}

fn int_u32(v: &Value, what: &str) -> Result<u32> {
    u32::try_from(int(v, what)?).map_err(|_| corrupt(what, v))
}

/// A reply `{tag, fields…}`: the tag and the fields.
fn tagged<'a>(v: &'a Value, what: &str) -> Result<(&'a str, &'a [Value])> {
    match items_ref(v, what)? {
        [tag, fields @ ..] => Ok((text_ref(tag, what)?, fields)),
        [] => Err(corrupt(what, v)),
    }
}

fn field<'a>(fields: &'a [Value], i: usize, what: &str) -> Result<&'a Value> {
    fields
        .get(i)
        .ok_or_else(|| Error::Corrupt(format!("reply of {what} is missing field {i}")))
}

fn bad_record(what: &str, record: &str) -> Error {
    let shown: String = record.chars().take(200).collect();
    Error::Corrupt(format!("unreadable {what} record in the store: {shown:?}"))
}

fn parse_num<T: std::str::FromStr>(s: &str, what: &str, record: &str) -> Result<T> {
    s.parse().map_err(|_| bad_record(what, record))
}

/// A lease record: weight, seats, fence, acquired_at, expires_at, client, holder, and the
/// tenant if the request named one (tabs; see `prelude.lua`). A record of a build before
/// tenants were kept ends with the holder: no tenant.
pub(crate) fn decode_lease(id: LeaseId, record: &str) -> Result<Lease> {
    let f: Vec<&str> = record.splitn(8, '\t').collect();
    if !(7..=8).contains(&f.len()) || f.get(7).is_some_and(|t| t.is_empty()) {
        return Err(bad_record("lease", record));
    }
    let seats = if f[1].is_empty() {
        Vec::new()
    } else {
        f[1].split(',')
            .map(|s| parse_num(s, "lease", record))
            .collect::<Result<Vec<u32>>>()?
    };
    Ok(Lease {
        lease_id: id,
        weight: parse_num(f[0], "lease", record)?,
        seats,
        fence: parse_num(f[2], "lease", record)?,
        holder: f[6].to_string(),
        acquired_at: StoreTime(parse_num(f[3], "lease", record)?),
        expires_at: StoreTime(parse_num(f[4], "lease", record)?),
        tenant: f.get(7).map(|t| t.to_string()),
    })
}

/// A waiter record: weight, lease ttl, enqueued_at, expires_at, client, holder, an admission
/// waiter's gate, and a tenant's waiter's tenant after the gate (empty then for a plain
/// waiter) (tabs; see `prelude.lua`).
pub(crate) fn decode_waiter(id: LeaseId, record: &str) -> Result<Waiter> {
    let f: Vec<&str> = record.split('\t').collect();
    let shape_ok = match (f.get(6), f.get(7)) {
        (None, _) => true,
        (Some(gate), None) => gate.parse::<u64>().is_ok(),
        (Some(gate), Some(tenant)) => {
            (gate.is_empty() || gate.parse::<u64>().is_ok()) && !tenant.is_empty()
        }
    };
    if !(6..=8).contains(&f.len()) || !shape_ok {
        return Err(bad_record("waiter", record));
    }
    Ok(Waiter {
        lease_id: id,
        weight: parse_num(f[0], "waiter", record)?,
        holder: f[5].to_string(),
        enqueued_at: StoreTime(parse_num(f[2], "waiter", record)?),
        expires_at: StoreTime(parse_num(f[3], "waiter", record)?),
        tenant: f.get(7).map(|t| t.to_string()),
    })
}

fn lease_id(v: &Value, what: &str) -> Result<LeaseId> {
    text_ref(v, what)?.parse().map_err(|_| corrupt(what, v))
}

/// `now, lease record` after a `granted` tag.
fn grant(id: LeaseId, fields: &[Value], what: &str) -> Result<Grant> {
    let now = StoreTime(int(field(fields, 0, what)?, what)?);
    let lease = decode_lease(id, text_ref(field(fields, 1, what)?, what)?)?;
    Ok(Grant { lease, now })
}

pub(crate) fn parse_acquire(
    v: Value,
    name: &Name,
    capacity: u32,
    req: &AcquireRequest,
) -> Result<AcquireReply> {
    const W: &str = "acquire";
    let (tag, f) = tagged(&v, W)?;
    match tag {
        "granted" => Ok(AcquireReply::Granted(grant(req.lease_id, f, W)?)),
        "queued" => Ok(AcquireReply::Queued {
            position: int(field(f, 0, W)?, W)?,
        }),
        "nopermit" => Ok(AcquireReply::NoPermit {
            available: int_u32(field(f, 0, W)?, W)?,
            queued: int(field(f, 1, W)?, W)?,
        }),
        "mismatch" => Err(Error::CapacityMismatch {
            name: name.to_string(),
            stored: int_u32(field(f, 0, W)?, W)?,
            declared: capacity,
        }),
        "queuefull" => Err(Error::QueueFull {
            name: name.to_string(),
            cap: req.wait.map(|w| w.queue_cap).unwrap_or(0),
        }),
        _ => Err(corrupt(W, &v)),
    }
}

/// The `purge_at` of a state that can expire nothing (prelude.lua's `NEVER`).
const NEVER: u64 = 9_007_199_254_740_991;

/// How long until an expiry may free permits, from a `queued` (acquire) or `waiting`
/// (heartbeat) reply: they carry the step's `now` and the state's `purge_at`, a lower bound of
/// every lease and queue entry expiry (see `Backend::next_expiry`). `None` for other replies,
/// when nothing can expire, or when expired entries are still being purged.
pub(crate) fn expiry_in(v: &Value) -> Option<Duration> {
    const W: &str = "expiry";
    let (tag, f) = tagged(v, W).ok()?;
    let at = match tag {
        "queued" => 1,
        "waiting" => 0,
        _ => return None,
    };
    let now = int(f.get(at)?, W).ok()?;
    let purge_at = int(f.get(at + 1)?, W).ok()?;
    // `purge_at` at or before `now`: the step left expired entries to purge (it purges in
    // bounded batches) and woke the head of the queue to go on; every waiter need not.
    (now < purge_at && purge_at < NEVER).then(|| Duration::from_micros(purge_at - now))
}

pub(crate) fn parse_heartbeat(v: Value, lease: LeaseId) -> Result<WaitReply> {
    const W: &str = "heartbeat";
    let (tag, f) = tagged(&v, W)?;
    match tag {
        "granted" => Ok(WaitReply::Granted(grant(lease, f, W)?)),
        "waiting" => Ok(WaitReply::Waiting),
        "gone" => Ok(WaitReply::Gone),
        _ => Err(corrupt(W, &v)),
    }
}

pub(crate) fn parse_cancel(v: Value) -> Result<CancelReply> {
    const W: &str = "cancel";
    let (tag, _) = tagged(&v, W)?;
    match tag {
        "dequeued" => Ok(CancelReply::Dequeued),
        "released" => Ok(CancelReply::Released),
        "notfound" => Ok(CancelReply::NotFound),
        _ => Err(corrupt(W, &v)),
    }
}

/// `1` or `0` (release, revoke, delete).
pub(crate) fn parse_bool(v: Value, what: &str) -> Result<bool> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(corrupt(what, &other)),
    }
}

pub(crate) fn parse_renew(v: Value) -> Result<RenewReply> {
    const W: &str = "renew";
    let (tag, f) = tagged(&v, W)?;
    match tag {
        "renewed" => Ok(RenewReply::Renewed {
            expires_at: StoreTime(int(field(f, 0, W)?, W)?),
            now: StoreTime(int(field(f, 1, W)?, W)?),
        }),
        "gone" => Ok(RenewReply::Gone),
        _ => Err(corrupt(W, &v)),
    }
}

pub(crate) fn parse_status(v: Value, name: &Name) -> Result<Option<SemaphoreStatus>> {
    const W: &str = "status";
    let (tag, f) = tagged(&v, W)?;
    match tag {
        "none" => return Ok(None),
        "status" if f.len() == 5 => {}
        _ => return Err(corrupt(W, &v)),
    }
    let capacity = int_u32(&f[0], W)?;
    let used = int_u32(&f[1], W)?;
    let now = StoreTime(int(&f[2], W)?);
    let leases = items_ref(&f[3], W)?;
    let waiters = items_ref(&f[4], W)?;
    if leases.len() % 2 != 0 || waiters.len() % 2 != 0 {
        return Err(corrupt(W, &v));
    }
    let mut holders = leases
        .chunks(2)
        .map(|p| decode_lease(lease_id(&p[0], W)?, text_ref(&p[1], W)?))
        .collect::<Result<Vec<Lease>>>()?;
    holders.sort_by_key(|l| (l.acquired_at, l.fence));
    let queue = waiters
        .chunks(2)
        .map(|p| decode_waiter(lease_id(&p[0], W)?, text_ref(&p[1], W)?))
        .collect::<Result<Vec<Waiter>>>()?;
    Ok(Some(SemaphoreStatus::new(
        name, capacity, used, now, holders, queue,
    )))
}

/// The arguments of `set_limits.lua`: the tenant, then its ceiling (empty for none), floor
/// and window ceiling if any, or nothing more to remove its limits.
pub(crate) fn limits_args(tenant: &str, limits: TenantLimits) -> Vec<String> {
    let mut args = vec![tenant.to_string()];
    if !limits.is_none() {
        args.push(limits.ceiling.map_or_else(String::new, |c| c.to_string()));
        args.push(limits.floor.to_string());
        if let Some(percent) = limits.window_ceiling {
            args.push(percent.to_string());
        }
    }
    args
}

/// The reply of `set_limits.lua`: `set`, or floors that would not fit the capacity
/// ([`Error::InvalidInput`]).
pub(crate) fn parse_set_limits(v: Value, name: &Name) -> Result<()> {
    const W: &str = "set limits";
    let (tag, f) = tagged(&v, W)?;
    match tag {
        "set" => Ok(()),
        "floors" => Err(Error::InvalidInput(InvalidInput::Other(format!(
            "the floors on {name} would add up to {}, above its capacity {}",
            int(field(f, 0, W)?, W)?,
            int(field(f, 1, W)?, W)?
        )))),
        _ => Err(corrupt(W, &v)),
    }
}

/// One tenant's limits as `limits.lua` returns them: `<ceiling>,<floor>` (ceiling empty for
/// none), as written before window ceilings (none), or `<ceiling>,<floor>,<window
/// ceiling>[,<window-capped until>]` (the instant is the store's own, not a limit).
fn parse_tenant_limits(record: &str) -> Result<TenantLimits> {
    let bad = || bad_record("tenant limits", record);
    let mut fields = record.split(',');
    let (Some(ceiling), Some(floor)) = (fields.next(), fields.next()) else {
        return Err(bad());
    };
    let ceiling = match ceiling {
        "" => None,
        c => Some(c.parse().map_err(|_| bad())?),
    };
    let window = fields
        .next()
        .map(|w| w.parse::<u8>().map_err(|_| bad()))
        .transpose()?;
    match fields.next() {
        Some(until) if until.is_empty() || until.parse::<u64>().is_ok() => {}
        Some(_) => return Err(bad()),
        None => {}
    }
    if fields.next().is_some() {
        return Err(bad());
    }
    TenantLimits::new(ceiling, floor.parse().map_err(|_| bad())?)
        .and_then(|l| l.with_window_ceiling(window))
        .map_err(|_| bad())
}

/// The reply of `limits.lua`: `tenant, limits` pairs (see [`parse_tenant_limits`]).
pub(crate) fn parse_limits(v: Value) -> Result<BTreeMap<String, TenantLimits>> {
    const W: &str = "limits";
    let pairs = items_ref(&v, W)?;
    if pairs.len() % 2 != 0 {
        return Err(corrupt(W, &v));
    }
    pairs
        .chunks(2)
        .map(|p| Ok((text(&p[0], W)?, parse_tenant_limits(text_ref(&p[1], W)?)?)))
        .collect()
}

/// `Ok(old capacity)`, or [`Error::NotFound`].
pub(crate) fn parse_resize(v: Value, name: &Name) -> Result<u32> {
    const W: &str = "resize";
    let (tag, f) = tagged(&v, W)?;
    match tag {
        "resized" => int_u32(field(f, 0, W)?, W),
        "notfound" => Err(Error::NotFound(format!(
            "semaphore \"{name}\" has no holders or waiters (its capacity is set by the clients that use it)"
        ))),
        _ => Err(corrupt(W, &v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn records_round_trip_and_reject_garbage() {
        let id = LeaseId::from_u128(7);
        // A record of a build before tenants were kept, and one with a tenant after the holder.
        let l = decode_lease(id, "2\t0,3\t99\t10\t20\tc1\thost/1").unwrap();
        assert_eq!((l.holder.as_str(), l.tenant.as_deref()), ("host/1", None));
        let l = decode_lease(id, "2\t0,3\t99\t10\t20\tc1\thost/1\tsms team").unwrap();
        assert_eq!(l.seats, vec![0, 3]);
        assert_eq!(
            (l.holder.as_str(), l.tenant.as_deref()),
            ("host/1", Some("sms team"))
        );
        assert!(decode_lease(id, "2\t0,3\t99\t10\t20\tc1\th\t")
            .unwrap_err()
            .is_corrupt());
        assert_eq!(
            (l.fence, l.acquired_at, l.expires_at),
            (99, StoreTime(10), StoreTime(20))
        );
        assert!(decode_lease(id, "x\t0\t1\t2\t3\tc\th")
            .unwrap_err()
            .is_corrupt());
        assert!(decode_lease(id, "1\t0").unwrap_err().is_corrupt());
        let w = decode_waiter(id, "1\t5000\t10\t20\tc\th").unwrap();
        assert_eq!((w.weight, w.expires_at), (1, StoreTime(20)));
        assert!(decode_waiter(id, "").unwrap_err().is_corrupt());
        // An admission waiter's gate follows its holder.
        let w = decode_waiter(id, "2\t5000\t10\t20\tc\th/1\t99").unwrap();
        assert_eq!((w.weight, w.holder.as_str()), (2, "h/1"));
        assert!(decode_waiter(id, "1\t5000\t10\t20\tc\th\tx")
            .unwrap_err()
            .is_corrupt());
        // A tenant's waiter: its tenant after the gate, empty for a plain waiter.
        let w = decode_waiter(id, "1\t5000\t10\t20\tc\th\t\t7").unwrap();
        assert_eq!((w.holder.as_str(), w.tenant.as_deref()), ("h", Some("7")));
        let w = decode_waiter(id, "1\t5000\t10\t20\tc\th\t99\tsms").unwrap();
        assert_eq!(w.tenant.as_deref(), Some("sms"));
        assert_eq!(
            decode_waiter(id, "1\t5000\t10\t20\tc\th").unwrap().tenant,
            None
        );
        for bad in ["1\t5000\t10\t20\tc\th\t\t", "1\t5000\t10\t20\tc\th\tx\tsms"] {
            assert!(decode_waiter(id, bad).unwrap_err().is_corrupt(), "{bad:?}");
        }
    }

    #[test]
    fn unexpected_replies_are_corrupt_not_panics() {
        let name = Name::new("n").unwrap();
        for v in [
            Value::Nil,
            Value::Int(3),
            Value::Array(vec![]),
            Value::Array(vec![bulk("granted")]),
            Value::Array(vec![bulk("granted"), Value::Int(1), bulk("junk")]),
            Value::Array(vec![bulk("status"), Value::Int(1)]),
            Value::Array(vec![bulk("weird")]),
        ] {
            assert!(parse_heartbeat(v.clone(), LeaseId::from_u128(1))
                .unwrap_err()
                .is_corrupt());
            assert!(parse_status(v.clone(), &name).unwrap_err().is_corrupt());
            assert!(parse_renew(v.clone()).unwrap_err().is_corrupt());
            assert!(parse_bool(v, "release").unwrap_err().is_corrupt());
        }
    }

    #[test]
    fn wake_payloads_are_bare_ids_or_grants() {
        let id = LeaseId::from_u128(9);
        assert_eq!(parse_wake(&id.to_string()), Some((id, None)));
        let (l, g) = parse_wake(&format!("{id}\t15\t1\t2\t7\t10\t40\tc.g\th")).unwrap();
        let g = g.unwrap();
        assert_eq!(
            (l, g.now, g.lease.seats.clone()),
            (id, StoreTime(15), vec![2])
        );
        assert_eq!(g.lease.expires_at, StoreTime(40));
        // An unreadable grant is still a wake-up; garbage is nothing.
        assert_eq!(parse_wake(&format!("{id}\tx\ty")), Some((id, None)));
        assert_eq!(parse_wake("junk"), None);
    }

    #[test]
    fn tenant_limits_read_with_and_without_a_window_ceiling() {
        let limits = |c: Option<u32>, f: u32, w: Option<u8>| {
            TenantLimits::new(c, f)
                .unwrap()
                .with_window_ceiling(w)
                .unwrap()
        };
        // As written before window ceilings: none.
        assert_eq!(
            parse_tenant_limits("5,1").unwrap(),
            limits(Some(5), 1, None)
        );
        assert_eq!(parse_tenant_limits(",2").unwrap(), limits(None, 2, None));
        assert_eq!(
            parse_tenant_limits(",0,20").unwrap(),
            limits(None, 0, Some(20))
        );
        // The window-capped instant is the store's own, not a limit.
        assert_eq!(
            parse_tenant_limits("3,0,100,1765000000000000").unwrap(),
            limits(Some(3), 0, Some(100))
        );
        for bad in [
            "",
            "5",
            "x,0",
            ",0,0",
            ",0,101",
            ",0,20,x",
            ",0,20,1,2",
            ",0,,1",
        ] {
            assert!(
                matches!(parse_tenant_limits(bad), Err(Error::Corrupt(_))),
                "{bad:?}"
            );
        }
        // Written as they are read; a window ceiling only when there is one.
        assert_eq!(limits_args("t", limits(Some(5), 1, None)), ["t", "5", "1"]);
        assert_eq!(
            limits_args("t", limits(None, 0, Some(20))),
            ["t", "", "0", "20"]
        );
        assert_eq!(limits_args("t", TenantLimits::default()), ["t"]);
    }

    #[test]
    fn keys_share_one_hash_tag_and_the_meta_key_comes_first() {
        let name = Name::new("jobs/a:b").unwrap();
        let all = keys("tessera", &name, true);
        assert_eq!(all.len(), 10);
        assert!(all.iter().all(|k| k.starts_with("{tessera:jobs/a:b}:")));
        assert_eq!(keys("tessera", &name, false), ["{tessera:jobs/a:b}:meta"]);
        assert_eq!(all[0], "{tessera:jobs/a:b}:meta");
        assert_eq!(
            name_of_meta_key("tessera", &all[0]).unwrap().as_str(),
            "jobs/a:b"
        );
        assert!(name_of_meta_key("other", &all[0]).is_none());
    }
}
