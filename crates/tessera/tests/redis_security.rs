//! Security of the Redis store against throwaway `redis-server`s (a missing `redis-server`
//! fails the test with the install line): tenant isolation by key prefix, with and without
//! least-privilege ACL users; passwords never printed (Debug, Display, `Store::url`, logs);
//! TLS with an untrusted CA refused.
#![cfg(feature = "redis")]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera::*;
use tessera_testkit::servers::redis::RedisServer;

/// The least-privilege command list of the module docs (semaphores and rate limiters).
const COMMANDS: &str =
    "-@all +fcall +evalsha +script|load +subscribe +ping +scan +config|get +time \
    +hmget +hget +hset +hdel +hgetall +zadd +zrem +zrange +zrangebyscore +zrank +zcard \
    +zremrangebyrank +zremrangebyscore +exists +del +get +set +pexpire +publish +hlen +zscore \
    +persist";

/// `ACL SETUSER <user> on ><password> resetkeys <keys> resetchannels <channels> <COMMANDS>`.
fn set_user(server: &RedisServer, user: &str, password: &str, keys: &str, channels: &str) {
    let pw = format!(">{password}");
    let mut words = vec!["ACL", "SETUSER", user, "on", &pw, "resetkeys", keys];
    words.push("resetchannels");
    words.push(channels);
    words.extend(COMMANDS.split_whitespace());
    let reply = server.command(&words);
    assert!(reply.starts_with("+OK"), "{reply}");
}

/// Every key in the server (as the default user, which has every right), sorted.
fn all_keys(server: &RedisServer) -> Vec<String> {
    let reply = server.command(&["KEYS", "*"]);
    let mut keys: Vec<String> = reply
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .map(str::to_string)
        .collect();
    keys.sort();
    keys
}

fn patient() -> SemaphoreOptions {
    SemaphoreOptions::default()
        .ttl(Duration::from_secs(60))
        .waiter_ttl(Duration::from_secs(60))
}

/// Every store operation under `prefix` works for tenant A's user.
async fn exercise_every_operation(store: &Store) {
    let sem = Semaphore::new(store, "jobs", 1, patient()).unwrap();
    let held = sem.acquire().await.unwrap();
    assert!(sem.try_acquire().await.unwrap().is_none());
    let st = store.status("jobs").await.unwrap().unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(store.list().await.unwrap(), vec!["jobs".to_string()]);
    assert!(held.release().await.unwrap());
    let p = sem.acquire().await.unwrap();
    assert_eq!(store.resize("jobs", 3).await.unwrap(), 1);
    assert!(store
        .revoke("jobs", &p.lease_id().to_string())
        .await
        .unwrap());
    drop(p);
    let _q = sem
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the revoke");
    assert!(store.delete("jobs").await.unwrap());
    assert!(store.status("jobs").await.unwrap().is_none());
    let limiter = store
        .rate_limiter("api", &[RateSpec::per_second(2).unwrap()])
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap().is_admitted());
    assert!(limiter.try_acquire(1).await.unwrap().is_admitted());
    assert!(!limiter.try_acquire(1).await.unwrap().is_admitted());
    assert!(store.rate_status("api").await.unwrap().is_some());
    assert_eq!(store.rate_list().await.unwrap(), vec!["api".to_string()]);
}

