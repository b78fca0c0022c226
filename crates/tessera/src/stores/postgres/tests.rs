//! Unit tests of the PostgreSQL store that need no server (the server tests are in
//! `tests/postgres_store.rs` and the test kit's conformance suite).

use super::migrate::MIGRATIONS;
use super::*;

#[test]
fn every_migration_file_starts_with_a_header_comment() {
    for files in MIGRATIONS {
        for sql in files.concat() {
            assert!(
                sql.starts_with("-- tessera"),
                "{}",
                &sql[..60.min(sql.len())]
            );
        }
    }
}

#[test]
fn migrations_are_numbered_in_order_and_the_rate_tables_come_second() {
    assert_eq!(MIGRATIONS.len(), 12);
    let rate: String = MIGRATIONS[1].concat().concat();
    assert!(rate.starts_with("-- tessera PostgreSQL store, migration 2"));
    for t in ["tessera_rate_limiters", "tessera_rate_log"] {
        assert!(
            rate.contains(&format!("CREATE TABLE IF NOT EXISTS {t} (")),
            "{t}"
        );
    }
}

#[test]
fn the_rate_functions_come_third_after_their_tables() {
    let rate: String = MIGRATIONS[2].concat().concat();
    assert!(rate.starts_with("-- tessera PostgreSQL store, migration 3"));
    for f in [
        "tessera_rate_acquire",
        "tessera_rate_cancel",
        "tessera_rate_status",
        "tessera_rate_delete",
    ] {
        assert!(
            rate.contains(&format!("CREATE OR REPLACE FUNCTION {f}(")),
            "{f}"
        );
    }
    // Every statement may run again over a schema that has it (a re-run migration).
    for line in rate.lines().filter(|l| l.starts_with("CREATE ")) {
        assert!(line.starts_with("CREATE OR REPLACE FUNCTION "), "{line}");
    }
}

/// Migration 4 alters what migration 1 created, idempotently, and creates the step again.
#[test]
fn the_lean_step_comes_fourth_and_runs_again_harmlessly() {
    let lean = MIGRATIONS[3].concat().concat();
    assert!(lean.starts_with("-- tessera PostgreSQL store, migration 4"));
    assert!(lean.contains("ADD COLUMN IF NOT EXISTS purge_at"));
    assert!(lean.contains("CREATE OR REPLACE FUNCTION tessera__load("));
    for line in lean.lines().filter(|l| l.starts_with("CREATE ")) {
        assert!(line.starts_with("CREATE OR REPLACE FUNCTION "), "{line}");
    }
    for line in lean.lines().filter(|l| l.starts_with("DROP ")) {
        assert!(line.starts_with("DROP FUNCTION IF EXISTS "), "{line}");
    }
}

/// Migration 5 alters what migrations 1 and 4 created, idempotently, and creates the step
/// again.
#[test]
fn the_head_bound_and_local_grants_come_fifth_and_run_again_harmlessly() {
    let fifth = MIGRATIONS[4].concat().concat();
    assert!(fifth.starts_with("-- tessera PostgreSQL store, migration 5"));
    assert!(fifth.contains("ADD COLUMN IF NOT EXISTS head_seq"));
    assert!(fifth.contains(
        "CREATE OR REPLACE FUNCTION tessera_release(p_name text, p_lease text, p_client text)"
    ));
    for line in fifth.lines().filter(|l| l.starts_with("CREATE ")) {
        assert!(
            line.starts_with("CREATE OR REPLACE FUNCTION ")
                || line.starts_with("CREATE INDEX IF NOT EXISTS "),
            "{line}"
        );
    }
    for line in fifth.lines().filter(|l| l.starts_with("DROP ")) {
        assert!(line.starts_with("DROP INDEX IF EXISTS "), "{line}");
    }
}

/// Migration 6 adds the waiters' `gate` idempotently, then creates the step (whose hand-off
/// stops at gated waiters), the rate functions (the decision and the undo that the admission
/// shares) and the admission's functions, each of them again harmlessly.
#[test]
fn admission_comes_sixth_and_runs_again_harmlessly() {
    let sixth = MIGRATIONS[5].concat().concat();
    assert!(sixth.starts_with("-- tessera PostgreSQL store, migration 6"));
    assert!(sixth.contains("ALTER TABLE tessera_waiters ADD COLUMN IF NOT EXISTS gate bigint;"));
    for f in [
        "tessera__hand_off(",
        "tessera__rate_step(",
        "tessera__rate_undo(",
        "tessera_rate_acquire(",
        "tessera_admit(",
        "tessera_give_back(",
    ] {
        assert!(
            sixth.contains(&format!("CREATE OR REPLACE FUNCTION {f}")),
            "{f}"
        );
    }
    assert!(sixth.contains("AND gate IS NULL"));
    for line in sixth.lines().filter(|l| l.starts_with("CREATE ")) {
        assert!(line.starts_with("CREATE OR REPLACE FUNCTION "), "{line}");
    }
    // The admission's functions come after what they call.
    let at = |f: &str| {
        sixth
            .find(&format!("CREATE OR REPLACE FUNCTION {f}("))
            .unwrap()
    };
    assert!(at("tessera__rate_step") < at("tessera_admit"));
    assert!(at("tessera__rate_undo") < at("tessera_give_back"));
}

