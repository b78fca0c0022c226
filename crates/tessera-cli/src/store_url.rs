//! Which store a command talks to: `--store URL`, else `TESSERA_STORE` (both handled by clap),
//! else the embedded SQLite store in the user's state directory.
//!
//! `run` and `bench` [`connect`], creating the store if needed; `status`, `revoke`, `resize`
//! and `delete` only act on existing state, so they [`open_existing`] and create nothing.

use std::path::PathBuf;

use tessera::Store;

use crate::exit::{Failure, NOT_FOUND, USAGE};

/// The default store URL: `sqlite://$XDG_STATE_HOME/tessera/tessera.db`, or
/// `sqlite://$HOME/.local/state/tessera/tessera.db` when `XDG_STATE_HOME` is unset, empty or
/// relative (the XDG spec says relative values are to be ignored). Pure: creates nothing.
pub fn default_db_path() -> Result<PathBuf, Failure> {
    let xdg = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = match xdg {
        Some(dir) => dir,
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .map(|home| home.join(".local").join("state"))
            .ok_or_else(|| {
                Failure::new(
                    USAGE,
                    "no store given and neither XDG_STATE_HOME nor HOME is set; use --store URL or TESSERA_STORE",
                )
            })?,
    };
    Ok(base.join("tessera").join("tessera.db"))
}

/// Connects to `url`, or to the default store (creating its directory) when `url` is `None`.
///
/// Call this only after every other argument has been validated: the SQLite store creates its
/// file on connect, and invalid input must touch nothing.
pub async fn connect(url: Option<&str>) -> Result<Store, Failure> {
    let url = url_or_default(url, true)?;
    let store = Store::connect(&url).await?;
    tracing::debug!(store = %store.url(), "connected");
    Ok(store)
}

/// What [`open_existing`] found.
pub enum Existing {
    /// The store exists and is open.
    Open(Store),
    /// There is no store at `url` yet (a SQLite file that does not exist); nothing was
    /// created. `reason` says what is missing.
    Missing { url: String, reason: String },
}

impl Existing {
    /// The open store, or a [`NOT_FOUND`] failure saying there is no store and that
    /// `nothing_done` (e.g. "nothing revoked").
    pub fn required(self, nothing_done: &str) -> Result<Store, Failure> {
        match self {
            Existing::Open(store) => Ok(store),
            Existing::Missing { url, reason } => Err(Failure::new(
                NOT_FOUND,
                format!("no store at {url} ({reason}); {nothing_done}"),
            )),
        }
    }
}

/// Opens the store of `url` (or the default one) only if it exists, creating nothing: not
/// the SQLite file, not its folder. For the commands that only act on existing state.
pub async fn open_existing(url: Option<&str>) -> Result<Existing, Failure> {
    let url = url_or_default(url, false)?;
    match Store::connect_existing(&url).await {
        Ok(store) => {
            tracing::debug!(store = %store.url(), "opened");
            Ok(Existing::Open(store))
        }
        Err(tessera::Error::NoStore { url, reason }) => Ok(Existing::Missing { url, reason }),
        Err(e) => Err(e.into()),
    }
}

/// `url`, or the default store's URL (creating its folder only if `create`).
fn url_or_default(url: Option<&str>, create: bool) -> Result<String, Failure> {
    Ok(match url {
        Some(u) if !u.trim().is_empty() => u.to_string(),
        _ => {
            let path = default_db_path()?;
            if let Some(dir) = path.parent().filter(|_| create) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Failure::new(
                        crate::exit::UNAVAILABLE,
                        format!("cannot create the state directory {}: {e}", dir.display()),
                    )
                })?;
            }
            format!("sqlite://{}", path.display())
        }
    })
}
