//! The store of one scenario ([`harness`]) and the worker binary ([`sibling_binary`]).

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::StoreSpec;
use crate::harness::Harness;

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

/// The store of one scenario: a [`Harness`] for `spec`, with a tag of its own (a key prefix,
/// a file name); `redis_args` are extra options of a throwaway server.
pub fn harness(spec: &StoreSpec, name: &str, seed: u64, redis_args: &[&str]) -> Harness {
    let tag = format!("chaos-{name}-{seed}-{:08x}", rand::random::<u32>());
    match spec {
        StoreSpec::Sqlite(None) => Harness::sqlite(),
        StoreSpec::Sqlite(Some(path)) => {
            Harness::sqlite_file(Path::new(&format!("{}.{tag}.db", path.display())))
        }
        StoreSpec::Redis(None) => Harness::redis_with(redis_args, &tag),
        StoreSpec::Redis(Some(url)) => Harness::redis_at(url, &tag),
        StoreSpec::Postgres => Harness::postgres(),
        StoreSpec::Mariadb => Harness::mariadb(),
        StoreSpec::Etcd(None) => Harness::etcd(),
        StoreSpec::Etcd(Some(url)) => Harness::new(
            "etcd://",
            format!("{}/{tag}", url.trim_end_matches('/')),
            crate::harness::StoreTraits::OWN_ETCD,
            Box::new(()),
        ),
        StoreSpec::RedisSentinel { wait: 0 } => Harness::redis_sentinel(""),
        StoreSpec::RedisSentinel { wait } => Harness::redis_sentinel(&format!("&wait={wait}")),
        StoreSpec::RedisCluster => Harness::redis_cluster(true),
    }
}
