//! `tessera status`: capacity, holders and queue of one semaphore and the usage of the rate
//! limiter of the same name, or a line per semaphore and per limiter.
//!
//! A store keeps a semaphore only while it is held or waited for: the last release (or the
//! expiry of the last lease) removes it, and the next client declares its capacity again. So
//! a released semaphore has nothing to show, unlike a rate limiter, whose history is kept for
//! its longest window; the output says so rather than leaving the semaphores out silently. A
//! semaphore the store still lists but whose every lease has run out (a holder killed, its
//! TTL past, nobody else using the name since) shows once as expired: reading its status
//! removes it.

use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use tessera::backend::Name;
use tessera::{RateStatus, SemaphoreStatus, Store};

use crate::exit::{self, Failure, Outcome};
use crate::store_url::Existing;

/// The arguments of `tessera status`.
#[derive(Debug, Clone)]
pub struct StatusArgs {
    pub name: Option<String>,
    pub json: bool,
    /// Refresh every interval until Ctrl-C.
    pub watch: Option<Duration>,
}

/// Runs `tessera status`.
pub async fn status(store_url: Option<&str>, args: StatusArgs) -> Outcome {
    if let Some(name) = &args.name {
        Name::new(name.as_str())?;
    }
    if let Some(every) = args.watch {
        if every.is_zero() {
            return Err(Failure::new(
                exit::USAGE,
                "--watch interval must be above zero",
            ));
        }
    }
    // Opening creates nothing: a missing store is shown as "nothing yet", like an empty one.
    let opened = crate::store_url::open_existing(store_url).await?;
    let Some(every) = args.watch else {
        let (text, code) = match &opened {
            Existing::Open(store) => render(store, &args).await?,
            Existing::Missing { url, reason } => render_missing(url, reason, &args),
        };
        print!("{text}");
        return Ok(code);
    };
    let mut opened = opened;
    // Redraw the screen only on a terminal; into a pipe or file, frames follow each other.
    let terminal = std::io::stdout().is_terminal();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => return Ok(exit::OK),
            _ = ticks.tick() => {}
        }
        if let Existing::Missing { .. } = opened {
            // The store may have been created since the last tick.
            opened = crate::store_url::open_existing(store_url).await?;
        }
        let (frame, url) = match &opened {
            Existing::Open(store) => match render(store, &args).await {
                Ok((text, _)) => (text, store.url()),
                // A store fault while watching is shown and retried at the next tick.
                Err(e) if !args.json => (format!("tessera: {e}\n"), store.url()),
                Err(e) => return Err(e),
            },
            Existing::Missing { url, reason } => (render_missing(url, reason, &args).0, &url[..]),
        };
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{}", watch_frame(terminal, &args, every, url, &frame));
        let _ = out.flush();
    }
}

/// What one refresh of `--watch` writes: with `--json`, the document alone (JSON Lines); on
/// a terminal, a clear-screen, a title and the frame; elsewhere (a pipe, a file) the frame
/// followed by an empty line, with no escape codes.
fn watch_frame(
    terminal: bool,
    args: &StatusArgs,
    every: Duration,
    url: &str,
    frame: &str,
) -> String {
    if args.json {
        frame.to_string()
    } else if terminal {
        format!(
            "\x1b[H\x1b[2Jtessera status every {} on {url} (Ctrl-C to stop)\n\n{frame}",
            humantime::format_duration(every),
        )
    } else {
        format!("{frame}\n")
    }
}

/// The frame for a store that does not exist yet: nothing to show, as for an empty store
/// (the list form exits 0 with no lines, `status NAME` exits 1 with `null`).
fn render_missing(url: &str, reason: &str, args: &StatusArgs) -> (String, u8) {
    match (&args.name, args.json) {
        (None, true) => ("[]\n".to_string(), exit::OK),
        (None, false) => (
            format!("nothing yet: no store at {url} ({reason})\n"),
            exit::OK,
        ),
        (Some(_), true) => ("null\n".to_string(), exit::NOT_FOUND),
        (Some(name), false) => (
            format!("{name}: nothing yet: no store at {url} ({reason})\n"),
            exit::NOT_FOUND,
        ),
    }
}