/// Every operation fails with a typed error (never a permit, never a panic).
async fn every_operation_is_refused(store: &Store) {
    let check = |what: &str, e: Error| {
        assert!(
            matches!(e, Error::Store { .. }),
            "{what}: expected a store error, got {e:?}"
        );
        assert!(!e.is_invalid_input(), "{what}: {e}");
    };
    let sem = Semaphore::new(store, "jobs", 1, patient()).unwrap();
    check("try_acquire", sem.try_acquire().await.unwrap_err());
    let acquired = tokio::time::timeout(Duration::from_secs(20), sem.acquire())
        .await
        .expect("acquire answers");
    check("acquire", acquired.unwrap_err());
    check("status", store.status("jobs").await.unwrap_err());
    check(
        "revoke",
        store
            .revoke("jobs", "0123456789abcdef0123456789abcdef")
            .await
            .unwrap_err(),
    );
    check("resize", store.resize("jobs", 2).await.unwrap_err());
    check("delete", store.delete("jobs").await.unwrap_err());
    let limiter = store
        .rate_limiter("api", &[RateSpec::per_second(2).unwrap()])
        .unwrap();
    check(
        "rate try_acquire",
        limiter.try_acquire(1).await.unwrap_err(),
    );
    check("rate acquire", limiter.acquire(1).await.unwrap_err());
    check("rate_status", store.rate_status("api").await.unwrap_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_are_confined_to_their_tenant_prefix() {
    let server = RedisServer::start();
    let port = server.port();
    set_user(
        &server,
        "tenant-a",
        "pw-a",
        "~{tenantA:*",
        "&tenantA:wake:*",
    );
    set_user(
        &server,
        "tenant-b",
        "pw-b",
        "~{tenantB:*",
        "&tenantB:wake:*",
    );

    // Tenant B's data, written by tenant B's own user.
    let b = Store::connect(&format!(
        "redis://tenant-b:pw-b@127.0.0.1:{port}?prefix=tenantB"
    ))
    .await
    .unwrap();
    let b_sem = Semaphore::new(&b, "jobs", 1, patient()).unwrap();
    let b_permit = b_sem.acquire().await.unwrap();
    let b_limiter = b
        .rate_limiter("api", &[RateSpec::per_second(2).unwrap()])
        .unwrap();
    assert!(b_limiter.try_acquire(1).await.unwrap().is_admitted());
    let before: Vec<String> = all_keys(&server);
    assert!(!before.is_empty());
    assert!(
        before.iter().all(|k| k.starts_with("{tenantB:")),
        "{before:?}"
    );
    let b_dump: Vec<String> = before
        .iter()
        .map(|k| server.command(&["DUMP", k]))
        .collect();

    // Tenant A, under its own prefix: every operation works.
    let a = Store::connect(&format!(
        "redis://tenant-a:pw-a@127.0.0.1:{port}?prefix=tenantA"
    ))
    .await
    .unwrap();
    exercise_every_operation(&a).await;

    // Tenant A's user under tenant B's prefix: refused at connect (the wake channel is B's).
    let e = Store::connect(&format!(
        "redis://tenant-a:pw-a@127.0.0.1:{port}?prefix=tenantB"
    ))
    .await
    .unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "{e:?}");
    // A setup mistake, not a blip: nothing tells the caller to retry it.
    assert!(!e.is_transient(), "an ACL refusal looks retryable: {e:?}");
    assert!(!e.to_string().contains("pw-a"), "{e}");

    // A user whose channels are open but whose keys are tenant A's: every operation under
    // tenant B's prefix is refused by the server, as a typed error.
    set_user(&server, "tenant-a-open", "pw-x", "~{tenantA:*", "&*");
    let cross = Store::connect(&format!(
        "redis://tenant-a-open:pw-x@127.0.0.1:{port}?prefix=tenantB"
    ))
    .await
    .unwrap();
    every_operation_is_refused(&cross).await;
    // ...while the same user under its own prefix works.
    let own = Store::connect(&format!(
        "redis://tenant-a-open:pw-x@127.0.0.1:{port}?prefix=tenantA"
    ))
    .await
    .unwrap();
    assert!(own.list().await.unwrap().is_empty());

    // Tenant B's keys are exactly as they were; everything else is tenant A's.
    let after = all_keys(&server);
    let b_after: Vec<String> = after
        .iter()
        .filter(|k| !k.starts_with("{tenantA:"))
        .cloned()
        .collect();
    assert_eq!(b_after, before);
    let b_dump_after: Vec<String> = before
        .iter()
        .map(|k| server.command(&["DUMP", k]))
        .collect();
    assert_eq!(b_dump_after, b_dump, "tenant B's values changed");
    assert_eq!(b.status("jobs").await.unwrap().unwrap().holders.len(), 1);
    assert!(b_permit.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_prefixes_on_one_server_are_independent_semaphores() {
    let server = RedisServer::start();
    let a = Store::connect(&format!("{}?prefix=tenantA", server.url()))
        .await
        .unwrap();
    let b = Store::connect(&format!("{}?prefix=tenantB", server.url()))
        .await
        .unwrap();
    let sa = Semaphore::new(&a, "shared-name", 1, patient()).unwrap();
    let sb = Semaphore::new(&b, "shared-name", 1, patient()).unwrap();
    let pa = sa.try_acquire().await.unwrap().expect("A's only permit");
    let pb = sb.try_acquire().await.unwrap().expect("B's only permit");
    assert!(sa.try_acquire().await.unwrap().is_none());
    assert!(sb.try_acquire().await.unwrap().is_none());
    // Different capacities under the same name: no mismatch across prefixes.
    let sb3 = Semaphore::new(&b, "other", 3, patient()).unwrap();
    let sa1 = Semaphore::new(&a, "other", 1, patient()).unwrap();
    let _q = sb3.try_acquire().await.unwrap().unwrap();
    let _r = sa1.try_acquire().await.unwrap().unwrap();
    assert_eq!(
        a.status("shared-name")
            .await
            .unwrap()
            .unwrap()
            .holders
            .len(),
        1
    );
    assert!(pa.release().await.unwrap());
    assert!(
        b.status("shared-name")
            .await
            .unwrap()
            .unwrap()
            .holders
            .len()
            == 1
    );
    assert!(pb.release().await.unwrap());
    let keys = all_keys(&server);
    assert!(
        keys.iter()
            .all(|k| k.starts_with("{tenantA:") || k.starts_with("{tenantB:")),
        "{keys:?}"
    );
}

/// A `MakeWriter` into a shared buffer.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buffer {
    type Writer = Buffer;
    fn make_writer(&'a self) -> Buffer {
        self.clone()
    }
}

const CANARY: &str = "canary-Zq8xW3vT7pLm";

#[track_caller]
fn assert_hidden(what: &str, text: &str) {
    assert!(!text.contains(CANARY), "{what} shows the password: {text}");
    assert!(
        !text.contains("Zq8xW3"),
        "{what} shows part of the password: {text}"
    );
}

fn assert_error_hidden(what: &str, e: &Error) {
    assert_hidden(what, &e.to_string());
    assert_hidden(what, &format!("{e:?}"));
    assert_hidden(what, &format!("{e:#}"));
    assert_hidden(what, &format!("{e:#?}"));
}

// Current-thread runtime: the log subscriber is installed for this thread, and every task of
// the test (subscriber loops included) runs on it.
#[tokio::test(flavor = "current_thread")]
async fn a_canary_password_never_appears_in_debug_errors_or_logs() {
    let logs = Buffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    tracing::info!("log capture works");

    let server =
        RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"]);
    let port = server.port();
    let pw = format!(">{CANARY}");
    let reply = server.command(&["ACL", "SETUSER", "app", "on", &pw, "~*", "&*", "+@all"]);
    assert!(reply.starts_with("+OK"), "{reply}");
    let good = format!("redis://app:{CANARY}@127.0.0.1:{port}?prefix=canary");

    // A working store: Debug, url(), operations.
    let store = Store::connect(&good).await.unwrap();
    assert_hidden("store Debug", &format!("{store:?}"));
    assert_hidden("store Debug", &format!("{store:#?}"));
    assert_hidden("store url", store.url());
    assert!(store.url().contains("***"), "{}", store.url());
    assert_hidden("backend Debug", &format!("{:?}", store.backend()));
    let sem = Semaphore::new(&store, "c", 1, patient()).unwrap();
    let permit = sem.acquire().await.unwrap();
    assert_hidden("permit Debug", &format!("{permit:?}"));
    let limiter = store
        .rate_limiter("c", &[RateSpec::per_second(1).unwrap()])
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap().is_admitted());
    permit.release().await.unwrap();

    // Every error that can be provoked.
    let wrong = format!("redis://app:{CANARY}x@127.0.0.1:{port}");
    let e = Store::connect(&wrong).await.unwrap_err();
    assert_error_hidden("wrong password", &e);
    let refused = format!("redis://u:{CANARY}@127.0.0.1:1");
    let e = Store::connect(&refused).await.unwrap_err();
    assert!(e.is_connection(), "{e:?}");
    assert_error_hidden("refused connection", &e);
    for bad in [
        format!("redis://u:{CANARY}@127.0.0.1:{port}?bogus=1"),
        format!("redis://u:{CANARY}@127.0.0.1:{port}?prefix=no{{braces}}"),
        format!("redis://u:{CANARY}@127.0.0.1:{port}?eviction=maybe"),
        format!("redis://u:{CANARY}@127.0.0.1:{port}/notadb"),
        format!("redis://u:{CANARY}@/0"),
        format!("nosuch://u:{CANARY}@127.0.0.1:{port}"),
        format!("redis+sentinel://u:{CANARY}@127.0.0.1:{port}"),
        format!("redis://u:{CANARY}@[::1:{port}"),
    ] {
        let e = Store::connect(&bad).await.unwrap_err();
        assert!(e.is_invalid_input(), "{bad}: {e:?}");
        assert_error_hidden("bad URL", &e);
    }
    // '@' in a password (unencoded): a URL all the same, refused by the server.
    let e = Store::connect(&format!("redis://u:{CANARY}@@127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert_error_hidden("'@' in the password", &e);
    let e = Store::connect(&format!("{good}&eviction=refuse"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("maxmemory-policy"), "{e}");
    assert_error_hidden("eviction refusal", &e);

    // ACL denial: a user confined to another prefix.
    let mut words = vec![
        "ACL",
        "SETUSER",
        "confined",
        "on",
        &pw,
        "resetkeys",
        "~{mine:*",
        "resetchannels",
        "&*",
    ];
    words.extend(COMMANDS.split_whitespace());
    let reply = server.command(&words);
    assert!(reply.starts_with("+OK"), "{reply}");
    let confined = Store::connect(&format!(
        "redis://confined:{CANARY}@127.0.0.1:{port}?prefix=theirs"
    ))
    .await
    .unwrap();
    assert_hidden("confined store", &format!("{confined:?}"));
    let e = confined.status("x").await.unwrap_err();
    assert_error_hidden("ACL denial", &e);
    let e = confined
        .rate_limiter("x", &[RateSpec::per_second(1).unwrap()])
        .unwrap()
        .try_acquire(1)
        .await
        .unwrap_err();
    assert_error_hidden("ACL denial (rate)", &e);
    drop(confined);
    drop(store);

    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(text.contains("log capture works"), "{text}");
    assert_hidden("logs", &text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_an_untrusted_ca_is_a_connection_error() {
    let server = RedisServer::start_tls();
    // SSL_CERT_FILE is never set in this binary: the test CA is not trusted.
    let started = std::time::Instant::now();
    let e = Store::connect(&server.tls_url()).await.unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "{e:?}");
    assert!(e.is_connection(), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
    // The plain port of the same server works: the failure was the certificate.
    let plain = Store::connect(&server.url()).await.unwrap();
    assert!(plain.status("x").await.unwrap().is_none());
}
