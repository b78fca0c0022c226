//! Promises the shared SQL step (`tessera_core::stores::sql`) makes to the dialects, checked on the
//! SQLite dialect.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::sqlite::SqliteConnection;
use sqlx::{ConnectOptions, Connection};

use crate::stores::sqlite::ops::SqliteRows;
use crate::stores::sqlite::SqliteBackend;
use tessera_core::clock::{Clock, ManualClock};
use tessera_core::error::Result;
use tessera_core::model::*;
use tessera_core::seam::Backend;
use tessera_core::stores::sql::*;

const T0: StoreTime = StoreTime(1_800_000_000_000_000);

fn try_one(lease: LeaseId) -> AcquireRequest {
    AcquireRequest {
        lease_id: lease,
        weight: 2,
        ttl: Duration::from_secs(10),
        holder: "h/1".into(),
        wait: None,
        tenant: None,
        first_send: false,
    }
}

/// A dialect that locks with `SELECT … FOR UPDATE` may insert a placeholder row before an
/// acquire (see `SemRows::load`): with nothing used or queued it must act exactly as no row,
/// whatever capacity it carries, and leave nothing behind once released.
#[tokio::test]
async fn a_placeholder_row_with_nothing_held_acts_as_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let url = format!("sqlite://{}", path.display());
    let clock = Arc::new(ManualClock::new(T0));
    let b = SqliteBackend::connect_with_clock(&url, Arc::clone(&clock) as Arc<dyn Clock>)
        .await
        .unwrap();
    let (fresh, placed) = (Name::new("fresh").unwrap(), Name::new("placed").unwrap());
    // Raise the high-water mark well above the clock, as a deleted semaphore leaves it.
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    sqlx::query("UPDATE tessera_meta SET value = ?1 WHERE key = 'fence_hwm'")
        .bind((T0.0 + 1_000_000) as i64)
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO tessera_semaphores (name, capacity, used, dequeued, last_fence, \
         seat_high) SELECT 'placed', 7, 0, 0, value, 0 FROM tessera_meta \
         WHERE key = 'fence_hwm'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let mut grants = Vec::new();
    for s in [&fresh, &placed] {
        let lease = LeaseId::random();
        let AcquireReply::Granted(g) = b.acquire(s, 3, &try_one(lease)).await.unwrap() else {
            panic!("{s}: not granted")
        };
        let status = b.status(s).await.unwrap().unwrap();
        assert_eq!((status.capacity, status.used), (3, 2), "{s}");
        assert!(g.lease.fence > T0.0 + 1_000_000, "{s}: {}", g.lease.fence);
        assert!(b.release(s, lease).await.unwrap(), "{s}");
        grants.push((g.lease.seats, g.lease.fence));
    }
    assert_eq!(grants[0].0, grants[1].0);
    assert!(grants[1].1 > grants[0].1);
    assert!(b.list().await.unwrap().is_empty());
}

/// The SQLite statements as a dialect without `RETURNING` (MySQL 8) writes them: a `SELECT`,
/// then the `DELETE`/`UPDATE` with the same predicate, trusting the lock the step holds.
/// Every other row operation is SQLite's own.
struct NoReturning<'c> {
    rows: SqliteRows<'c>,
    name: &'c str,
}

/// One result row, its columns read by index.
struct Cols(Vec<rusqlite::types::Value>);

impl Cols {
    fn get<T: rusqlite::types::FromSql>(&self, i: usize) -> T {
        T::column_result(rusqlite::types::ValueRef::from(&self.0[i])).unwrap()
    }
}

