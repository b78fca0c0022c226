//! The figures of one workload, as JSON and as a summary table.

use serde::Serialize;

use super::pauses::PauseFigures;

/// The figures of one workload run.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadReport {
    /// `w1`, `w2` or `w3`.
    pub workload: String,
    /// The store URL (password hidden).
    pub store: String,
    pub clients: usize,
    pub capacity: u32,
    /// Extra holders kept during the workload (`--preload`).
    pub preload: u32,
    /// Runtime worker threads (`--threads`; 0: one current-thread runtime).
    pub threads: usize,
    pub hold_ms: f64,
    /// Operations completed: pairs (W1) or grants (W2, W3).
    pub ops: u64,
    /// Whether every requested operation ran within the time bound.
    pub completed: bool,
    pub seconds: f64,
    pub ops_per_sec: f64,
    /// Grants to a different client than the previous grant, per second.
    pub handoffs_per_sec: f64,
    /// Acquire latency (from the call to the permit).
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The slowest of the clients' first acquires, taken one client at a time before the
    /// clock starts (connection and per-session set-up); not in the figures above. Null for
    /// a baseline that is not tessera.
    pub first_acquire_max_ms: Option<f64>,
    pub grants_per_client_min: u64,
    pub grants_per_client_max: u64,
    /// The most holders the independent check saw at once.
    pub max_holders_seen: i64,
    /// Entries the independent check saw beyond the capacity.
    pub over_grants: u64,
    /// `redis-counter` or `in-process-counter`.
    pub over_grant_check: String,
    /// Redis CPU (sys + user) per grant, µs; null on other stores.
    pub server_cpu_us_per_grant: Option<f64>,
    /// One client's bare round trips per second in the same run; null without one.
    pub rtt_per_sec: Option<f64>,
    /// W1 only: pairs per second over half the round-trip limit.
    pub rtt_limit_ratio: Option<f64>,
    /// Failed store calls, panicked or aborted clients.
    pub errors: u64,
    /// The many workload: Redis CPU per grant (µs) of each server in the URL (each
    /// primary of a cluster), in URL order; their sum is `server_cpu_us_per_grant`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_cpu_us_per_grant: Vec<f64>,
    /// The process's own pauses over the run and the long waits they cover
    /// ([`pauses`](super::pauses)); null for a baseline that does not measure them.
    pub pauses: Option<PauseFigures>,
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(v) => format!("{v:.decimals$}"),
        None => "-".to_string(),
    }
}

/// The summary table.
pub fn table(reports: &[WorkloadReport]) -> String {
    let header = [
        "workload",
        "clients",
        "cap",
        "ops",
        "ops/s",
        "handoffs/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "1st max ms",
        "grants/client",
        "over",
        "cpu µs/grant",
        "rtt/s",
        "w1/limit",
        "pause max ms",
        "long waits in pauses",
        "errors",
    ];
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            vec![
                r.workload.clone(),
                r.clients.to_string(),
                r.capacity.to_string(),
                format!("{}{}", r.ops, if r.completed { "" } else { "*" }),
                format!("{:.0}", r.ops_per_sec),
                format!("{:.0}", r.handoffs_per_sec),
                format!("{:.3}", r.p50_ms),
                format!("{:.3}", r.p99_ms),
                format!("{:.3}", r.max_ms),
                opt(r.first_acquire_max_ms, 3),
                format!("{}-{}", r.grants_per_client_min, r.grants_per_client_max),
                r.over_grants.to_string(),
                opt(r.server_cpu_us_per_grant, 1),
                opt(r.rtt_per_sec, 0),
                opt(r.rtt_limit_ratio, 3),
                opt(r.pauses.as_ref().map(|p| p.max_ms), 1),
                match &r.pauses {
                    Some(p) => format!("{}/{}", p.long_waits_in_pauses, p.long_waits),
                    None => "-".to_string(),
                },
                r.errors.to_string(),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row));
    }
    if reports.iter().any(|r| !r.completed) {
        out.push_str("* stopped at --duration before all operations ran\n");
    }
    out
}
