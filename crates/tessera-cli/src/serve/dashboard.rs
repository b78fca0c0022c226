//! The dashboard at `/`: every semaphore with its holders (lease, holder label, seats, fence,
//! time left), its queue in order and, once a request named a tenant, holders, waiters and
//! permits per tenant, every rate limiter with its usage per window and next
//! free time. The page is rendered on the server (it reads without JavaScript); a few lines of
//! script then redraw it from `/v1/dashboard/events`, a server-sent event stream carrying one
//! `snapshot` every [`EVERY`]. No build step, no external assets.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::Html;
use axum::routing::get;
use axum::{Json, Router};
use futures::Stream;
use serde::Serialize;

use super::auth::Principal;
use super::rates::RateStatusBody;
use super::semaphores::StatusBody;
use super::App;

/// How often the live page is refreshed.
const EVERY: Duration = Duration::from_millis(500);
/// At most this many semaphores and limiters are shown.
const MAX_SHOWN: usize = 100;

/// Everything the page shows.
#[derive(Debug, Serialize)]
struct Snapshot {
    semaphores: Vec<StatusBody>,
    rates: Vec<RateStatusBody>,
    /// Store errors met while taking the snapshot (the page shows them).
    errors: Vec<String>,
}

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/", get(page))
        .route("/v1/dashboard/snapshot", get(snapshot_json))
        .route("/v1/dashboard/events", get(events))
}

