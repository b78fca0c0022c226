//! The store of one scenario ([`Env`]) and the worker binary ([`sibling_binary`]).

use std::path::PathBuf;

use anyhow::Context;

use super::StoreSpec;
use crate::servers::redis::RedisServer;

/// Path of a binary of this crate built next to the running executable (a test binary lives
/// in `target/<profile>/deps`, the binaries in `target/<profile>`).
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("exe dir")?;
    for d in [dir, dir.parent().unwrap_or(dir)] {
        let p = d.join(name);
        if p.exists() {
            return Ok(p);
        }
    }
    anyhow::bail!(
        "{name} is not built next to {}; build the workspace (cargo build -p tessera-testkit) first",
        exe.display()
    )
}

/// The store of one scenario, and whatever keeps it alive.
pub struct Env {
    /// `sqlite` or `redis`.
    pub kind: &'static str,
    /// The store's URL, straight to the store.
    pub url: String,
    /// The throwaway server, if the runner owns it.
    pub redis: Option<RedisServer>,
    _dir: tempfile::TempDir,
}

impl Env {
    /// A fresh store for scenario `name`; `redis_args` are extra server options for a
    /// throwaway server.
    pub fn new(
        spec: &StoreSpec,
        name: &str,
        seed: u64,
        redis_args: &[&str],
    ) -> anyhow::Result<Env> {
        let dir = tempfile::tempdir()?;
        let tag = format!("chaos-{name}-{seed}-{:08x}", rand::random::<u32>());
        Ok(match spec {
            StoreSpec::Sqlite(None) => Env {
                kind: "sqlite",
                url: format!("sqlite://{}/tessera.db", dir.path().display()),
                redis: None,
                _dir: dir,
            },
            StoreSpec::Sqlite(Some(path)) => Env {
                kind: "sqlite",
                url: format!("sqlite://{}.{tag}.db", path.display()),
                redis: None,
                _dir: dir,
            },
            StoreSpec::Redis(None) => {
                let server = RedisServer::start_with(redis_args);
                Env {
                    kind: "redis",
                    url: format!("{}?prefix={tag}", server.url()),
                    redis: Some(server),
                    _dir: dir,
                }
            }
            StoreSpec::Redis(Some(url)) => {
                let sep = if url.contains('?') { '&' } else { '?' };
                Env {
                    kind: "redis",
                    url: format!("{url}{sep}prefix={tag}"),
                    redis: None,
                    _dir: dir,
                }
            }
        })
    }
}
