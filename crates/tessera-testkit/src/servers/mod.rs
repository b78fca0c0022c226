//! Throwaway servers for integration tests: each starts on a free loopback port in its own
//! temporary directory and stops when dropped. A missing server binary is a test failure
//! with the install line, never a skip.

pub mod etcd;
pub mod mysql;
pub mod pgbouncer;
pub mod postgres;
pub mod redis;
pub mod redis_cluster;
pub mod redis_sentinel;
