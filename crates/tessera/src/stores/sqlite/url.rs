//! Parsing a `sqlite://` URL into the path of the database file (see the [store's docs](super)).

use std::path::{Path, PathBuf};

use tessera_core::error::{Error, Result};

/// Parses a `sqlite://` URL into a file path (see the module docs).
pub(crate) fn parse_url(url: &str) -> Result<PathBuf> {
    let bad = |reason: String| Error::bad_store_url(url, reason);
    let rest = url
        .strip_prefix("sqlite://")
        .ok_or_else(|| bad("expected sqlite:///absolute/path.db".into()))?;
    if let Some((_, query)) = rest.split_once('?') {
        let key = query.split('&').next().unwrap_or("");
        let key = key.split_once('=').map_or(key, |(k, _)| k);
        return Err(bad(format!(
            "unknown query parameter {key:?}: sqlite URLs take no parameters"
        )));
    }
    if rest.contains('#') {
        return Err(bad("sqlite URLs take no #fragment".into()));
    }
    if rest.is_empty() || rest == "/" {
        return Err(bad(
            "no file path; expected sqlite:///absolute/path.db".into()
        ));
    }
    if rest.starts_with(':') {
        return Err(bad(
            "in-memory SQLite databases are not shared between connections; name a file".into(),
        ));
    }
    if !rest.starts_with('/') && rest.contains('@') {
        // `sqlite://user:password@host/…` reads as a URL with a password: never echo it
        // (found by the `store_url` fuzz target).
        return Err(bad(
            "SQLite URLs take no user, password or host; write an absolute path with three \
             slashes, e.g. sqlite:///absolute/path.db"
                .into(),
        ));
    }
    if !rest.starts_with('/') {
        // Relative to the current directory, two processes started in different folders
        // would silently use two files. Show the absolute URL that means this directory.
        let base = match rest.strip_prefix("~/") {
            Some(_) => std::env::var_os("HOME").map(PathBuf::from),
            None => std::env::current_dir().ok(),
        };
        let here = match base {
            Some(base) => {
                let path: PathBuf = base
                    .join(rest.strip_prefix("~/").unwrap_or(rest))
                    .components()
                    .collect();
                format!("sqlite://{}", path.display())
            }
            None => "sqlite:///absolute/path.db".into(),
        };
        return Err(bad(format!(
            "the path {rest:?} is relative, so each working directory would get its own \
             store; write an absolute path with three slashes, e.g. {here}"
        )));
    }
    if rest.ends_with('/') || Path::new(rest).is_dir() {
        return Err(bad("the path names a folder, not a database file".into()));
    }
    Ok(PathBuf::from(rest))
}
