//! Throwaway servers for integration tests: each starts on a free loopback port in its own
//! temporary directory and stops when dropped. A missing server binary is a test failure
//! with the install line, never a skip.

pub mod etcd;
pub mod mysql;
pub mod pgbouncer;
pub mod postgres;
pub mod process;
pub mod redis;
pub mod redis_cluster;
pub mod redis_sentinel;

pub use process::free_port;

/// Runs `calls` (several calls of one client at once) until the server counts at least `n`
/// sessions of that client (`sessions()`), at most 200 times; panics if it never does. One
/// round may open fewer, since a call that ends before another starts lends its connection
/// again. For tests that fill a client's pool with idle connections, then kill them all.
pub async fn fill_pool<F, Fut>(n: usize, sessions: impl Fn() -> usize, mut calls: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..200 {
        if sessions() >= n {
            return;
        }
        calls().await;
    }
    assert!(
        sessions() >= n,
        "fewer than {n} connections open after 200 rounds"
    );
}