/// One frame of output, and the exit code it stands for.
async fn render(store: &Store, args: &StatusArgs) -> Result<(String, u8), Failure> {
    match &args.name {
        Some(name) => {
            let status = store.status(name).await?;
            let rate = rate_status(store, name).await?;
            let limits = store.tenant_limits(name).await?;
            let code = if status.is_some() || rate.is_some() {
                exit::OK
            } else {
                exit::NOT_FOUND
            };
            let text = if args.json {
                format!(
                    "{}\n",
                    to_json(&with_rate(name, status.as_ref(), rate.as_ref())?)?
                )
            } else {
                let mut text = match &status {
                    Some(s) => detail(s, &limits),
                    None if rate.is_none() => format!(
                        "{name}: not held or waited for in {}; {KEPT_WHILE_USED}, so a \
                         semaphore released or whose leases expired leaves nothing (and a rate \
                         limiter idle past its longest window)\n",
                        store.url()
                    ),
                    None => String::new(),
                };
                if let Some(r) = &rate {
                    text += &rate_detail(r);
                }
                // Limits are kept for the name while nobody holds or waits: say so.
                if status.is_none() && !limits.is_empty() {
                    text += &format!(
                        "{name}: tenant limits kept for it: {} (`tessera tenants {name}`)\n",
                        limits
                            .iter()
                            .map(|(t, l)| {
                                let ceiling = l.ceiling.map_or("-".into(), |c| c.to_string());
                                let window = l
                                    .window_ceiling
                                    .map_or(String::new(), |p| format!(" windows {p}%"));
                                format!("{t} ceiling {ceiling} floor {}{window}", l.floor)
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                text
            };
            Ok((text, code))
        }
        None => {
            let mut all = Vec::new();
            let mut expired = Vec::new();
            for name in store.list().await? {
                // Listed, but no status: every lease ran out before this look (which removed
                // it), or it was released or deleted in between.
                match store.status(&name).await? {
                    Some(s) => all.push(s),
                    None => expired.push(name),
                }
            }
            let mut rates = Vec::new();
            for name in rate_list(store).await? {
                if let Some(r) = rate_status(store, &name).await? {
                    rates.push(r);
                }
            }
            let text = if args.json {
                let mut items = Vec::new();
                for s in &all {
                    items.push(with_rate(&s.name, Some(s), None)?);
                }
                for r in &rates {
                    items.push(with_rate(&r.name, None, Some(r))?);
                }
                format!("{}\n", to_json(&items)?)
            } else {
                let semaphores = summary(&all, &expired, store.url());
                match rates.is_empty() {
                    true => semaphores,
                    false => format!("{semaphores}\n{}", rate_summary(&rates)),
                }
            };
            Ok((text, exit::OK))
        }
    }
}

/// The rate limiter named `name`; none on a store without rate limiting (etcd), whose
/// semaphores `status` still shows.
async fn rate_status(store: &Store, name: &str) -> tessera::Result<Option<RateStatus>> {
    match store.rate_status(name).await {
        Err(tessera::Error::Unsupported(_)) => Ok(None),
        other => other,
    }
}

/// The rate limiters' names; none on a store without rate limiting.
async fn rate_list(store: &Store) -> tessera::Result<Vec<String>> {
    match store.rate_list().await {
        Err(tessera::Error::Unsupported(_)) => Ok(Vec::new()),
        other => other,
    }
}

/// The JSON of a name: the semaphore's status object (or `null` when there is neither a
/// semaphore nor a limiter), with the limiter's status under `"rate"` when there is one.
fn with_rate(
    name: &str,
    status: Option<&SemaphoreStatus>,
    rate: Option<&RateStatus>,
) -> Result<serde_json::Value, Failure> {
    let encode = |e: serde_json::Error| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("cannot encode the status as JSON: {e}"),
        )
    };
    let mut value = serde_json::to_value(status).map_err(encode)?;
    if let Some(r) = rate {
        let r = serde_json::to_value(r).map_err(encode)?;
        match &mut value {
            serde_json::Value::Object(map) => {
                map.insert("rate".into(), r);
            }
            _ => value = serde_json::json!({ "name": name, "rate": r }),
        }
    }
    Ok(value)
}

fn until(t: tessera::StoreTime, now: tessera::StoreTime) -> String {
    if t <= now {
        "now".to_string()
    } else {
        format!("in {}", short(t.since(now)))
    }
}

/// One line per limiter: each limit's `USED + RESERVED of LIMIT` (reserved: turns already
/// given to waiting callers at a later time, as in the single-name view) and the next free
/// time.
fn rate_summary(all: &[RateStatus]) -> String {
    let rows: Vec<(&str, String, String)> = all
        .iter()
        .map(|r| {
            let limits: Vec<String> = r
                .limits
                .iter()
                .map(|l| format!("{} + {} of {}", l.used, l.reserved, l.limit))
                .collect();
            (
                r.name.as_str(),
                limits.join(", "),
                until(r.next_free, r.now),
            )
        })
        .collect();
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(12);
    let usage = "USED + RESERVED OF LIMIT";
    let usage_width = rows
        .iter()
        .map(|r| r.1.len())
        .max()
        .unwrap_or(0)
        .max(usage.len());
    let mut out = format!(
        "{:<width$}  {usage:<usage_width$}  NEXT FREE\n",
        "RATE LIMITER"
    );
    for (name, limits, next) in rows {
        out += &format!("{name:<width$}  {limits:<usage_width$}  {next}\n");
    }
    out
}

fn rate_detail(r: &RateStatus) -> String {
    let mode = match r.mode {
        tessera::RateMode::Smooth { burst } => format!("smooth, burst {burst}"),
        _ => "exact".to_string(),
    };
    // The margin widens every window the store enforces (see `tessera run --help`).
    let mut out = format!(
        "{}: rate limiter ({mode}, margin {}), next free {} (store time {})\n",
        r.name,
        humantime::format_duration(r.margin),
        until(r.next_free, r.now),
        r.now
    );
    out += &format!(
        "  {:<14}  {:>8}  {:>8}  NEXT FREE\n",
        "LIMIT", "USED", "RESERVED"
    );
    for l in &r.limits {
        out += &format!(
            "  {:<14}  {:>8}  {:>8}  {}\n",
            l.limit.to_string(),
            l.used,
            l.reserved,
            until(l.next_free, r.now)
        );
    }
    // Counted by the store in each give-back's step, since the limiter's state began.
    if let Some(n) = r.expired_unused {
        out += &format!(
            "  expired unused: {n} admission{} given back past the use-by instant (margin)\n",
            if n == 1 { "" } else { "s" }
        );
    }
    out
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, Failure> {
    serde_json::to_string(value).map_err(|e| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("cannot encode the status as JSON: {e}"),
        )
    })
}

/// Why a released semaphore is not listed.
const KEPT_WHILE_USED: &str = "a store keeps a semaphore only while it is held or waited for";

/// The semaphores' table: one line per semaphore held or waited for, then one per semaphore
/// found with every lease expired; a line saying there is none otherwise.
fn summary(all: &[SemaphoreStatus], expired: &[String], url: &str) -> String {
    if all.is_empty() && expired.is_empty() {
        return format!(
            "no semaphore is held or waited for in {url} ({KEPT_WHILE_USED}: a released one \
             leaves nothing)\n"
        );
    }
    let width = all
        .iter()
        .map(|s| s.name.len())
        .chain(expired.iter().map(String::len))
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = format!(
        "{:<width$}  {:>8}  {:>9}  {:>7}  {:>6}  STATE\n",
        "NAME", "CAPACITY", "AVAILABLE", "HOLDERS", "QUEUED"
    );
    for s in all {
        let state = match (s.available, s.queue.is_empty()) {
            (0, true) => "full",
            (0, false) => "full, waiters",
            (_, true) => "in use",
            (_, false) => "in use, waiters",
        };
        out += &format!(
            "{:<width$}  {:>8}  {:>9}  {:>7}  {:>6}  {state}\n",
            s.name,
            s.capacity,
            s.available,
            s.holders.len(),
            s.queue.len()
        );
    }
    for name in expired {
        out += &format!(
            "{name:<width$}  {:>8}  {:>9}  {:>7}  {:>6}  expired: every lease ran out, now removed\n",
            "-", "-", 0, 0
        );
    }
    out
}

fn detail(
    s: &SemaphoreStatus,
    limits: &std::collections::BTreeMap<String, tessera::TenantLimits>,
) -> String {
    let mut out = format!(
        "{}: capacity {}, used {}, available {} (store time {})\n",
        s.name, s.capacity, s.used, s.available, s.now
    );
    // A TENANT column and a table per tenant once a request named one.
    let tenants = s.tenants_with(limits);
    let named = tenants.iter().any(|t| !t.tenant.is_empty());
    let tenant_column = |t: &Option<String>| named.then(|| tenant_label(t.as_deref()));
    if s.holders.is_empty() {
        out += "holders: none\n";
    } else {
        out += &format!("holders ({}, oldest first):\n", s.holders.len());
        let rows: Vec<Vec<Option<String>>> = s
            .holders
            .iter()
            .map(|h| {
                vec![
                    Some(h.lease_id.to_string()),
                    Some(h.weight.to_string()),
                    Some(seats(&h.seats)),
                    Some(h.fence.to_string()),
                    tenant_column(&h.tenant),
                    Some(h.holder.clone()),
                    Some(h.acquired_at.to_string()),
                    Some(expires_in(s.now, h.expires_at)),
                ]
            })
            .collect();
        out += &table(
            &[
                "LEASE",
                "WEIGHT",
                "SEATS",
                "FENCE",
                "TENANT",
                "HOLDER",
                "ACQUIRED AT",
                "EXPIRES IN",
            ],
            &rows,
        );
    }
    if s.queue.is_empty() {
        out += "queue: empty\n";
    } else {
        out += &format!("queue ({}, served first at the top):\n", s.queue.len());
        let rows: Vec<Vec<Option<String>>> = s
            .queue
            .iter()
            .enumerate()
            .map(|(i, w)| {
                vec![
                    Some((i + 1).to_string()),
                    Some(w.lease_id.to_string()),
                    Some(w.weight.to_string()),
                    tenant_column(&w.tenant),
                    Some(w.holder.clone()),
                    Some(short(s.now.since(w.enqueued_at))),
                ]
            })
            .collect();
        out += &table(
            &["#", "LEASE", "WEIGHT", "TENANT", "HOLDER", "WAITING FOR"],
            &rows,
        );
    }
    if named {
        out += "tenants (holders, waiters and permits per tenant):\n";
        let limited = !limits.is_empty();
        let windowed = limits.values().any(|l| l.window_ceiling.is_some());
        let rows: Vec<Vec<Option<String>>> = tenants
            .iter()
            .map(|t| {
                let mut row = [
                    tenant_label(Some(&t.tenant)),
                    t.holders.to_string(),
                    t.used.to_string(),
                    t.waiters.to_string(),
                    t.waiting.to_string(),
                ]
                .map(Some)
                .to_vec();
                row.push(limited.then(|| t.ceiling.map_or("-".into(), |c| c.to_string())));
                row.push(limited.then(|| t.floor.to_string()));
                row.push(
                    windowed.then(|| t.window_ceiling.map_or("-".into(), |p| format!("{p}%"))),
                );
                row
            })
            .collect();
        out += &table(
            &[
                "TENANT", "HOLDERS", "USED", "WAITERS", "WAITING", "CEILING", "FLOOR", "WINDOWS",
            ],
            &rows,
        );
    }
    out
}

/// A tenant's cell: its name, or `-` for requests that named none.
fn tenant_label(tenant: Option<&str>) -> String {
    match tenant {
        None | Some("") => "-".to_string(),
        Some(t) => t.to_string(),
    }
}

/// A table with a header line; a column whose cells are `None` is left out.
fn table(header: &[&str], rows: &[Vec<Option<String>>]) -> String {
    let shown: Vec<usize> = (0..header.len())
        .filter(|&i| rows.iter().all(|r| r[i].is_some()))
        .collect();
    let mut widths: Vec<usize> = shown.iter().map(|&i| header[i].len()).collect();
    for row in rows {
        for (w, &i) in widths.iter_mut().zip(&shown) {
            *w = (*w).max(row[i].as_deref().unwrap_or("").chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (cell, w) in cells.iter().zip(&widths) {
            l += &format!("  {cell:<w$}");
        }
        l.trim_end().to_string() + "\n"
    };
    let mut out = line(shown.iter().map(|&i| header[i]).collect());
    for row in rows {
        out += &line(
            shown
                .iter()
                .map(|&i| row[i].as_deref().unwrap_or(""))
                .collect(),
        );
    }
    out
}

fn seats(seats: &[u32]) -> String {
    seats
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn expires_in(now: tessera::StoreTime, expires_at: tessera::StoreTime) -> String {
    if expires_at <= now {
        "expired".to_string()
    } else {
        short(expires_at.since(now))
    }
}

/// A duration to the tenth of a second: `1.8s`, `2m 5.0s`.
fn short(d: Duration) -> String {
    let tenths = d.as_millis() / 100;
    let (mins, tenths) = (tenths / 600, tenths % 600);
    if mins > 0 {
        format!("{mins}m {}.{}s", tenths / 10, tenths % 10)
    } else {
        format!("{}.{}s", tenths / 10, tenths % 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The human view and the JSON of a semaphore with holders and a waiter (one process, so
    /// the memory store can be shared).
    #[tokio::test]
    async fn status_shows_holders_and_queue_in_order() {
        let store = Store::connect("memory://cli-status").await.unwrap();
        let opts = |h: &str| tessera::SemaphoreOptions::default().holder(h);
        let a = tessera::Semaphore::new(&store, "demo", 3, opts("alpha")).unwrap();
        let b = tessera::Semaphore::new(&store, "demo", 3, opts("beta")).unwrap();
        let c = tessera::Semaphore::new(&store, "demo", 3, opts("gamma")).unwrap();
        let pa = a.acquire_many(2).await.unwrap();
        let pb = b.acquire().await.unwrap();
        let waiter = tokio::spawn(async move { c.acquire_many(2).await.map(|p| p.fence()) });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while store
            .status("demo")
            .await
            .unwrap()
            .unwrap()
            .queue
            .is_empty()
        {
            assert!(tokio::time::Instant::now() < deadline, "never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let args = |json| StatusArgs {
            name: Some("demo".into()),
            json,
            watch: None,
        };
        let (text, code) = render(&store, &args(false)).await.unwrap();
        assert_eq!(code, exit::OK);
        assert!(
            text.starts_with("demo: capacity 3, used 3, available 0"),
            "{text}"
        );
        let alpha = text.find("alpha").unwrap();
        let beta = text.find("beta").unwrap();
        let gamma = text.find("gamma").unwrap();
        assert!(alpha < beta && beta < gamma, "{text}");
        assert!(text.contains(&pa.lease_id().to_string()), "{text}");
        assert!(text.contains("  0,1  "), "{text}");
        assert!(!text.contains("TENANT"), "no tenant named: {text}");
        let (json, _) = render(&store, &args(true)).await.unwrap();
        let parsed: SemaphoreStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed.holders.len(), 2);
        assert_eq!(parsed.queue[0].holder, "gamma");
        let (summary, _) = render(
            &store,
            &StatusArgs {
                name: None,
                json: false,
                watch: None,
            },
        )
        .await
        .unwrap();
        assert!(
            summary
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>()
                    == ["demo", "3", "0", "2", "1", "full,", "waiters"]),
            "{summary}"
        );
        pa.release().await.unwrap();
        pb.release().await.unwrap();
        waiter.await.unwrap().unwrap();
    }

    /// Once a request names a tenant, the holders and the queue show each one's tenant, and
    /// a table gives holders, waiters and permits per tenant; the JSON carries the same.
    #[tokio::test]
    async fn status_shows_each_tenants_holders_waiters_and_permits() {
        let store = Store::connect("memory://cli-status-tenants").await.unwrap();
        let opts = |tenant: Option<&str>| {
            let o = tessera::SemaphoreOptions::default().holder("worker");
            match tenant {
                Some(t) => o.tenant(tessera::Tenant::new(t, 1).unwrap()),
                None => o,
            }
        };
        let sem = |t| tessera::Semaphore::new(&store, "provider", 2, opts(t)).unwrap();
        let _bulk = sem(Some("bulk")).acquire_many(2).await.unwrap();
        let waiters: Vec<_> = [Some("alerts"), None, Some("bulk")]
            .into_iter()
            .map(|t| {
                let s = sem(t);
                tokio::spawn(async move { s.acquire().await.map(|p| p.fence()) })
            })
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while store.status("provider").await.unwrap().unwrap().queue.len() < 3 {
            assert!(tokio::time::Instant::now() < deadline, "never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let args = |json| StatusArgs {
            name: Some("provider".into()),
            json,
            watch: None,
        };
        let (text, _) = render(&store, &args(false)).await.unwrap();
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let header = rows
            .iter()
            .position(|r| r.first() == Some(&"TENANT"))
            .expect(&text);
        assert_eq!(
            rows[header + 1..header + 4],
            [
                vec!["-", "0", "0", "1", "1"],
                vec!["alerts", "0", "0", "1", "1"],
                vec!["bulk", "1", "2", "1", "1"],
            ],
            "{text}"
        );
        assert!(
            rows.iter()
                .any(|r| r.len() > 5 && r[4] == "bulk" && r[5] == "worker"),
            "the holder's tenant: {text}"
        );
        let (json, _) = render(&store, &args(true)).await.unwrap();
        let parsed: SemaphoreStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed.holders[0].tenant.as_deref(), Some("bulk"));
        let queued: Vec<_> = parsed.queue.iter().map(|w| w.tenant.as_deref()).collect();
        assert_eq!(queued.len(), 3);
        assert!(queued.contains(&None) && queued.contains(&Some("alerts")));
        // With limits set, the table shows each tenant's ceiling and floor.
        let floor = tessera::TenantLimits::new(None, 1).unwrap();
        store
            .set_tenant_limits("provider", "alerts", floor)
            .await
            .unwrap();
        let (text, _) = render(&store, &args(false)).await.unwrap();
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>()
                    == ["alerts", "0", "0", "1", "1", "-", "1"]),
            "{text}"
        );
        drop(_bulk);
        for w in waiters {
            w.abort();
        }
    }

    /// A semaphore whose every lease ran out while nobody looked is still listed by the store
    /// (SQLite keeps its row, memory its state, until the next step on it): the list shows it
    /// once as expired instead of leaving it out; held ones show their capacity and state.
    #[tokio::test]
    async fn the_list_shows_a_semaphore_whose_leases_expired_as_expired() {
        for url in ["memory://cli-status-expired", "sqlite"] {
            let dir = tempfile::tempdir().unwrap();
            let url = match url {
                "sqlite" => format!("sqlite://{}", dir.path().join("t.db").display()),
                other => other.to_string(),
            };
            let store = Store::connect(&url).await.unwrap();
            let opts = tessera::SemaphoreOptions::default().ttl(Duration::from_millis(200));
            let held = tessera::Semaphore::new(&store, "held", 4, opts.clone()).unwrap();
            let _permit = held.acquire().await.unwrap();
            // A holder that stops renewing: its lease runs out after the TTL.
            let gone = tessera::Semaphore::new(&store, "gone", 3, opts).unwrap();
            assert!(gone.acquire().await.unwrap().detach().is_some());
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let args = StatusArgs {
                name: None,
                json: false,
                watch: None,
            };
            loop {
                // Past the TTL (store time), without a step on "gone" before the list.
                tokio::time::sleep(Duration::from_millis(300)).await;
                if store.list().await.unwrap().contains(&"gone".to_string()) {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{url}: gone not listed"
                );
            }
            let (text, code) = render(&store, &args).await.unwrap();
            assert_eq!(code, exit::OK);
            let rows: Vec<Vec<&str>> = text
                .lines()
                .map(|l| l.split_whitespace().collect())
                .collect();
            assert!(
                rows.iter()
                    .any(|r| r[..6] == ["held", "4", "3", "1", "0", "in"]),
                "{url}: {text}"
            );
            assert!(
                rows.iter()
                    .any(|r| r[..6] == ["gone", "-", "-", "0", "0", "expired:"]),
                "{url}: {text}"
            );
            // Shown once: reading it removed it.
            let (text, _) = render(&store, &args).await.unwrap();
            assert!(!text.contains("gone"), "{url}: {text}");
        }
    }

    /// The list line of a limiter shows the reserved turns, not only the admitted ones.
    #[test]
    fn the_list_line_of_a_limiter_shows_its_reservations() {
        let now = tessera::StoreTime(1_800_000_000_000_000);
        let later = tessera::StoreTime(now.0 + 1_500_000);
        let usage = |spec: &str, used, reserved| tessera::LimitUsage {
            limit: spec.parse().unwrap(),
            used,
            reserved,
            next_free: later,
        };
        let status = RateStatus {
            name: "sms-api".into(),
            mode: tessera::RateMode::Exact,
            limits: vec![usage("2/s", 2, 3), usage("1000/min", 2, 3)],
            last_admit: later,
            next_free: later,
            now,
            margin: tessera::DEFAULT_RATE_MARGIN,
            expired_unused: None,
        };
        let text = rate_summary(&[status]);
        let line = text.lines().nth(1).unwrap();
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>().join(" "),
            "sms-api 2 + 3 of 2/s, 2 + 3 of 1000/min in 1.5s",
            "{text}"
        );
        assert!(
            text.starts_with("RATE LIMITER  USED + RESERVED OF LIMIT"),
            "{text}"
        );
    }

    /// `--watch` clears the screen only on a terminal.
    #[test]
    fn watch_frames_clear_the_screen_only_on_a_terminal() {
        let args = |json| StatusArgs {
            name: None,
            json,
            watch: Some(Duration::from_secs(1)),
        };
        let every = Duration::from_secs(1);
        let tty = watch_frame(true, &args(false), every, "memory://", "frame\n");
        assert!(
            tty.starts_with("\x1b[H\x1b[2J") && tty.ends_with("frame\n"),
            "{tty:?}"
        );
        let pipe = watch_frame(false, &args(false), every, "memory://", "frame\n");
        assert_eq!(pipe, "frame\n\n");
        for terminal in [true, false] {
            assert_eq!(
                watch_frame(terminal, &args(true), every, "memory://", "[]\n"),
                "[]\n"
            );
        }
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(short(Duration::from_millis(1830)), "1.8s");
        assert_eq!(short(Duration::from_secs(125)), "2m 5.0s");
    }
}
