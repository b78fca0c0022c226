//! Throwaway servers for integration tests: each starts on a free loopback port in its own
//! temporary directory and stops when dropped. A missing server binary is a test failure
//! with the install line, never a skip.

pub mod postgres;
pub mod mysql;
pub mod etcd;
pub mod redis;
pub mod redis_cluster;
pub mod redis_sentinel;