/// Migration 8 adds fair shares' tags idempotently, drops the acquire and the admission of
/// the old arguments (their new ones have defaults, so an old call would be ambiguous beside
/// them), then creates the step, the rate functions and the admission's again, the queue
/// ordered by `(tag, seq)`.
#[test]
fn fair_shares_come_eighth_and_run_again_harmlessly() {
    let eighth = MIGRATIONS[7].concat().concat();
    assert!(eighth.starts_with("-- tessera PostgreSQL store, migration 8"));
    for column in [
        "tessera_semaphores ADD COLUMN IF NOT EXISTS vtime",
        "tessera_semaphores ADD COLUMN IF NOT EXISTS finish",
        "tessera_semaphores ADD COLUMN IF NOT EXISTS tenants",
        "tessera_waiters ADD COLUMN IF NOT EXISTS tag",
    ] {
        assert!(
            eighth.contains(&format!("ALTER TABLE {column} ")),
            "{column}"
        );
    }
    assert!(eighth.contains("CREATE TABLE IF NOT EXISTS tessera_tenants ("));
    for line in eighth.lines().filter(|l| l.starts_with("CREATE ")) {
        assert!(
            line.starts_with("CREATE OR REPLACE FUNCTION ")
                || line.starts_with("CREATE INDEX IF NOT EXISTS ")
                || line.starts_with("CREATE TABLE IF NOT EXISTS "),
            "{line}"
        );
    }
    for line in eighth.lines().filter(|l| l.starts_with("DROP ")) {
        assert!(line.starts_with("DROP FUNCTION IF EXISTS "), "{line}");
    }
    let at = |s: &str| eighth.find(s).unwrap();
    assert!(
        at("DROP FUNCTION IF EXISTS tessera_acquire(")
            < at("CREATE OR REPLACE FUNCTION tessera_acquire(")
    );
    assert!(
        at("DROP FUNCTION IF EXISTS tessera_admit(")
            < at("CREATE OR REPLACE FUNCTION tessera_admit(")
    );
    assert!(eighth.contains("ORDER BY tag, seq LIMIT 1"));
}

/// Migration 9 adds the tenant to waiters and holders idempotently, drops the functions whose
/// result columns or arguments change (their arguments as before, so an older build's call
/// resolves to the new ones), then creates the step, the rate functions and the admission's
/// again, each lease-returning function with `tenant` as its last column.
#[test]
fn tenants_on_rows_come_ninth_and_run_again_harmlessly() {
    let ninth = MIGRATIONS[8].concat().concat();
    assert!(ninth.starts_with("-- tessera PostgreSQL store, migration 9"));
    for table in ["tessera_waiters", "tessera_holders"] {
        assert!(
            ninth.contains(&format!(
                "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS tenant text;"
            )),
            "{table}"
        );
    }
    for line in ninth.lines().filter(|l| l.starts_with("DROP ")) {
        assert!(line.starts_with("DROP FUNCTION IF EXISTS "), "{line}");
    }
    let at = |s: &str| ninth.find(s).unwrap();
    for f in [
        "tessera__grant(",
        "tessera_acquire(",
        "tessera_heartbeat(",
        "tessera_heartbeat_many(",
        "tessera_admit(",
    ] {
        assert!(
            at(&format!("DROP FUNCTION IF EXISTS {f}"))
                < at(&format!("CREATE OR REPLACE FUNCTION {f}")),
            "{f}"
        );
    }
    assert!(ninth.contains("    queued bigint, stored_capacity bigint, tenant text\n)"));
    assert!(ninth.contains("    acquired_at bigint, expires_at bigint, tenant text\n)"));
    assert!(ninth.contains("    stored_limits text, tenant text\n)"));
}