async fn snapshot(app: &App, principal: &Principal) -> Snapshot {
    let mut snap = Snapshot {
        semaphores: vec![],
        rates: vec![],
        errors: vec![],
    };
    match app.bounded("the list", app.store.list()).await {
        Ok(Ok(mut names)) => {
            names.retain(|n| principal.covers(n));
            names.sort();
            for name in names.into_iter().take(MAX_SHOWN) {
                match app.bounded("the status", app.store.status(&name)).await {
                    Ok(Ok(Some(s))) => {
                        // The tenants' limits beside their usage (none if unreadable).
                        let limits = match app
                            .bounded("the tenant limits", app.store.tenant_limits(&name))
                            .await
                        {
                            Ok(Ok(limits)) => limits,
                            _ => Default::default(),
                        };
                        snap.semaphores.push(StatusBody::from_status(s, &limits))
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => snap.errors.push(format!("{name}: {e}")),
                    Err(e) => snap.errors.push(format!("{name}: {}", e.message)),
                }
            }
        }
        Ok(Err(e)) => snap.errors.push(format!("semaphores: {e}")),
        Err(e) => snap.errors.push(format!("semaphores: {}", e.message)),
    }
    // A store without rate limits has nothing to show there.
    if let Ok(Ok(mut names)) = app.bounded("the list", app.store.rate_list()).await {
        names.retain(|n| principal.covers(n));
        names.sort();
        for name in names.into_iter().take(MAX_SHOWN) {
            match app
                .bounded("the status", app.store.rate_status(&name))
                .await
            {
                Ok(Ok(Some(s))) => snap.rates.push(RateStatusBody::from_status(s)),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => snap.errors.push(format!("{name}: {e}")),
                Err(e) => snap.errors.push(format!("{name}: {}", e.message)),
            }
        }
    }
    snap
}

async fn snapshot_json(State(app): State<Arc<App>>, principal: Principal) -> Json<Snapshot> {
    Json(snapshot(&app, &principal).await)
}

async fn events(
    State(app): State<Arc<App>>,
    principal: Principal,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = futures::stream::unfold(
        (app, principal, true),
        |(app, principal, first)| async move {
            if !first {
                tokio::select! {
                    _ = tokio::time::sleep(EVERY) => {}
                    _ = app.shutdown.cancelled() => return None,
                }
            }
            let snap = snapshot(&app, &principal).await;
            let event = Event::default()
                .event("snapshot")
                .json_data(&snap)
                .unwrap_or_else(|_| Event::default().event("snapshot").data("{}"));
            Some((Ok(event), (app, principal, false)))
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

async fn page(State(app): State<Arc<App>>, principal: Principal) -> Html<String> {
    let snap = snapshot(&app, &principal).await;
    let mut body = String::new();
    render(&snap, &mut body);
    Html(
        PAGE.replace("{{store}}", &escape(app.store.url()))
            .replace("{{body}}", &body),
    )
}

/// HTML-escapes text.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn ms(ms: u64) -> String {
    if ms >= 1000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{ms} ms")
    }
}

/// A tenant's limits: its ceiling, floor and window ceiling where set, or "none".
fn limits_label(t: &super::semaphores::TenantBody) -> String {
    let mut parts = Vec::new();
    if let Some(c) = t.ceiling {
        parts.push(format!("at most {c} permits"));
    }
    if t.floor > 0 {
        parts.push(format!("{} kept", t.floor));
    }
    if let Some(p) = t.window_ceiling {
        parts.push(format!("{p}% of each window"));
    }
    match parts.is_empty() {
        true => "none".to_string(),
        false => parts.join(", "),
    }
}

/// A tenant's cell: its name, or "none" for requests that named none.
fn tenant_label(tenant: &str) -> String {
    match tenant {
        "" => "<em>none</em>".to_string(),
        t => escape(t),
    }
}

/// The server-side rendering; `dashboard.js` in [`PAGE`] mirrors it.
fn render(snap: &Snapshot, out: &mut String) {
    for e in &snap.errors {
        let _ = write!(out, "<p class=\"error\">{}</p>", escape(e));
    }
    out.push_str("<h2>Semaphores</h2>");
    if snap.semaphores.is_empty() {
        out.push_str("<p class=\"empty\">No semaphore has holders or waiters.</p>");
    }
    for s in &snap.semaphores {
        let _ = write!(
            out,
            "<section class=\"sem\"><h3>{} <small>{} of {} permits used, {} waiting</small></h3>",
            escape(&s.name),
            s.used,
            s.capacity,
            s.queue.len()
        );
        out.push_str("<table><thead><tr><th>lease</th><th>holder</th><th>seats</th><th>fence</th><th>time left</th></tr></thead><tbody>");
        for h in &s.holders {
            let seats: Vec<String> = h.seats.iter().map(u32::to_string).collect();
            let _ = write!(
                out,
                "<tr class=\"holder\"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&h.lease_id),
                escape(&h.holder),
                seats.join(", "),
                h.fence,
                ms(h.expires_in_ms)
            );
        }
        out.push_str("</tbody></table>");
        if !s.queue.is_empty() {
            out.push_str("<h4>Queue</h4><table><thead><tr><th>#</th><th>lease</th><th>holder</th><th>weight</th></tr></thead><tbody>");
            for (i, w) in s.queue.iter().enumerate() {
                let _ = write!(
                    out,
                    "<tr class=\"waiter\"><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                    i + 1,
                    escape(&w.lease_id),
                    escape(&w.holder),
                    w.weight
                );
            }
            out.push_str("</tbody></table>");
        }
        // Per tenant, once a request named one.
        if s.tenants.iter().any(|t| !t.tenant.is_empty()) {
            out.push_str("<h4>Tenants</h4><table><thead><tr><th>tenant</th><th>holders</th><th>permits held</th><th>waiters</th><th>permits asked</th><th>limits</th></tr></thead><tbody>");
            for t in &s.tenants {
                let _ = write!(
                    out,
                    "<tr class=\"tenant\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    tenant_label(&t.tenant),
                    t.holders,
                    t.used,
                    t.waiters,
                    t.waiting,
                    limits_label(t)
                );
            }
            out.push_str("</tbody></table>");
        }
        out.push_str("</section>");
    }
    out.push_str("<h2>Rate limiters</h2>");
    if snap.rates.is_empty() {
        out.push_str("<p class=\"empty\">No rate limiter has state.</p>");
    }
    for r in &snap.rates {
        let _ = write!(
            out,
            "<section class=\"rate\"><h3>{} <small>{}, next free in {}</small></h3>",
            escape(&r.name),
            escape(&r.mode),
            ms(r.next_free_in_ms)
        );
        out.push_str("<table><thead><tr><th>limit</th><th>used in window</th><th>reserved</th><th>next free in</th></tr></thead><tbody>");
        for l in &r.limits {
            let _ = write!(
                out,
                "<tr class=\"limit\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&l.limit),
                l.used,
                l.reserved,
                ms(l.next_free_in_ms)
            );
        }
        out.push_str("</tbody></table></section>");
    }
}

const PAGE: &str = r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tessera</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
  h1 { font-size: 1.4em; margin: 0 0 .2em; }
  h1 small, h3 small { font-weight: normal; color: #666; font-size: .8em; }
  h2 { font-size: 1.15em; border-bottom: 1px solid #ccc; margin-top: 1.5em; }
  h3 { font-size: 1em; margin: 1em 0 .3em; }
  h4 { font-size: .9em; margin: .6em 0 .2em; color: #555; }
  table { border-collapse: collapse; margin-bottom: .5em; }
  th, td { text-align: left; padding: .2em .8em .2em 0; border-bottom: 1px solid #eee; }
  th { color: #555; font-weight: 600; }
  code { font-size: .9em; }
  .error { color: #a00; }
  .empty { color: #888; }
  #live { font-size: .8em; color: #888; }
  #live.on { color: #070; }
</style>
</head>
<body>
<h1>tessera <small>{{store}}</small> <span id="live">static</span></h1>
<main id="main">{{body}}</main>
<script>
(function () {
  "use strict";
  var main = document.getElementById("main"), live = document.getElementById("live");
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c];
    });
  }
  function ms(v) { return v >= 1000 ? (v / 1000).toFixed(1) + " s" : v + " ms"; }
  function render(snap) {
    var h = "";
    snap.errors.forEach(function (e) { h += '<p class="error">' + esc(e) + "</p>"; });
    h += "<h2>Semaphores</h2>";
    if (!snap.semaphores.length) h += '<p class="empty">No semaphore has holders or waiters.</p>';
    snap.semaphores.forEach(function (s) {
      h += '<section class="sem"><h3>' + esc(s.name) + " <small>" + s.used + " of " + s.capacity +
        " permits used, " + s.queue.length + " waiting</small></h3>";
      h += "<table><thead><tr><th>lease</th><th>holder</th><th>seats</th><th>fence</th><th>time left</th></tr></thead><tbody>";
      s.holders.forEach(function (l) {
        h += '<tr class="holder"><td><code>' + esc(l.lease_id) + "</code></td><td>" + esc(l.holder) +
          "</td><td>" + l.seats.join(", ") + "</td><td>" + l.fence + "</td><td>" + ms(l.expires_in_ms) + "</td></tr>";
      });
      h += "</tbody></table>";
      if (s.queue.length) {
        h += "<h4>Queue</h4><table><thead><tr><th>#</th><th>lease</th><th>holder</th><th>weight</th></tr></thead><tbody>";
        s.queue.forEach(function (w, i) {
          h += '<tr class="waiter"><td>' + (i + 1) + "</td><td><code>" + esc(w.lease_id) + "</code></td><td>" +
            esc(w.holder) + "</td><td>" + w.weight + "</td></tr>";
        });
        h += "</tbody></table>";
      }
      if (s.tenants.some(function (t) { return t.tenant !== ""; })) {
        h += "<h4>Tenants</h4><table><thead><tr><th>tenant</th><th>holders</th><th>permits held</th><th>waiters</th><th>permits asked</th><th>limits</th></tr></thead><tbody>";
        s.tenants.forEach(function (t) {
          var limits = [];
          if (t.ceiling != null) limits.push("at most " + t.ceiling + " permits");
          if (t.floor) limits.push(t.floor + " kept");
          if (t.window_ceiling != null) limits.push(t.window_ceiling + "% of each window");
          h += '<tr class="tenant"><td>' + (t.tenant === "" ? "<em>none</em>" : esc(t.tenant)) + "</td><td>" + t.holders +
            "</td><td>" + t.used + "</td><td>" + t.waiters + "</td><td>" + t.waiting + "</td><td>" +
            (limits.length ? limits.join(", ") : "none") + "</td></tr>";
        });
        h += "</tbody></table>";
      }
      h += "</section>";
    });
    h += "<h2>Rate limiters</h2>";
    if (!snap.rates.length) h += '<p class="empty">No rate limiter has state.</p>';
    snap.rates.forEach(function (r) {
      h += '<section class="rate"><h3>' + esc(r.name) + " <small>" + esc(r.mode) + ", next free in " +
        ms(r.next_free_in_ms) + "</small></h3>";
      h += "<table><thead><tr><th>limit</th><th>used in window</th><th>reserved</th><th>next free in</th></tr></thead><tbody>";
      r.limits.forEach(function (l) {
        h += '<tr class="limit"><td>' + esc(l.limit) + "</td><td>" + l.used + "</td><td>" + l.reserved +
          "</td><td>" + ms(l.next_free_in_ms) + "</td></tr>";
      });
      h += "</tbody></table></section>";
    });
    main.innerHTML = h;
  }
  if (!window.EventSource) return;
  var token = new URLSearchParams(location.search).get("access_token");
  var url = "/v1/dashboard/events" + (token ? "?access_token=" + encodeURIComponent(token) : "");
  var es = new EventSource(url);
  es.addEventListener("snapshot", function (e) {
    render(JSON.parse(e.data));
    live.textContent = "live";
    live.className = "on";
  });
  es.onerror = function () { live.textContent = "reconnecting"; live.className = ""; };
})();
</script>
</body>
</html>
"##;