impl<'c> NoReturning<'c> {
    fn sqlite(&mut self) -> &mut SqliteRows<'c> {
        &mut self.rows
    }

    /// The rows of `sql` with the name, then `lease` if given, then `args`.
    fn query(&self, sql: &'static str, lease: Option<&str>, args: &[i64]) -> Vec<Cols> {
        let mut st = self.rows.db().prepare(sql).unwrap();
        let mut params: Vec<rusqlite::types::Value> = vec![self.name.to_string().into()];
        params.extend(lease.map(|l| l.to_string().into()));
        params.extend(args.iter().map(|&a| a.into()));
        let n = st.column_count();
        st.query_map(rusqlite::params_from_iter(params), |r| {
            (0..n)
                .map(|i| r.get(i))
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .unwrap()
        .map(|r| Cols(r.unwrap()))
        .collect()
    }

    async fn rows(&mut self, sql: &'static str, args: &[i64]) -> Result<Vec<Cols>> {
        Ok(self.query(sql, None, args))
    }

    /// The lease ids `select` finds, then `delete` (the shape without `RETURNING`).
    async fn select_then_delete(
        &mut self,
        select: &'static str,
        delete: &'static str,
    ) -> Result<Vec<String>> {
        let ids = self
            .rows(select, &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        self.exec(delete, None, &[]).await?;
        Ok(ids)
    }

    async fn exec(&mut self, sql: &'static str, lease: Option<&str>, args: &[i64]) -> Result<u64> {
        let before = self.rows.db().total_changes();
        self.query(sql, lease, args);
        Ok(self.rows.db().total_changes() - before)
    }

    async fn lease_rows(&mut self, sql: &'static str, lease: &str) -> Result<Vec<Cols>> {
        Ok(self.query(sql, Some(lease), &[]))
    }
}

fn freed(row: &Cols) -> Freed {
    Freed {
        weight: row.get(0),
        seats: row.get(1),
    }
}

impl SemRows for NoReturning<'_> {
    async fn load(&mut self, create: Option<u32>) -> Result<Loaded> {
        self.sqlite().load(create).await
    }
    async fn save(&mut self, sem: &SemRow, dirty: Dirty) -> Result<()> {
        self.sqlite().save(sem, dirty).await
    }
    async fn drop_semaphore(&mut self) -> Result<bool> {
        self.sqlite().drop_semaphore().await
    }
    async fn raise_hwm(&mut self, hwm: i64) -> Result<()> {
        self.sqlite().raise_hwm(hwm).await
    }
    async fn purge_holders(&mut self, now: i64) -> Result<Vec<Freed>> {
        let sql = "SELECT weight, seats FROM tessera_holders WHERE name = ?1 AND expires_at <= ?2";
        let freed = self.rows(sql, &[now]).await?.iter().map(freed).collect();
        let sql = "DELETE FROM tessera_holders WHERE name = ?1 AND expires_at <= ?2";
        self.exec(sql, None, &[now]).await?;
        Ok(freed)
    }
    async fn purge_waiters(&mut self, now: i64) -> Result<u64> {
        self.sqlite().purge_waiters(now).await
    }
    async fn holder(&mut self, lease: &str) -> Result<Option<HolderRow>> {
        self.sqlite().holder(lease).await
    }
    async fn holders(&mut self) -> Result<Vec<HolderRow>> {
        self.sqlite().holders().await
    }
    async fn insert_holder(&mut self, row: &NewHolder<'_>) -> Result<()> {
        self.sqlite().insert_holder(row).await
    }
    async fn remove_holder(&mut self, lease: &str) -> Result<Option<Freed>> {
        let sql = "SELECT weight, seats FROM tessera_holders WHERE name = ?1 AND lease_id = ?2";
        let Some(row) = self.lease_rows(sql, lease).await?.first().map(freed) else {
            return Ok(None);
        };
        let sql = "DELETE FROM tessera_holders WHERE name = ?1 AND lease_id = ?2";
        self.exec(sql, Some(lease), &[]).await?;
        Ok(Some(row))
    }
    async fn renew_holder(&mut self, lease: &str, at: i64) -> Result<Option<i64>> {
        let sql = "UPDATE tessera_holders SET expires_at = max(expires_at, ?3) \
                   WHERE name = ?1 AND lease_id = ?2";
        if self.exec(sql, Some(lease), &[at]).await? == 0 {
            return Ok(None);
        }
        let sql = "SELECT expires_at FROM tessera_holders WHERE name = ?1 AND lease_id = ?2";
        Ok(self.lease_rows(sql, lease).await?.first().map(|r| r.get(0)))
    }
    async fn pop_head_if_fits(&mut self, available: i64) -> Result<Option<HeadRow>> {
        let sql = "SELECT seq, lease_id, weight, holder, ttl, expires_at, tag, gate, tenant \
                   FROM tessera_waiters WHERE name = ?1 ORDER BY tag, seq LIMIT 1";
        let Some(row) = self.rows(sql, &[]).await?.into_iter().next() else {
            return Ok(None);
        };
        let head = HeadRow {
            tag: row.get(6),
            lease_id: row.get(1),
            weight: row.get(2),
            holder: row.get(3),
            ttl: row.get(4),
            expires_at: row.get(5),
            tenant: row.get(8),
        };
        if head.weight > available || row.get::<Option<i64>>(7).is_some() {
            return Ok(None);
        }
        let sql = "DELETE FROM tessera_waiters WHERE name = ?1 AND seq = ?2";
        self.exec(sql, None, &[row.get(0)]).await?;
        Ok(Some(head))
    }
    async fn insert_waiter(&mut self, row: &NewWaiter<'_>) -> Result<()> {
        self.sqlite().insert_waiter(row).await
    }
    async fn remove_waiter(&mut self, lease: &str) -> Result<u64> {
        self.sqlite().remove_waiter(lease).await
    }
    async fn refresh_waiter(&mut self, lease: &str, at: i64) -> Result<u64> {
        self.sqlite().refresh_waiter(lease, at).await
    }
    async fn head_key(&mut self) -> Result<Option<HeadKey>> {
        self.sqlite().head_key().await
    }
    async fn tenant_finish(&mut self, tenant: &str) -> Result<Option<i64>> {
        self.sqlite().tenant_finish(tenant).await
    }
    async fn save_tenant(&mut self, tenant: &str, finish: i64) -> Result<()> {
        self.sqlite().save_tenant(tenant, finish).await
    }
    async fn prune_tenants(&mut self, vtime: i64) -> Result<u64> {
        self.sqlite().prune_tenants(vtime).await
    }
    async fn drop_tenants(&mut self) -> Result<()> {
        self.sqlite().drop_tenants().await
    }
    async fn waiter_place(&mut self, lease: &str) -> Result<Option<Place>> {
        self.sqlite().waiter_place(lease).await
    }
    async fn waiters_ahead(&mut self, tag: i64, seq: i64) -> Result<i64> {
        self.sqlite().waiters_ahead(tag, seq).await
    }
    async fn waiters(&mut self) -> Result<Vec<WaiterRow>> {
        self.sqlite().waiters().await
    }
    async fn take_free_seats(&mut self, below: i64, n: i64) -> Result<Vec<i64>> {
        self.sqlite().take_free_seats(below, n).await
    }
    async fn insert_free_seats(&mut self, lo: i64, hi: i64) -> Result<()> {
        self.sqlite().insert_free_seats(lo, hi).await
    }
    async fn top_free_seats(&mut self, below: i64, limit: i64) -> Result<Vec<i64>> {
        self.sqlite().top_free_seats(below, limit).await
    }
    async fn drop_free_seats_from(&mut self, seat: i64) -> Result<()> {
        self.sqlite().drop_free_seats_from(seat).await
    }
    async fn drop_free_seats(&mut self) -> Result<()> {
        self.sqlite().drop_free_seats().await
    }
    async fn drop_holders(&mut self) -> Result<Vec<String>> {
        self.select_then_delete(
            "SELECT lease_id FROM tessera_holders WHERE name = ?1",
            "DELETE FROM tessera_holders WHERE name = ?1",
        )
        .await
    }
    async fn drop_waiters(&mut self) -> Result<Vec<String>> {
        self.select_then_delete(
            "SELECT lease_id FROM tessera_waiters WHERE name = ?1",
            "DELETE FROM tessera_waiters WHERE name = ?1",
        )
        .await
    }
}

/// One step of `op` in its own `BEGIN IMMEDIATE` transaction, on SQLite's dialect (`plain`)
/// or on [`NoReturning`]; the outcome and wake-ups as text.
async fn run_step(
    conn: &mut SqliteConnection,
    plain: bool,
    name: &Name,
    now: StoreTime,
    op: &Op,
) -> String {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let rows = SqliteRows::new(&mut tx, name.as_str(), now).await.unwrap();
    let out = if plain {
        op.run(&mut { rows }, name).await
    } else {
        let name_str = name.as_str();
        op.run(
            &mut NoReturning {
                rows,
                name: name_str,
            },
            name,
        )
        .await
    };
    tx.commit().await.unwrap();
    out
}

#[derive(Debug)]
enum Op {
    Acquire(u32, AcquireRequest),
    Heartbeat(LeaseId, Duration),
    Cancel(LeaseId),
    Release(LeaseId),
    Renew(LeaseId, Duration),
    Status,
    Resize(u32),
    Revoke(LeaseId),
    Delete,
}

impl Op {
    async fn run(&self, rows: &mut impl SemRows, name: &Name) -> String {
        match self {
            Op::Acquire(c, req) => format!(
                "{:?}",
                tessera_core::stores::sql::acquire(rows, name, *c, req).await
            ),
            Op::Heartbeat(l, ttl) => format!(
                "{:?}",
                tessera_core::stores::sql::heartbeat(rows, *l, *ttl).await
            ),
            Op::Cancel(l) => format!("{:?}", tessera_core::stores::sql::cancel(rows, *l).await),
            Op::Release(l) => format!("{:?}", tessera_core::stores::sql::release(rows, *l).await),
            Op::Renew(l, ttl) => format!(
                "{:?}",
                tessera_core::stores::sql::renew(rows, *l, *ttl).await
            ),
            Op::Status => format!("{:?}", tessera_core::stores::sql::status(rows, name).await),
            Op::Resize(c) => format!(
                "{:?}",
                tessera_core::stores::sql::resize(rows, name, *c).await
            ),
            Op::Revoke(l) => format!("{:?}", tessera_core::stores::sql::revoke(rows, *l).await),
            // The lease ids a delete wakes come in no particular order.
            Op::Delete => format!(
                "{:?}",
                tessera_core::stores::sql::delete(rows)
                    .await
                    .map(|(existed, mut wakes)| {
                        wakes.sort();
                        (existed, wakes)
                    })
            ),
        }
    }
}

/// A dialect without `RETURNING` (a `SELECT`, then the `DELETE` or `UPDATE`, inside the
/// locked transaction) gives the same replies, wake-ups and states as SQLite's own
/// statements, step for step, on random operation sequences.
#[tokio::test]
async fn a_dialect_without_returning_runs_the_same_steps() {
    let dir = tempfile::tempdir().unwrap();
    let mut conns = Vec::new();
    for file in ["plain.db", "select-first.db"] {
        let url = format!("sqlite://{}", dir.path().join(file).display());
        drop(SqliteBackend::connect(&url).await.unwrap()); // creates the schema
        let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(dir.path().join(file));
        conns.push(opts.connect().await.unwrap());
    }
    let mut rng = StdRng::seed_from_u64(9);
    let names = [Name::new("a").unwrap(), Name::new("b").unwrap()];
    let leases: Vec<LeaseId> = (0..8).map(|_| LeaseId::random()).collect();
    let mut now = T0;
    let mut granted = 0;
    for i in 0..1500 {
        let name = &names[rng.random_range(0..names.len())];
        let lease = leases[rng.random_range(0..leases.len())];
        let ms = |rng: &mut StdRng, lo: u64, hi: u64| {
            Duration::from_millis(100 * rng.random_range(lo..hi))
        };
        let op = match rng.random_range(0..100) {
            0..=34 => {
                let wait = rng.random_bool(0.6).then(|| WaitSpec {
                    waiter_ttl: ms(&mut rng, 5, 40),
                    queue_cap: rng.random_range(1..6),
                });
                let req = AcquireRequest {
                    lease_id: lease,
                    weight: rng.random_range(1..=4),
                    ttl: ms(&mut rng, 2, 60),
                    holder: "host/1".into(),
                    wait,
                    tenant: None,
                    first_send: false,
                };
                Op::Acquire(4, req)
            }
            35..=46 => Op::Heartbeat(lease, ms(&mut rng, 5, 40)),
            47..=54 => Op::Cancel(lease),
            55..=66 => Op::Release(lease),
            67..=74 => Op::Renew(lease, ms(&mut rng, 2, 60)),
            75..=84 => Op::Status,
            85..=88 => Op::Resize(rng.random_range(1..=6)),
            89..=93 => Op::Revoke(lease),
            94..=95 => Op::Delete,
            _ => {
                now = now.plus(ms(&mut rng, 1, 30));
                continue;
            }
        };
        let plain = run_step(&mut conns[0], true, name, now, &op).await;
        let select_first = run_step(&mut conns[1], false, name, now, &op).await;
        assert_eq!(plain, select_first, "step {i}: {op:?}");
        granted += plain.matches("Granted").count();
    }
    assert!(granted > 50, "the walk granted only {granted} times");
}