/// Migration 10 adds tenants' limits idempotently (a table of their own, the row's count and
/// the queue's bound, the step's state), changes no function's arguments or result (nothing
/// dropped: an older build's calls resolve as before), then creates the step, the rate
/// functions and the admission's again, with `tessera_set_tenant_limits`.
#[test]
fn tenant_limits_come_tenth_and_run_again_harmlessly() {
    let tenth = MIGRATIONS[9].concat().concat();
    assert!(tenth.starts_with("-- tessera PostgreSQL store, migration 10"));
    assert!(tenth.contains("CREATE TABLE IF NOT EXISTS tessera_limits ("));
    for column in ["limits bigint NOT NULL DEFAULT 0", "tag_low bigint"] {
        assert!(
            tenth.contains(&format!(
                "ALTER TABLE tessera_semaphores ADD COLUMN IF NOT EXISTS {column};"
            )),
            "{column}"
        );
    }
    for line in tenth.lines().filter(|l| l.starts_with("CREATE ")) {
        assert!(
            line.starts_with("CREATE OR REPLACE FUNCTION ")
                || line.starts_with("CREATE INDEX IF NOT EXISTS ")
                || line.starts_with("CREATE TABLE IF NOT EXISTS "),
            "{line}"
        );
    }
    assert!(!tenth.lines().any(|l| l.starts_with("DROP ")));
    assert!(tenth.contains("CREATE OR REPLACE FUNCTION tessera_set_tenant_limits("));
    assert!(tenth.contains("CREATE OR REPLACE FUNCTION tessera__hand_off_limited("));
}

/// Migration 11 adds window ceilings idempotently (two columns of `tessera_limits`, the
/// step's state), drops only the two functions whose arguments change before they are
/// created again (the rate step, `tessera_set_tenant_limits`), then creates the step, the
/// rate functions and the admission's again.
#[test]
fn window_ceilings_come_eleventh_and_run_again_harmlessly() {
    let eleventh = MIGRATIONS[10].concat().concat();
    assert!(eleventh.starts_with("-- tessera PostgreSQL store, migration 11"));
    for column in ["window_ceiling bigint", "capped_until bigint"] {
        assert!(
            eleventh.contains(&format!(
                "ALTER TABLE tessera_limits ADD COLUMN IF NOT EXISTS {column};"
            )),
            "{column}"
        );
    }
    for line in eleventh.lines().filter(|l| l.starts_with("CREATE ")) {
        assert!(
            line.starts_with("CREATE OR REPLACE FUNCTION ")
                || line.starts_with("CREATE INDEX IF NOT EXISTS ")
                || line.starts_with("CREATE TABLE IF NOT EXISTS "),
            "{line}"
        );
    }
    let drops: Vec<_> = eleventh
        .lines()
        .filter(|l| l.starts_with("DROP "))
        .collect();
    assert_eq!(drops.len(), 2, "{drops:?}");
    let at = |s: &str| eleventh.find(s).unwrap();
    for f in ["tessera__rate_step(", "tessera_set_tenant_limits("] {
        assert!(
            at(&format!("DROP FUNCTION IF EXISTS {f}"))
                < at(&format!("CREATE OR REPLACE FUNCTION {f}")),
            "{f}"
        );
    }
    assert!(eleventh.contains("CREATE OR REPLACE FUNCTION tessera__rate_scaled("));
}

/// The step says its revision, the one this build creates; the latest migration creates the
/// step, so a fresh schema has it.
#[test]
fn the_step_says_its_revision() {
    let step = ops::STEP_AGAIN.concat().concat();
    assert!(step.contains(&format!(
        "CREATE OR REPLACE FUNCTION tessera__step_revision() RETURNS int\n\
         LANGUAGE sql IMMUTABLE AS 'SELECT {}';",
        ops::STEP_REVISION
    )));
    assert!(step.contains("lasts := least(h.ttl, h.expires_at - st.now_us);"));
    assert!(MIGRATIONS.last().unwrap().concat().concat().contains(&step));
}

#[test]
fn operation_functions_are_created_by_the_migration() {
    let all: String = MIGRATIONS.concat().concat().concat();
    for f in [
        "tessera_acquire",
        "tessera_heartbeat",
        "tessera_cancel",
        "tessera_release",
        "tessera_renew",
        "tessera_status",
        "tessera_resize",
        "tessera_revoke",
        "tessera_delete",
        "tessera_admit",
        "tessera_give_back",
        "tessera_set_tenant_limits",
    ] {
        assert!(
            all.contains(&format!("CREATE OR REPLACE FUNCTION {f}(")),
            "{f}"
        );
    }
}

#[tokio::test]
async fn a_bad_url_is_refused_before_any_connection() {
    let err = PostgresBackend::connect("postgres://u:hunter2@127.0.0.1:1/db?schema=BAD")
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::StoreUrl { .. })),
        "{err}"
    );
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[tokio::test]
async fn an_unreachable_server_is_a_connection_error_without_the_password() {
    // Port 1 on loopback: nothing listens there.
    let err = PostgresBackend::connect("postgres://u:hunter2@127.0.0.1:1/db")
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("hunter2"), "{err}");
}
